// Exact activation quantization (spec §4.3, §4.4). Rounding is done on fp32 values with bit arithmetic / magic-number
// additions (round to nearest even in the default FP environment); tests check it against format/numeric.h encoders.
#include "backend/act_quant.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "format/numeric.h"

namespace dsv4 {
namespace {

// 2^ceil(log2 t) for t > 0 finite, by the reference's bit trick: exponent field + (mantissa != 0).
inline float pow2_ceil(float t) {
  const uint32_t b = float_to_bits(t);
  int e = static_cast<int>((b >> 23) & 0xFFu) - 127 + ((b & 0x7FFFFFu) != 0 ? 1 : 0);
  if (e > 127) return bits_to_float(0x7F800000u);  // inf (only for inf/huge amax)
  if (e >= -126) return bits_to_float(static_cast<uint32_t>(e + 127) << 23);
  return std::ldexp(1.0f, e);
}

// Branch-free helpers on bit patterns (so that the `omp simd` loops vectorize). Exact in ISO C++ (no -ffast-math,
// no reassociation); tests compare them with format/numeric.h's encoders.
inline uint32_t fbits(float f) { return std::bit_cast<uint32_t>(f); }
inline float bfloat(uint32_t b) { return std::bit_cast<float>(b); }

inline uint32_t select_bits(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (a & m) | (b & ~m);
}

// v (|v| <= 448) rounded to the nearest e4m3 value, ties to even, as fp32. Subnormal grid 2^-9 below 2^-6: magic
// add at 2^14 (ulp 2^-9); above: RNE of the fp32 mantissa to 3 bits.
inline float e4m3_round(float v) {
  const uint32_t vb = fbits(v), sign = vb & 0x80000000u, ab = vb & 0x7FFFFFFFu;
  const float a = bfloat(ab);
  const uint32_t sub = fbits((a + 16384.0f) - 16384.0f);
  const uint32_t nor = (ab + 0x7FFFFu + ((ab >> 20) & 1u)) & ~0xFFFFFu;
  return bfloat(sign | select_bits(ab < 0x3C800000u /*2^-6*/, sub, nor));
}

// v (|v| <= 6) rounded to the nearest e2m1 value (ties to the even code), as fp32; grid 0.5 below 1.
inline float e2m1_round(float v) {
  const uint32_t vb = fbits(v), sign = vb & 0x80000000u, ab = vb & 0x7FFFFFFFu;
  const float a = bfloat(ab);
  const uint32_t sub = fbits((a + 4194304.0f) - 4194304.0f);
  const uint32_t nor = (ab + 0x1FFFFFu + ((ab >> 22) & 1u)) & ~0x3FFFFFu;
  return bfloat(sign | select_bits(ab < 0x3F800000u /*1.0*/, sub, nor));
}

// bf16 RNE of a finite value (activations here are finite: clamped codes times power-of-two scales).
inline float bf16_finite(float v) {
  const uint32_t b = fbits(v);
  return bfloat((b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u);
}

// fmin(fmax(v, lo), hi) for finite lo < hi, bitwise (NaN -> lo, +-inf -> the bound), without the libm calls that
// kept the quantization loops scalar.
inline float clampf(float v, float lo, float hi) {
  const float u = v > lo ? v : lo;
  return u < hi ? u : hi;
}

inline float block_amax(const float* x, int64_t n) {
  float m = 0.0f;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    m = a > m ? a : m;
  }
  return m;
}

}  // namespace

// The quantization loops are compiled twice (AVX2 and the baseline ISA, chosen at load time): the same operations
// per element (compares, bit arithmetic, separate multiplies and adds: no FMA), only wider vectors.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DSV4_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DSV4_CLONES
#endif

float fp8_act_scale(float amax) {
  constexpr float kInv448 = 1.0f / 448.0f;
  return pow2_ceil(std::fmax(amax, 1e-4f) * kInv448);
}

float fp4_act_scale(float amax) {
  constexpr float kInv6 = 1.0f / 6.0f;
  return pow2_ceil(std::fmax(amax, 6.0f * 0x1p-126f) * kInv6);
}

namespace {

// 8 elements at a time (GCC vector extension; GCC did not vectorize the scalar element loops): each lane does the
// scalar helpers' operations above (e4m3_round, e2m1_round, clampf, bf16_finite) in the same order, so the results
// are bitwise those of the scalar tail loops.
#pragma GCC diagnostic ignored "-Wpsabi"
// (always inlined into their callers' ISA: no vector values are passed by the baseline ABI)
#define DSV4_VEC inline __attribute__((always_inline))
typedef float v8f __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
DSV4_VEC v8f splat(float f) { return v8f{f, f, f, f, f, f, f, f}; }
DSV4_VEC v8u splat_u(uint32_t u) { return v8u{u, u, u, u, u, u, u, u}; }
DSV4_VEC v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
DSV4_VEC void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }
DSV4_VEC v8u vbits(v8f f) { return std::bit_cast<v8u>(f); }
DSV4_VEC v8f vfloat(v8u u) { return std::bit_cast<v8f>(u); }

DSV4_VEC v8f clamp8(v8f v, float lo, float hi) {
  const v8f l = splat(lo), h = splat(hi);
  const v8f u = v > l ? v : l;
  return u < h ? u : h;
}
DSV4_VEC v8f e4m3_round8(v8f v) {
  const v8u vb = vbits(v), sign = vb & 0x80000000u, ab = vb & 0x7FFFFFFFu;
  const v8f a = vfloat(ab);
  const v8u sub = vbits((a + 16384.0f) - 16384.0f);
  const v8u nor = (ab + 0x7FFFFu + ((ab >> 20) & 1u)) & ~0xFFFFFu;
  return vfloat(sign | (ab < splat_u(0x3C800000u) ? sub : nor));
}
DSV4_VEC v8f e2m1_round8(v8f v) {
  const v8u vb = vbits(v), sign = vb & 0x80000000u, ab = vb & 0x7FFFFFFFu;
  const v8f a = vfloat(ab);
  const v8u sub = vbits((a + 4194304.0f) - 4194304.0f);
  const v8u nor = (ab + 0x1FFFFFu + ((ab >> 22) & 1u)) & ~0x3FFFFFu;
  return vfloat(sign | (ab < splat_u(0x3F800000u) ? sub : nor));
}
DSV4_VEC v8f bf16_finite8(v8f v) {
  const v8u b = vbits(v);
  return vfloat((b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u);
}

}  // namespace

// x / s == x * (1/s) exactly: s is a power of two whose inverse is a normal float (2^-126 <= s <= 2^126 here).
DSV4_CLONES void act_quant_fp8(const float* x, int64_t n, int64_t block, float* q, float* s_out) {
  for (int64_t b0 = 0, bi = 0; b0 < n; b0 += block, ++bi) {
    const int64_t len = n - b0 < block ? n - b0 : block;
    const float s = fp8_act_scale(block_amax(x + b0, len)), inv = 1.0f / s;
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) store8(q + b0 + i, e4m3_round8(clamp8(load8(x + b0 + i) * inv, -448.0f, 448.0f)));
    for (; i < len; ++i) q[b0 + i] = e4m3_round(clampf(x[b0 + i] * inv, -448.0f, 448.0f));
    s_out[bi] = s;
  }
}

