// Exact scalar decoders/encoders of the checkpoint and simulation number formats (spec §3.6, §4.3, §4.4).
// Decoders are exact (every code maps to the float it denotes); encoders round to nearest, ties to even.
// All are pure functions, usable from any thread; the *_lut() tables are built once and never change.
#pragma once
#include <cstdint>
#include <cstring>

#include "format/dtype.h"

namespace dsv4 {

inline float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// ---- decoders -------------------------------------------------------------------------------------------------

// bfloat16 -> float: the upper 16 bits of an IEEE binary32 (exact, NaN payloads kept).
inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// IEEE binary16 -> float (exact: subnormals, +-inf, NaN with payload).
float f16_to_float(uint16_t h);

// OCP float8 E4M3FN -> float. Sign bit 7, exponent bits 6..3 (bias 7), mantissa bits 2..0.
// exp 0: subnormal m * 2^-9; 0x7F / 0xFF: NaN (there are no infinities); max finite +-448 (0x7E / 0xFE).
float e4m3fn_to_float(uint8_t b);

// float8_e8m0fnu (E8M0 scale) -> float: 2^(e-127) built bitwise; e = 0 gives 2^-127 (the binary32 subnormal
// 0x00400000, as [DS4] e8m0_to_f32); e = 255 is NaN. Never decode through a numeric cast (spec §3.6).
inline float e8m0_to_float(uint8_t e) {
  if (e == 0) return bits_to_float(0x00400000u);
  if (e == 0xFF) return bits_to_float(0x7FC00000u);
  return bits_to_float(static_cast<uint32_t>(e) << 23);
}

// E2M1 (FP4) nibble -> float; only the low 4 bits of `nibble` are used. Bit 3 = sign,
// magnitude = {0, 0.5, 1, 1.5, 2, 3, 4, 6}[nibble & 7]  (REF-convert FP4_TABLE). Code 8 is -0.0.
float e2m1_to_float(uint8_t nibble);

// 256-entry tables (index = byte): e4m3fn_lut()[b] == e4m3fn_to_float(b); e2m1_pair_lut()[b] = {lo nibble, hi nibble}
// decoded (the packed FP4 expert layout: element 2j = low nibble, element 2j+1 = high nibble).
const float* e4m3fn_lut();
const float (*e2m1_pair_lut())[2];
// e2m1_lut()[n] for n in 0..15.
const float* e2m1_lut();

// ---- encoders -------------------------------------------------------------------------------------------------

// float -> bfloat16, round to nearest even. NaN -> quiet NaN with the same sign (0x7FC0 / 0xFFC0);
// finite values beyond the bf16 range round to +-inf (as torch's .to(bfloat16)).
inline uint16_t float_to_bf16_rne(float f) {
  uint32_t b = float_to_bits(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}
// Convenience: the float value of bf16(f).
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16_rne(f)); }

// float -> E4M3FN code, round to nearest even, saturating finite overflow (and +-inf) to +-448 ("satfinite", the
// CUDA __NV_SATFINITE / TileLang cast of clamped values). NaN -> 0x7F (0xFF if the sign bit is set).
// Subnormal outputs (|x| < 2^-6) are rounded on the 2^-9 grid. -0.0 -> 0x80.
uint8_t float_to_e4m3fn_rne_satfinite(float f);

// float -> E2M1 nibble (0..15), round to nearest with ties to the even code (spec §4.4; e.g. 0.25 -> 0, 0.75 -> 1.0,
// 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), saturating |x| > 6 (and inf) to +-6; the sign bit is kept
// (so -0.1 -> 0x8 = -0.0). NaN -> 0 (E2M1 has no NaN; callers clamp before encoding).
uint8_t float_to_e2m1_rne(float f);

}  // namespace dsv4
