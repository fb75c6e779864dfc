#include "format/numeric.h"

#include <array>
#include <cmath>

namespace dsv4 {

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return bits_to_float(sign | 0x7F800000u | (man << 13));  // inf / NaN (payload kept)
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
  // zero or subnormal: man * 2^-24 (exact in binary32)
  const float v = std::ldexp(static_cast<float>(man), -24);
  return sign ? -v : v;
}

float e4m3fn_to_float(uint8_t b) {
  const bool neg = b & 0x80u;
  const uint32_t exp = (b >> 3) & 0xFu;
  const uint32_t man = b & 0x7u;
  float v;
  if (exp == 0xF && man == 0x7) {
    v = bits_to_float(0x7FC00000u);
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -9);
  } else {
    v = bits_to_float(((exp + 120u) << 23) | (man << 20));  // rebias 7 -> 127
  }
  return neg ? -v : v;
}

float e2m1_to_float(uint8_t nibble) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kMag[nibble & 7u];
  return (nibble & 8u) ? -v : v;
}

const float* e4m3fn_lut() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[i] = e4m3fn_to_float(static_cast<uint8_t>(i));
    return a;
  }();
  return t.data();
}

const float* e2m1_lut() {
  static const std::array<float, 16> t = [] {
    std::array<float, 16> a{};
    for (int i = 0; i < 16; ++i) a[i] = e2m1_to_float(static_cast<uint8_t>(i));
    return a;
  }();
  return t.data();
}

const float (*e2m1_pair_lut())[2] {
  static const auto* t = [] {
    static float a[256][2];
    for (int i = 0; i < 256; ++i) {
      a[i][0] = e2m1_to_float(static_cast<uint8_t>(i & 0xF));
      a[i][1] = e2m1_to_float(static_cast<uint8_t>(i >> 4));
    }
    return a;
  }();
  return t;
}

uint8_t float_to_e4m3fn_rne_satfinite(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80u : 0x00u;
  if (std::isnan(f)) return sign | 0x7Fu;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7Eu;  // satfinite (inf included)
  // Quantum of the binade holding `a` (subnormals share the 2^-9 grid of binade 2^-6).
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)  =>  floor(log2 a) = e - 1
  int q_exp = (e - 1) - 3;
  if (q_exp < -9) q_exp = -9;
  // a / 2^q_exp is exact (power-of-two scaling within range); rint = ties to even in the default FP environment.
  const float q = std::nearbyint(std::ldexp(a, -q_exp));
  const float r = std::ldexp(q, q_exp);  // rounded magnitude (may have moved up a binade)
  if (r >= 448.0f) return sign | 0x7Eu;  // e.g. 464 ties to 448 (480 would be the NaN code)
  if (r < 0.015625f) return sign | static_cast<uint8_t>(static_cast<int>(std::ldexp(r, 9)));  // subnormal: m * 2^-9
  int re;
  const float m = std::frexp(r, &re);  // r = m * 2^re, m in [0.5,1): exponent field = re - 1 + 7
  const int man = static_cast<int>(std::ldexp(m, 4)) - 8;  // 3 mantissa bits
  return sign | static_cast<uint8_t>(((re + 6) << 3) | man);
}

uint8_t float_to_e2m1_rne(float f) {
  if (std::isnan(f)) return 0;
  const uint8_t sign = std::signbit(f) ? 0x8u : 0x0u;
  const float a = std::fabs(f);
  // Decision boundaries between consecutive codes; at an exact midpoint the even code wins.
  static constexpr float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint8_t code = 0;
  while (code < 7 && (a > kMid[code] || (a == kMid[code] && (code & 1u) == 1u))) ++code;
  // At a == kMid[code] the candidates are code (lower) and code+1; advance only if code+1 is even, i.e. code odd.
  return sign | code;
}

}  // namespace dsv4
