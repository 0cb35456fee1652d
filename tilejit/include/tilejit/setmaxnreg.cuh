// Register reallocation (setmaxnreg) between the producer warpgroup and the math warps of a warp-specialized kernel.
#pragma once
#include "tilejit/prelude.cuh"
/// Give back or take registers, per thread of the warpgroup (PTX 9.7.17.1, setmaxnreg; sm_90a).
template <int N> TJ_DEVICE void tj_setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N)); }
template <int N> TJ_DEVICE void tj_setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N)); }