DSV4_CLONES void act_quant_fp8_inplace(float* x, int64_t n, int64_t block) {
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t len = n - b0 < block ? n - b0 : block;
    const float s = fp8_act_scale(block_amax(x + b0, len)), inv = 1.0f / s;
    int64_t i = 0;
    for (; i + 8 <= len; i += 8)
      store8(x + b0 + i, bf16_finite8(e4m3_round8(clamp8(load8(x + b0 + i) * inv, -448.0f, 448.0f)) * s));
    for (; i < len; ++i) x[b0 + i] = bf16_finite(e4m3_round(clampf(x[b0 + i] * inv, -448.0f, 448.0f)) * s);
  }
}

DSV4_CLONES void fp4_act_quant_inplace(float* x, int64_t n) {
  constexpr int64_t block = 32;
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t len = n - b0 < block ? n - b0 : block;
    const float s = fp4_act_scale(block_amax(x + b0, len)), inv = 1.0f / s;
    int64_t i = 0;
    for (; i + 8 <= len; i += 8)
      store8(x + b0 + i, bf16_finite8(e2m1_round8(clamp8(load8(x + b0 + i) * inv, -6.0f, 6.0f)) * s));
    for (; i < len; ++i) x[b0 + i] = bf16_finite(e2m1_round(clampf(x[b0 + i] * inv, -6.0f, 6.0f)) * s);
  }
}

void round_bf16_inplace(float* x, int64_t n) {

  for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

}  // namespace dsv4
