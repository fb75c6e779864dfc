// The MoE router's arithmetic (CpuOps::route, spec §5.7), shared by route_kernel (k_route.cu) and the decode
// route + dispatch-plan kernel (k_moe.cu), so that both give the same ids and weights bit for bit:
//   route_score   sc = sqrt(softplus(logit)) and the selection value sc + bias of one (token, expert): an element-wise
//                 function, the same whichever thread computes it;
//   route_select  one warp: the token's expert ids (hash table row, or the top-k of the selection values, ties ->
//                 lower id) and weights sc[id] / sum(sc[ids]) * route_scale (lane 0, in slot order).
// Bitwise equal to the CPU: softplus uses the bit-exact ports of the glibc float functions the CPU build calls
// (std::exp -> expf, std::log1p -> log1pf; glibc_math.cuh), sqrt is correctly rounded on both sides, every other
// operation is written without contraction in the CPU's order.
#pragma once
#include <cstdint>

#include "backend/cuda/gemm_path.h"
#include "backend/cuda/glibc_math.cuh"

namespace dsv4::cuda {

constexpr int kRouteMaxExperts = 512;  // E: 16 candidates per lane (one bit each in route_select's mask)
constexpr int kRouteMaxK = 8;

// The router shapes both route kernels take (host side; throws dsv4::Error otherwise).
inline void check_route_shape(int64_t n_experts, int64_t k) {
  if (n_experts <= 0 || n_experts > kRouteMaxExperts) gemm_internal::fail_msg("route: n_experts must be in 1..512");
  if (k <= 0 || k > kRouteMaxK || k > n_experts) gemm_internal::fail_msg("route: k must be in 1..min(8, n_experts)");
}

// (value, id) order of the top-k: higher value first, ties -> lower id; id < 0 = no candidate (worst).
__device__ __forceinline__ bool route_better(float va, int ia, float vb, int ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  return va > vb || (va == vb && ia < ib);
}

// Score sc and selection value sel of expert e from its logit l (bias: [E] or nullptr).
__device__ __forceinline__ void route_score(float l, const float* bias, int64_t e, float* sc, float* sel) {
  const float sp = l > 20.0f ? l : log1pf_glibc(expf_glibc(l));
  const float v = __fsqrt_rn(sp);
  *sc = v;
  *sel = bias ? __fadd_rn(v, bias[e]) : v;
}

// Token t's k ids and weights by the calling warp (all 32 lanes), from its scores sc [E] and selection values sel [E]
// (shared memory, complete before the call). ids_s: k ints of the warp's shared scratch. Writes ids[0..k) and
// w[0..k) (any memory). tid2eid (hash layers, [*, k]) and tokens: as in Ops::route.
__device__ __forceinline__ void route_select(const float* sc, const float* sel, int64_t E, int64_t k,
                                             const int32_t* tid2eid, const int32_t* tokens, int64_t t,
                                             float route_scale, int lane, int32_t* ids_s, int32_t* ids, float* w) {
  if (tid2eid) {
    if (lane < k) ids_s[lane] = tid2eid[int64_t(tokens[t]) * k + lane];
  } else {
    uint32_t taken = 0;  // bit j: expert lane + 32 j already selected
    for (int64_t i = 0; i < k; ++i) {
      float bv = 0.0f;
      int bi = -1;
      for (int j = 0; lane + 32 * j < E; ++j) {
        const int e = lane + 32 * j;
        if ((taken >> j) & 1u) continue;
        if (route_better(sel[e], e, bv, bi)) bv = sel[e], bi = e;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
        if (route_better(ov, oi, bv, bi)) bv = ov, bi = oi;
      }
      if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
      if (lane == 0) ids_s[i] = bi;
    }
  }
  __syncwarp();
  if (lane == 0) {
    // out-of-range ids (a bad hash table) read sc = 0 instead of faulting
    float s = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t id = ids_s[i];
      s = __fadd_rn(s, (id >= 0 && id < E) ? sc[id] : 0.0f);
    }
    for (int64_t i = 0; i < k; ++i) {
      const int32_t id = ids_s[i];
      ids[i] = id;
      w[i] = __fmul_rn(__fdiv_rn((id >= 0 && id < E) ? sc[id] : 0.0f, s), route_scale);
    }
  }
}

}  // namespace dsv4::cuda
