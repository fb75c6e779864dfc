// SwiGLU of one element as the CPU computes it (CpuOps::swiglu, spec §5.7): the optional clamp (u to [-limit, limit],
// g to <= limit), silu(g) = g / (1 + exp(-g)) with the glibc expf port, times u, times the routing weight when given,
// bf16 when bf16. Shared by the expert GEMM epilogues (k_gemm.cu, k_bf16_tc.cu).
#pragma once
#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/glibc_math.cuh"

namespace dsv4::cuda {

__device__ __forceinline__ float swiglu_val(float g, float u, float limit, bool has_w, float rw, bool bf16) {
  if (limit > 0.0f) {
    u = fminf(fmaxf(u, -limit), limit);
    g = fminf(g, limit);
  }
  float v = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf_glibc(-g))), u);
  if (has_w) v = __fmul_rn(rw, v);
  return bf16 ? round_bf16(v) : v;
}

}  // namespace dsv4::cuda
