// The e8m0 scale format of microscaling (OCP MX): storage and its exact conversion to float32. Included by
// kernels that load or convert float8_e8m0fnu values (emitter.require_header("e8m0")).
#pragma once
#include "tilejit/prelude.cuh"
struct tj_fp8e8m0 { unsigned char bits; };   // e8m0: 2^(bits - 127), no sign, no zero, 0xff = NaN
/// e8m0 -> f32 (exact): the bits are float32's exponent field; 0 is 2^-127, float32's subnormal 0x00400000.
TJ_DEVICE float tj_to_f32(tj_fp8e8m0 x) {
  unsigned e = x.bits;
  if (e == 0xffu) return __uint_as_float(0x7fffffffu);
  return __uint_as_float(e == 0u ? 0x00400000u : e << 23);
}
