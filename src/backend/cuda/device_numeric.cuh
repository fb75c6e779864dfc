// Device versions of the exact number-format helpers (format/numeric.h, backend/act_quant.cpp): bf16 RNE, e4m3 /
// e2m1 / e8m0 decoding, the reference's power-of-two activation scales and e4m3 / e2m1 rounding. Every function is
// bit-for-bit the CPU one (same bit tricks, no fast-math); kernels must be compiled without --use_fast_math.
#pragma once
#include <cstdint>

namespace dsv4::cuda {

__device__ __forceinline__ float bits_f(uint32_t b) { return __uint_as_float(b); }
__device__ __forceinline__ uint32_t f_bits(float f) { return __float_as_uint(f); }

// float -> bf16 -> float, round to nearest even; NaN stays a quiet NaN (format/numeric.h float_to_bf16_rne).
__device__ __forceinline__ float round_bf16(float f) {
  uint32_t b = f_bits(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return bits_f(((b >> 16) | 0x0040u) << 16);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return bits_f(b & 0xFFFF0000u);
}
__device__ __forceinline__ float maybe_bf16(float f, bool bf) { return bf ? round_bf16(f) : f; }
__device__ __forceinline__ float bf16_bits_to_float(uint16_t h) { return bits_f(uint32_t(h) << 16); }

// OCP E4M3FN code -> float (exact; 0x7F / 0xFF decode to NaN).
__device__ __forceinline__ float e4m3_to_float(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80) << 24;
  const uint32_t e = (b >> 3) & 0xF, m = b & 0x7;
  if (e == 0xF && m == 0x7) return bits_f(sign | 0x7FC00000u);
  if (e == 0) {
    const float v = float(m) * 0.001953125f;  // m * 2^-9
    return sign ? -v : v;
  }
  return bits_f(sign | ((e + 120) << 23) | (m << 20));
}
// E2M1 nibble (low 4 bits) -> float, by its bits (a table indexed at run time lives in local memory: the BF16
// dequantization of the prefill experts ran at ~250 GB/s on it). Code c = n & 7 >= 2 is 2^(e-1) (1 + m/2) with
// e = c >> 1, m = c & 1: exponent field 126 + e, mantissa bit 22 = m; c = 1 is 0.5, c = 0 zero; bit 3 the sign.
__device__ __forceinline__ float e2m1_to_float(uint32_t n) {
  const uint32_t c = n & 7u;
  const uint32_t mag = c >= 2u ? ((126u + (c >> 1)) << 23) | ((c & 1u) << 22) : (c == 1u ? 0x3F000000u : 0u);
  return bits_f(mag | ((n & 8u) << 28));
}
// E8M0 scale byte -> 2^(e-127); e = 0 -> 2^-127 (binary32 subnormal), e = 255 -> NaN.
__device__ __forceinline__ float e8m0_to_float(uint8_t e) {
  if (e == 0) return bits_f(0x00400000u);
  if (e == 0xFF) return bits_f(0x7FC00000u);
  return bits_f(uint32_t(e) << 23);
}

// 2^ceil(log2 t) for finite t > 0 by the reference's bit trick: exponent field + (mantissa != 0).
__device__ __forceinline__ float pow2_ceil(float t) {
  const uint32_t b = f_bits(t);
  const int e = int((b >> 23) & 0xFFu) - 127 + ((b & 0x7FFFFFu) != 0 ? 1 : 0);
  if (e > 127) return bits_f(0x7F800000u);
  if (e >= -126) return bits_f(uint32_t(e + 127) << 23);
  return ldexpf(1.0f, e);
}
// Activation scales (spec §4.3 / §4.4) from a block's max |x|.
__device__ __forceinline__ float fp8_act_scale(float amax) {
  return pow2_ceil(fmaxf(amax, 1e-4f) * (1.0f / 448.0f));
}
__device__ __forceinline__ float fp4_act_scale(float amax) {
  return pow2_ceil(fmaxf(amax, 6.0f * 1.1754943508222875e-38f /*2^-126*/) * (1.0f / 6.0f));
}

// v (|v| <= 448) rounded to the nearest e4m3 value, ties to even, as fp32 (backend/act_quant.cpp e4m3_round).
// The adds must not be contracted or reassociated: __fadd_rn keeps them exact as written.
__device__ __forceinline__ float e4m3_round(float v) {
  const uint32_t vb = f_bits(v), sign = vb & 0x80000000u, ab = vb & 0x7FFFFFFFu;
  const float a = bits_f(ab);
  const uint32_t sub = f_bits(__fsub_rn(__fadd_rn(a, 16384.0f), 16384.0f));
  const uint32_t nor = (ab + 0x7FFFFu + ((ab >> 20) & 1u)) & ~0xFFFFFu;
  return bits_f(sign | (ab < 0x3C800000u ? sub : nor));
}
// v (|v| <= 6) rounded to the nearest e2m1 value (ties to the even code), as fp32.
__device__ __forceinline__ float e2m1_round(float v) {
  const uint32_t vb = f_bits(v), sign = vb & 0x80000000u, ab = vb & 0x7FFFFFFFu;
  const float a = bits_f(ab);
  const uint32_t sub = f_bits(__fsub_rn(__fadd_rn(a, 4194304.0f), 4194304.0f));
  const uint32_t nor = (ab + 0x1FFFFFu + ((ab >> 22) & 1u)) & ~0x3FFFFFu;
  return bits_f(sign | (ab < 0x3F800000u ? sub : nor));
}
__device__ __forceinline__ float clampf(float v, float lo, float hi) { return fminf(fmaxf(v, lo), hi); }

// One element of act_quant (FP8, scale s, inv = 1/s): the e4m3 code value as fp32 (exact).
__device__ __forceinline__ float fp8_quant(float x, float inv) { return e4m3_round(clampf(__fmul_rn(x, inv), -448.0f, 448.0f)); }
// In-place simulations: bf16(code * s).
__device__ __forceinline__ float fp8_sim_value(float x, float s, float inv) { return round_bf16(__fmul_rn(fp8_quant(x, inv), s)); }
__device__ __forceinline__ float fp4_sim_value(float x, float s, float inv) {
  return round_bf16(__fmul_rn(e2m1_round(clampf(__fmul_rn(x, inv), -6.0f, 6.0f)), s));
}

// Decoded weight element (r, k) of a view: exact value (dequant) or the raw code value (quantized product).
// fmt: 0 bf16, 1 f32, 2 fp8, 3 fp4 (GemmFormat order).
__device__ __forceinline__ float weight_code(int fmt, const uint8_t* w, int64_t row_bytes, int64_t r, int64_t k) {
  const uint8_t* row = w + r * row_bytes;
  switch (fmt) {
    case 0: return bf16_bits_to_float(uint16_t(row[2 * k]) | uint16_t(uint16_t(row[2 * k + 1]) << 8));
    case 1: {
      uint32_t b = uint32_t(row[4 * k]) | (uint32_t(row[4 * k + 1]) << 8) | (uint32_t(row[4 * k + 2]) << 16) |
                   (uint32_t(row[4 * k + 3]) << 24);
      return bits_f(b);
    }
    case 2: return e4m3_to_float(row[k]);
    default: {
      const uint8_t byte = row[k >> 1];
      return e2m1_to_float((k & 1) ? (byte >> 4) : (byte & 0xF));
    }
  }
}

// ---- row reductions of the norms (k_elementwise.cu rmsnorm, k_hc.cu's fused hc_pre + rmsnorm) ---------------------
// Sum of v over the TPR threads of one row: xor butterfly within the warp (every lane ends with the same bits), then
// for TPR > 32 the warp sums combined in warp order by every thread. TPR is 32 (a warp per row) or blockDim.x (one
// row per block); smem holds blockDim.x / 32 doubles.
template <int TPR>
__device__ __forceinline__ double row_sum(double v, double* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  if constexpr (TPR == 32) {
    return v;
  } else {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    double s = 0;
    for (int w = 0; w < TPR / 32; ++w) s += smem[w];
    __syncthreads();  // smem may be reused by the caller
    return s;
  }
}

// rmsnorm's scale of a row of `dim` elements from its sum of squares (CpuOps: 1 / sqrt(float(ss) / dim + eps)).
__device__ __forceinline__ float rms_scale(double ss, int64_t dim, float eps) {
  const float var = __fdiv_rn(__double2float_rn(ss), float(dim));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
}

}  // namespace dsv4::cuda
