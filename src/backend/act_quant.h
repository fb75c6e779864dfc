// Activation quantization of the reference kernels (spec §4.3 act_quant, §4.4 fp4_act_quant) and bf16 rounding.
// All functions are exact (bitwise) re-implementations of the reference formulas; scales are powers of two.
// Rows are independent; partial last blocks (n not a multiple of the block) are quantized over the elements present.
#pragma once
#include <cstdint>

namespace dsv4 {

// FP8 e4m3 block scale of spec §4.3 for a block with max |x| = amax:
//   t = max(amax, 1e-4) * fp32(1/448);  s = 2^(exponent(t) + (mantissa(t) != 0))   (= 2^ceil(log2 t))
float fp8_act_scale(float amax);
// FP4 e2m1 block scale of spec §4.4: t = max(amax, 6*2^-126) * fp32(1/6); s = 2^ceil(log2 t) (same bit trick).
float fp4_act_scale(float amax);

// act_quant(x, block) without the in-place write-back: for each block of `block` elements of x[0..n)
//   q[i] = float(e4m3_rne_satfinite(clamp(x[i] / s, -448, 448)))   (exact e4m3 values as fp32)
//   s_out[b] = s                                                     (power of two; n_blocks = ceil(n / block))
// q may alias x.
void act_quant_fp8(const float* x, int64_t n, int64_t block, float* q, float* s_out);

// In-place "QAT simulation" (spec §4.3, inplace=True, current revision): x[i] <- bf16(float(q[i]) * s), per block.
// Used with block 128 (GEMM inputs) and 64 (window/compressed KV nope dims, §5.4).
void act_quant_fp8_inplace(float* x, int64_t n, int64_t block);

// In-place FP4 simulation (spec §4.4, blocks of 32): x[i] <- bf16(e2m1_rne(clamp(x[i]/s, -6, 6)) * s).
void fp4_act_quant_inplace(float* x, int64_t n);

// x[i] <- bf16(x[i]) (round to nearest even; NaN stays NaN).
void round_bf16_inplace(float* x, int64_t n);

}  // namespace dsv4
