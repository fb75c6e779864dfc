// MoE router (CpuOps::route, spec §5.7): sc = sqrt(softplus(logits)), bias-corrected top-k (ties -> lower id) or
// hash routing ids[t, i] = tid2eid[tokens[t] * k + i], weights sc[id] / sum(sc[ids]) * route_scale.
//
// One warp per token, with the router arithmetic of device_route.cuh (bitwise equal to the CPU; decode calls of
// Ops::route_moe run the same functions inside the MoE's plan kernel, k_moe.cu).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_route.cuh"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

constexpr int kWarps = 4;

__global__ void __launch_bounds__(kWarps * 32) route_kernel(const float* logits, int64_t n_tok, int64_t E, int64_t k,
                                                            const float* bias, const int32_t* tid2eid,
                                                            const int32_t* tokens, float route_scale, int32_t* ids_out,
                                                            float* w_out) {
  __shared__ float sc_s[kWarps][kRouteMaxExperts];
  __shared__ float sel_s[kWarps][kRouteMaxExperts];
  __shared__ int32_t ids_s[kWarps][kRouteMaxK];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * kWarps + warp;
  if (t >= n_tok) return;
  float* sc = sc_s[warp];
  float* sel = sel_s[warp];
#pragma unroll 8  // the loads of 8 iterations in flight
  for (int64_t e = lane; e < E; e += 32) route_score(logits[t * E + e], bias, e, sc + e, sel + e);
  __syncwarp();
  route_select(sc, sel, E, k, tid2eid, tokens, t, route_scale, lane, ids_s[warp], ids_out + t * k, w_out + t * k);
}

}  // namespace

void route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias, const int32_t* tid2eid,
           const int32_t* tokens, float route_scale, int32_t* ids_out, float* w_out, cudaStream_t stream) {
  if (n_tok <= 0) return;
  check_route_shape(n_experts, k);
  const int64_t blocks = (n_tok + kWarps - 1) / kWarps;
  route_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(logits, n_tok, n_experts, k, bias, tid2eid,
                                                                          tokens, route_scale, ids_out, w_out);
}

}  // namespace dsv4::cuda
