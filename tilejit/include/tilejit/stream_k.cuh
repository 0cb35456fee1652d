// The stream-K schedule: where each program's run of the last wave's K iterations starts (lower_specialized).
#pragma once
#include "tilejit/prelude.cuh"
/// Where stream-K program p's run starts among the last wave's `total` iterations: `programs` runs as equal as
/// integers allow, program p + 1's start being p's end (lower_loops._stream_k_schedule, the fix-up's readers).
TJ_DEVICE int tj_sk_run_start(long long p, int total, int programs) { return (int)(p * total / programs); }
