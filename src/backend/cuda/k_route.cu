// MoE router (CpuOps::route, spec §5.7): sc = sqrt(softplus(logits)), bias-corrected top-k (ties -> lower id) or
// hash routing ids[t, i] = tid2eid[tokens[t] * k + i], weights sc[id] / sum(sc[ids]) * route_scale.
//
// One warp per token. Bitwise equal to the CPU: softplus uses the bit-exact ports of the glibc float functions the
// CPU build calls (std::exp -> expf, std::log1p -> log1pf; glibc_math.cuh, checked against the host libm on every
// binary32 input), sqrt is correctly rounded on both sides, every other operation is written without contraction in
// the CPU's order.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/glibc_math.cuh"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

constexpr int kMaxExperts = 512;
constexpr int kWarps = 4;

// (value, id) order of the top-k: higher value first, ties -> lower id; id < 0 = no candidate (worst).
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  return va > vb || (va == vb && ia < ib);
}

__global__ void __launch_bounds__(kWarps * 32) route_kernel(const float* logits, int64_t n_tok, int64_t E, int64_t k,
                                                            const float* bias, const int32_t* tid2eid,
                                                            const int32_t* tokens, float route_scale, int32_t* ids_out,
                                                            float* w_out) {
  __shared__ float sc_s[kWarps][kMaxExperts];
  __shared__ float sel_s[kWarps][kMaxExperts];
  __shared__ int32_t ids_s[kWarps][8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * kWarps + warp;
  if (t >= n_tok) return;
  float* sc = sc_s[warp];
  float* sel = sel_s[warp];
#pragma unroll 8  // the loads of 8 iterations in flight
  for (int64_t e = lane; e < E; e += 32) {
    const float l = logits[t * E + e];
    const float sp = l > 20.0f ? l : log1pf_glibc(expf_glibc(l));
    const float v = __fsqrt_rn(sp);
    sc[e] = v;
    sel[e] = bias ? __fadd_rn(v, bias[e]) : v;
  }
  __syncwarp();
  int32_t* ids = ids_out + t * k;
  if (tid2eid) {
    if (lane < k) ids_s[warp][lane] = tid2eid[int64_t(tokens[t]) * k + lane];
  } else {
    uint32_t taken = 0;  // bit j: expert lane + 32 j already selected
    for (int64_t i = 0; i < k; ++i) {
      float bv = 0.0f;
      int bi = -1;
      for (int j = 0; lane + 32 * j < E; ++j) {
        const int e = lane + 32 * j;
        if ((taken >> j) & 1u) continue;
        if (better(sel[e], e, bv, bi)) bv = sel[e], bi = e;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
        if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
      }
      if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
      if (lane == 0) ids_s[warp][i] = bi;
    }
  }
  __syncwarp();
  if (lane == 0) {
    // out-of-range ids (a bad hash table) read sc = 0 instead of faulting
    float s = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t id = ids_s[warp][i];
      s = __fadd_rn(s, (id >= 0 && id < E) ? sc[id] : 0.0f);
    }
    for (int64_t i = 0; i < k; ++i) {
      const int32_t id = ids_s[warp][i];
      ids[i] = id;
      w_out[t * k + i] = __fmul_rn(__fdiv_rn((id >= 0 && id < E) ? sc[id] : 0.0f, s), route_scale);
    }
  }
}

}  // namespace

void route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias, const int32_t* tid2eid,
           const int32_t* tokens, float route_scale, int32_t* ids_out, float* w_out, cudaStream_t stream) {
  if (n_tok <= 0) return;
  if (n_experts <= 0 || n_experts > kMaxExperts) gemm_internal::fail_msg("route: n_experts must be in 1..512");
  if (k <= 0 || k > 8 || k > n_experts) gemm_internal::fail_msg("route: k must be in 1..min(8, n_experts)");
  const int64_t blocks = (n_tok + kWarps - 1) / kWarps;
  route_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(logits, n_tok, n_experts, k, bias, tid2eid,
                                                                          tokens, route_scale, ids_out, w_out);
}

}  // namespace dsv4::cuda
