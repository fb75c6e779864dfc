// One rotated pair of the interleaved (GPT-J) RoPE (spec §4.7), the arithmetic CpuOps::rope uses: shared by the
// rope kernels of k_elementwise.cu and the fused ones of k_fused.cu.
#pragma once
#include "backend/cuda/device_numeric.cuh"

namespace dsv4::cuda {

// (v[0], v[1]) <- (a c - b s, a s + b c), bf16 when bf16 (explicit roundings: no FMA contraction).
__device__ __forceinline__ void rope_pair(float* v, float c, float s, bool bf16) {
  const float a = v[0], b = v[1];
  const float re = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  const float im = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  v[0] = maybe_bf16(re, bf16);
  v[1] = maybe_bf16(im, bf16);
}

}  // namespace dsv4::cuda
