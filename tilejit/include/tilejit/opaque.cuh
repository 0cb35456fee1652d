// tj_opaque: a value hoisted to the kernel's start (Emitter.hoist) kept in its register.
#pragma once
#include "tilejit/prelude.cuh"
/// x, through a move the compiler cannot see into: a value set up once stays in its register instead of
/// being recomputed where it is used (inside a main loop).
TJ_DEVICE unsigned tj_opaque(unsigned x) { asm("mov.b32 %0, %0;" : "+r"(x)); return x; }
