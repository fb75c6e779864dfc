// Routed + shared experts (Ops::moe, CpuOps::moe; spec §5.7), without a host round trip:
//   1. moe_plan_kernel (one block): count the (token, slot) pairs per expert, exclusive scan -> expert segments,
//      stable scatter of the pairs into a list sorted by (expert id, pair index) (warp match + per-warp counts, in
//      pair order), the tile schedule of the grouped GEMMs (M tiles of experts with > kMoeSmallMax rows, the list
//      of the small experts). route_moe (Ops::route_moe) of at most kRoutePlanMaxTok tokens runs the router in the
//      same block first (route_plan_kernel: the scores of every (token, expert) over all threads, then one warp per
//      token selects; device_route.cuh, the arithmetic of route_kernel), else route_kernel before the plan.
//   2. (Q) act_quant of every token row once (codes + scales); the GEMMs gather rows through row_tok.
//   3. moe_w13 (k_gemm.cu): w1 and w3 of each expert over its segment, SwiGLU with the pair's routing weight
//      (bf16 when bf16) -> h [sorted rows, inter]. Small segments (decode) on the decode kernels ((Q) split by
//      scale block, (D) one K chain per lane), big ones on the tiled kernel; all compute the CPU's per-output
//      order (gemm.h), so a row never depends on its segment and (Q) and (D) both equal the CPU bitwise.
//   4. (Q) act_quant of h in place; moe_w2 -> o [sorted rows, d_model] (bf16-rounded when q.out_bf16, as the CPU's
//      linear rounds its output).
//   In the fast (Q) mode, FP4 experts: the big segments of 3-4 run on f16 tensor cores with the FP4 -> f16
//      conversion inside the kernel (k_moe_tc.cu), the small ones on moe_tc_small_kernel. Where that kernel cannot
//      run (weights not 16-byte aligned), large calls (>= 4096 pairs) take cuBLAS BF16 tensor cores instead
//      (k_bf16_tc.cu: the products are exact in BF16; the one host round trip of this file, for the segment sizes).
//   5. shared expert through linear_pair() (w1 and w3) and linear() (w2), SwiGLU without weight between; queued
//      first, on the side stream when the caller gives one and the call has at most kForkMaxTok tokens (it then
//      overlaps 1-4: at batch 1 neither fills the GPU).
//   6. moe_combine_kernel: y[t] = sum of o over t's slots in ascending (expert id, slot) order (fp32, from 0),
//      + the shared expert's output, then bf16(y) when bf16 — the CPU's accumulation order.
// moe_resident (a layer split with the host, model/split_moe.h) runs 1-5 on the resident experts' pairs only (the
// plan skips the others) and writes each pair's row to o_pairs[pair] instead of 6; moe_combine is 6 over such rows.
// Grids are sized from host-known bounds (n_tok * k pairs, n_experts); blocks past the device-side totals exit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/device_pdl.cuh"
#include "backend/cuda/device_route.cuh"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

using gemm_internal::kMoeSmallMax;
using gemm_internal::kMoeTileM;

constexpr int kPlanThreads = 1024;
constexpr int kPlanMaxE = 512;
constexpr int64_t kMaxPairs = 65535;  // per-warp offsets are 16-bit

inline size_t align256(size_t b) { return (b + 255) & ~size_t(255); }
inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Exclusive scan of one int per thread over a block of kPlanThreads; *total = the sum. tmp: 32 ints of shared memory.
__device__ int block_excl_scan(int v, int* tmp, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(0xFFFFFFFFu, incl, o);
    if (lane >= o) incl += t;
  }
  if (lane == 31) tmp[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = tmp[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int t = __shfl_up_sync(0xFFFFFFFFu, w, o);
      if (lane >= o) w += t;
    }
    tmp[lane] = w;
  }
  __syncthreads();
  const int off = warp > 0 ? tmp[warp - 1] : 0;
  *total = tmp[31];
  __syncthreads();
  return off + incl - v;
}

// The plan's shared memory (route_plan_kernel reuses it for the router's scores).
struct PlanShared {
  int cnt[kPlanMaxE];
  int start[kPlanMaxE];
  int run[kPlanMaxE];
  uint16_t wc[32][kPlanMaxE];  // per warp of a chunk: pairs per expert, then their offsets
  int tmp[32];
};

// The plan of the P = n_tok * k pairs with expert ids[p] and routing weights wts[p] (step 1), by a whole block of
// kPlanThreads threads.
__device__ void plan_pairs(const int32_t* ids, int64_t P, int64_t E, int64_t k, const uint8_t* resident,
                           const float* wts, int32_t* seg_start, int32_t* big_tile_start, int32_t* small_list,
                           int32_t* n_small, int32_t* pos, int32_t* row_tok, float* row_w, PlanShared& sh) {
  int* cnt = sh.cnt;
  int* start = sh.start;
  int* run = sh.run;
  uint16_t (*wc)[kPlanMaxE] = sh.wc;
  int* tmp = sh.tmp;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  for (int64_t e = tid; e < E; e += kPlanThreads) cnt[e] = 0, run[e] = 0;
  __syncthreads();
  for (int64_t p = tid; p < P; p += kPlanThreads) {
    const int32_t e = ids[p];
    if (e >= 0 && e < E && (resident == nullptr || resident[e])) atomicAdd(&cnt[e], 1);  // order-independent
  }
  __syncthreads();

  // segments, tile schedule, small-expert list (E <= kPlanMaxE < kPlanThreads: one expert per thread)
  const int c = tid < E ? cnt[tid] : 0;
  int total = 0;
  const int s0 = block_excl_scan(c, tmp, &total);
  if (tid < E) start[tid] = s0, seg_start[tid] = s0;
  if (tid == 0) seg_start[E] = total;
  const int tiles = c > kMoeSmallMax ? (c + kMoeTileM - 1) / kMoeTileM : 0;
  const int t0 = block_excl_scan(tiles, tmp, &total);
  if (tid < E) big_tile_start[tid] = t0;
  if (tid == 0) big_tile_start[E] = total;
  const int small = (c > 0 && c <= kMoeSmallMax) ? 1 : 0;
  const int i0 = block_excl_scan(small, tmp, &total);
  if (small) small_list[i0] = tid;
  if (tid == 0) *n_small = total;
  __syncthreads();

  // stable scatter, chunk by chunk of kPlanThreads pairs (pair order = thread order within a chunk)
  const unsigned lt_mask = (1u << lane) - 1u;
  for (int64_t c0 = 0; c0 < P; c0 += kPlanThreads) {
    const int64_t p = c0 + tid;
    const int32_t e = p < P ? ids[p] : -1;
    const bool valid = e >= 0 && e < E && (resident == nullptr || resident[e]);
    for (int64_t i = tid; i < 32 * E; i += kPlanThreads) wc[i / E][i % E] = 0;
    __syncthreads();
    const unsigned key = valid ? unsigned(e) : unsigned(E + lane);  // invalid lanes never group
    const unsigned mask = __match_any_sync(0xFFFFFFFFu, key);
    const int rank = __popc(mask & lt_mask);
    if (valid && rank == 0) wc[warp][e] = static_cast<uint16_t>(__popc(mask));
    __syncthreads();
    for (int64_t x = tid; x < E; x += kPlanThreads) {
      int o = run[x];
      for (int w = 0; w < 32; ++w) {
        const int n = wc[w][x];
        wc[w][x] = static_cast<uint16_t>(o);
        o += n;
      }
      run[x] = o;
    }
    __syncthreads();
    if (valid) {
      const int ps = start[e] + wc[warp][e] + rank;
      pos[p] = ps;
      row_tok[ps] = static_cast<int32_t>(p / k);
      row_w[ps] = wts[p];
    } else if (p < P) {
      pos[p] = -1;
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kPlanThreads) moe_plan_kernel(const int32_t* ids, int64_t P, int64_t E, int64_t k,
                                                                const uint8_t* resident, const float* wts,
                                                                int32_t* seg_start, int32_t* big_tile_start,
                                                                int32_t* small_list, int32_t* n_small, int32_t* pos,
                                                                int32_t* row_tok, float* row_w) {
  __shared__ PlanShared sh;
  plan_pairs(ids, P, E, k, resident, wts, seg_start, big_tile_start, small_list, n_small, pos, row_tok, row_w, sh);
}

// The router's inputs and outputs (Ops::route) for route_moe.
struct RouteIn {
  const float* logits = nullptr;  // [n_tok, E]
  int64_t E = 0;
  const float* bias = nullptr;
  const int32_t* tid2eid = nullptr;
  const int32_t* tokens = nullptr;
  float route_scale = 1.0f;
  int32_t* ids = nullptr;  // [n_tok, k]
  float* wts = nullptr;
};

constexpr int kRoutePlanMaxTok = 8;  // decode and verify steps: the scores of every token fit the plan's memory
int64_t g_route_plan_calls = 0;      // route_plan_kernel launches (route_plan_calls(), for tests)

struct RouteShared {
  float sc[kRoutePlanMaxTok][kRouteMaxExperts];
  float sel[kRoutePlanMaxTok][kRouteMaxExperts];
  int32_t ids_s[kRoutePlanMaxTok][kRouteMaxK];
};

// route_kernel then moe_plan_kernel in one block (n_tok <= kRoutePlanMaxTok, every expert resident): the same ids
// and weights (device_route.cuh), also written to r.ids / r.wts, and the same plan.
__global__ void __launch_bounds__(kPlanThreads) route_plan_kernel(RouteIn r, int64_t n_tok, int64_t E, int64_t k,
                                                                  int32_t* seg_start, int32_t* big_tile_start,
                                                                  int32_t* small_list, int32_t* n_small, int32_t* pos,
                                                                  int32_t* row_tok, float* row_w) {
  __shared__ union {
    RouteShared route;
    PlanShared plan;
  } sh;
  __shared__ int32_t ids[kRoutePlanMaxTok * kRouteMaxK];
  __shared__ float wts[kRoutePlanMaxTok * kRouteMaxK];
  pdl_wait();
  pdl_launch_dependents();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t RE = r.E, P = n_tok * k;
  for (int64_t i = tid; i < n_tok * RE; i += kPlanThreads) {
    const int64_t t = i / RE, e = i % RE;
    route_score(r.logits[t * RE + e], r.bias, e, &sh.route.sc[t][e], &sh.route.sel[t][e]);
  }
  __syncthreads();
  if (warp < n_tok)
    route_select(sh.route.sc[warp], sh.route.sel[warp], RE, k, r.tid2eid, r.tokens, warp, r.route_scale, lane,
                 sh.route.ids_s[warp], ids + warp * k, wts + warp * k);
  __syncthreads();  // (the scores are dead from here: plan_pairs reuses their memory)
  for (int64_t p = tid; p < P; p += kPlanThreads) r.ids[p] = ids[p], r.wts[p] = wts[p];
  plan_pairs(ids, P, E, k, nullptr, wts, seg_start, big_tile_start, small_list, n_small, pos, row_tok, row_w, sh.plan);
}

// y[t, d] = (sum over t's slots in (expert id, slot) order of o[pos, d]) + os[t, d], bf16 when bf16.
// pos == nullptr: o holds one row per pair (pos = the pair index).
__global__ void __launch_bounds__(256) moe_combine_kernel(const int32_t* ids, const int32_t* pos, int64_t n_tok,
                                                          int64_t k, const float* o, const float* os, int64_t D,
                                                          bool bf16, float* y) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t nd = (D + 1023) / 1024;
  const int64_t t = blockIdx.x / nd;
  const int64_t d0 = (blockIdx.x % nd) * 1024 + int64_t(threadIdx.x) * 4;
  if (t >= n_tok || d0 >= D) return;
  int key[8], ord[8];
  int ns = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int32_t ps = pos != nullptr ? pos[t * k + i] : static_cast<int32_t>(t * k + i);
    if (ps < 0) continue;
    const int id = ids[t * k + i];
    int j = ns++;
    while (j > 0 && key[j - 1] > id) {  // stable insertion: equal ids keep slot order
      key[j] = key[j - 1];
      ord[j] = ord[j - 1];
      --j;
    }
    key[j] = id;
    ord[j] = ps;
  }
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int nv = static_cast<int>(D - d0 < 4 ? D - d0 : 4);
  for (int s = 0; s < ns; ++s) {
    const float* orow = o + int64_t(ord[s]) * D + d0;
    for (int j = 0; j < nv; ++j) acc[j] = __fadd_rn(acc[j], orow[j]);
  }
  if (os != nullptr)
    for (int j = 0; j < nv; ++j) acc[j] = __fadd_rn(acc[j], os[t * D + d0 + j]);
  for (int j = 0; j < nv; ++j) y[t * D + d0 + j] = bf16 ? round_bf16(acc[j]) : acc[j];
}

// o_pairs[p, :] = o[pos[p], :] for the pairs with a row (pos[p] >= 0); the others are left untouched.
__global__ void __launch_bounds__(256) moe_unsort_kernel(const int32_t* pos, int64_t P, const float* o, int64_t D,
                                                         float* o_pairs) {
  const int64_t nd = (D + 1023) / 1024;
  const int64_t p = blockIdx.x / nd;
  const int64_t d0 = (blockIdx.x % nd) * 1024 + int64_t(threadIdx.x) * 4;
  if (p >= P || d0 >= D) return;
  const int32_t ps = pos[p];
  if (ps < 0) return;
  const int nv = static_cast<int>(D - d0 < 4 ? D - d0 : 4);
  for (int j = 0; j < nv; ++j) o_pairs[p * D + d0 + j] = o[int64_t(ps) * D + d0 + j];
}

constexpr int64_t kForkMaxTok = 256;  // largest call whose shared expert runs beside the routed experts

struct MoeLayout {
  int64_t E = 0, D = 0, I = 0, P = 0, Is = 0;
  bool Q = false;
  size_t seg = 0, big = 0, small = 0, nsmall = 0, pos = 0, rtok = 0, rw = 0, qx = 0, sx = 0, h = 0, sh = 0, o = 0,
         gs = 0, us = 0, os = 0, lin = 0, bfw = 0, a8 = 0, total = 0;
};

MoeLayout layout(const MoeWeights& w, int64_t n_tok, int64_t k, const LinearOpts& q) {
  MoeLayout L;
  L.E = w.n_experts;
  const ExpertView& e0 = w.experts[0];
  L.D = e0.w1.cols;
  L.I = e0.w1.rows;
  L.P = n_tok * k;
  L.Q = q.act_quant_fp8;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align256(bytes);
    return at;
  };
  L.seg = take(size_t(L.E + 1) * 4);
  L.big = take(size_t(L.E + 1) * 4);
  L.small = take(size_t(L.E) * 4);
  L.nsmall = take(4);
  L.pos = take(size_t(L.P) * 4);
  L.rtok = take(size_t(L.P) * 4);
  L.rw = take(size_t(L.P) * 4);
  if (L.Q) {
    L.qx = take(size_t(n_tok * L.D) * 4);
    L.sx = take(size_t(n_tok * cdiv(L.D, 128)) * 4);
    L.sh = take(size_t(L.P * cdiv(L.I, 128)) * 4);
  }
  L.h = take(size_t(L.P * L.I) * 4);
  L.o = take(size_t(L.P * L.D) * 4);
  if (w.shared != nullptr) {
    L.Is = w.shared->w1.rows;
    L.gs = take(size_t(n_tok * L.Is) * 4);
    L.us = take(size_t(n_tok * L.Is) * 4);
    L.os = take(size_t(n_tok * L.D) * 4);
    const size_t lb = std::max({linear_scratch_bytes(w.shared->w1, n_tok, q),
                                linear_scratch_bytes(w.shared->w3, n_tok, q),
                                linear_scratch_bytes(w.shared->w2, n_tok, q)});
    L.lin = take(lb);
  }
  L.bfw = take(gemm_internal::moe_bf16_scratch_bytes(e0.w1.fmt, L.Q, L.P, L.D, L.I));
  L.a8 = take(gemm_internal::moe_tc_big_scratch_bytes(e0.w1.fmt, L.Q, n_tok, L.P, L.D, L.I));
  L.total = off;
  return L;
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) gemm_internal::fail_msg(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

size_t moe_scratch_bytes(const MoeWeights& w, int64_t n_tok, int64_t k, const LinearOpts& q) {
  if (n_tok <= 0 || w.n_experts <= 0 || w.experts == nullptr) return 0;
  return layout(w, n_tok, k, q).total;
}

namespace {

// moe (y != nullptr: the combine into y) or moe_resident (resident, o_pairs, o_shared).
// route (or nullptr): ids and wts are its outputs, computed here before the plan (route_moe).
void moe_run(const RouteIn* route, const MoeWeights& w, const uint8_t* resident, const float* x, int64_t n_tok,
             const int32_t* ids, const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16,
             float* y, float* o_pairs, float* o_shared, void* scratch, const SideStream* side, cudaStream_t stream) {
  using gemm_internal::fail_msg;
  if (n_tok <= 0) return;
  if (w.n_experts <= 0 || w.experts == nullptr || w.device_table == nullptr) fail_msg("moe: no experts");
  const ExpertView& e0 = w.experts[0];
  const GemmFormat fmt = e0.w1.fmt;
  if (e0.w3.fmt != fmt || e0.w2.fmt != fmt) fail_msg("moe: w1/w2/w3 of the experts must share one format");
  if (e0.w3.rows != e0.w1.rows || e0.w3.cols != e0.w1.cols || e0.w2.rows != e0.w1.cols || e0.w2.cols != e0.w1.rows)
    fail_msg("moe: inconsistent expert shapes");
  if (w.n_experts > kPlanMaxE) fail_msg("moe: at most 512 experts");
  if (k <= 0 || k > 8) fail_msg("moe: k must be in 1..8");
  if (n_tok * k > kMaxPairs) fail_msg("moe: at most 65535 (token, slot) pairs per call");
  if (q.act_quant_fp8) {
    if (fmt != GemmFormat::fp8 && fmt != GemmFormat::fp4) fail_msg("moe: act_quant_fp8 needs FP8 or FP4 experts");
    if (fmt == GemmFormat::fp8 && (e0.w1.block_cols != 128 || e0.w2.block_cols != 128))
      fail_msg("moe: act_quant_fp8 needs 128-column FP8 weight blocks");
  }
  const MoeLayout L = layout(w, n_tok, k, q);
  char* base = static_cast<char*>(scratch);
  auto I32 = [&](size_t off) { return reinterpret_cast<int32_t*>(base + off); };
  auto F32 = [&](size_t off) { return reinterpret_cast<float*>(base + off); };

  // 5. the shared expert (its own scratch: L.gs, L.us, L.os, L.lin) on the side stream when there is one, while the
  //    routed experts run on `stream`; joined before the combine
  const float* os = nullptr;
  // (only for decode-sized calls: there neither half fills the GPU; a prefill-sized call fills it on its own)
  const bool fork = side != nullptr && side->stream != nullptr && n_tok <= kForkMaxTok;
  if (w.shared != nullptr && (y != nullptr || o_shared != nullptr)) {
    const cudaStream_t ss = fork ? side->stream : stream;
    if (fork) {
      cuda_ok(cudaEventRecord(side->fork, stream), "moe: fork the shared expert");
      cuda_ok(cudaStreamWaitEvent(side->stream, side->fork, 0), "moe: fork the shared expert");
    }
    float* osd = y != nullptr ? F32(L.os) : o_shared;
    const ExpertView& s = *w.shared;
    void* ls = base + L.lin;
    linear_pair(s.w1, s.w3, x, n_tok, F32(L.gs), F32(L.us), q, ls, ss);
    gemm_internal::swiglu_rows(F32(L.gs), F32(L.us), n_tok, L.Is, swiglu_limit, bf16, F32(L.gs), ss);
    linear(s.w2, F32(L.gs), n_tok, osd, q, ls, ss);
    if (fork) cuda_ok(cudaEventRecord(side->join, side->stream), "moe: join the shared expert");
    os = osd;
  }

  if (route != nullptr && resident == nullptr && n_tok <= kRoutePlanMaxTok) {
    ++g_route_plan_calls;
    launch_pdl(route_plan_kernel, 1, kPlanThreads, 0, stream, *route, n_tok, L.E, k, I32(L.seg), I32(L.big),
               I32(L.small), I32(L.nsmall), I32(L.pos), I32(L.rtok), F32(L.rw));
  } else {
    if (route != nullptr)
      cuda::route(route->logits, n_tok, route->E, k, route->bias, route->tid2eid, route->tokens, route->route_scale,
                  route->ids, route->wts, stream);
    moe_plan_kernel<<<1, kPlanThreads, 0, stream>>>(ids, L.P, L.E, k, resident, wts, I32(L.seg), I32(L.big),
                                                    I32(L.small), I32(L.nsmall), I32(L.pos), I32(L.rtok), F32(L.rw));
  }

  gemm_internal::MoeGemmArgs g;
  g.table = static_cast<const ExpertView*>(w.device_table);
  g.n_experts = L.E;
  g.fmt = fmt;
  g.d_model = L.D;
  g.inter = L.I;
  g.seg_start = I32(L.seg);
  g.big_tile_start = I32(L.big);
  g.small_list = I32(L.small);
  g.n_small = I32(L.nsmall);
  g.n_rows_bound = L.P;
  g.n_tok = n_tok;
  g.row_tok = I32(L.rtok);
  g.row_w = F32(L.rw);
  g.quant = L.Q;
  g.out_bf16 = q.out_bf16;
  g.weight_as_bf16 = q.weight_as_bf16;
  g.block_cols = fmt == GemmFormat::fp8 ? std::min(e0.w1.block_cols, e0.w2.block_cols) : 32;
  g.words_ok = true;
  for (int64_t e = 0; e < w.n_experts && g.words_ok; ++e)
    for (const WeightView* v : {&w.experts[e].w1, &w.experts[e].w3, &w.experts[e].w2})
      g.words_ok = g.words_ok && ((reinterpret_cast<uintptr_t>(v->w) | reinterpret_cast<uintptr_t>(v->scale) |
                                   uintptr_t(v->row_bytes()) | uintptr_t((v->cols + 31) / 32)) & 3) == 0;
  g.w16_ok = g.words_ok;
  for (int64_t e = 0; e < w.n_experts && g.w16_ok; ++e)
    for (const WeightView* v : {&w.experts[e].w1, &w.experts[e].w3, &w.experts[e].w2})
      g.w16_ok = g.w16_ok && ((reinterpret_cast<uintptr_t>(v->w) | uintptr_t(v->row_bytes())) & 15) == 0;
  if (gemm_internal::moe_tc_big_scratch_bytes(fmt, L.Q, n_tok, L.P, L.D, L.I) > 0) g.a8_ws = base + L.a8;
  // the big segments on f16 tensor cores (k_moe_tc.cu) when they can: no BF16 copies of the experts, no host sync
  const bool big_tc = L.Q && g.a8_ws != nullptr && gemm_internal::moe_tc_big_ok(g);

  float* h = F32(L.h);
  if (L.Q && !big_tc && gemm_internal::moe_bf16_scratch_bytes(fmt, true, L.P, L.D, L.I) > 0 &&
      gemm_internal::moe_bf16_ok(g, stream)) {  // prefill: cuBLAS BF16 (k_bf16_tc.cu)
    std::vector<int32_t> seg;
    gemm_internal::act_quant_f32(x, n_tok, L.D, F32(L.qx), F32(L.sx), stream);
    gemm_internal::moe_bf16_w13(g, w.experts, F32(L.qx), F32(L.sx), swiglu_limit, bf16, h, F32(L.o), base + L.bfw,
                                seg, stream);
    gemm_internal::act_quant_f32(h, L.P, L.I, h, F32(L.sh), stream);
    gemm_internal::moe_bf16_w2(g, w.experts, h, F32(L.sh), F32(L.o), base + L.bfw, seg, stream);
  } else if (L.Q) {
    gemm_internal::act_quant_f32(x, n_tok, L.D, F32(L.qx), F32(L.sx), stream);
    gemm_internal::moe_w13(g, F32(L.qx), F32(L.sx), swiglu_limit, bf16, h, stream);
    gemm_internal::act_quant_f32(h, L.P, L.I, h, F32(L.sh), stream);
    gemm_internal::moe_w2(g, h, F32(L.sh), F32(L.o), stream);
  } else {
    gemm_internal::moe_w13(g, x, nullptr, swiglu_limit, bf16, h, stream);
    gemm_internal::moe_w2(g, h, nullptr, F32(L.o), stream);
  }

  if (os != nullptr && fork)
    cuda_ok(cudaStreamWaitEvent(stream, side->join, 0), "moe: join the shared expert");

  const int64_t nd = cdiv(L.D, 1024);
  if (y != nullptr)
    launch_pdl(moe_combine_kernel, static_cast<unsigned>(n_tok * nd), 256, 0, stream, ids, I32(L.pos), n_tok, k,
               F32(L.o), os, L.D, bf16, y);
  else
    moe_unsort_kernel<<<static_cast<unsigned>(L.P * nd), 256, 0, stream>>>(I32(L.pos), L.P, F32(L.o), L.D, o_pairs);
}

}  // namespace

void moe(const MoeWeights& w, const float* x, int64_t n_tok, const int32_t* ids, const float* wts, int64_t k,
         float swiglu_limit, const LinearOpts& q, bool bf16, float* y, void* scratch, const SideStream* side,
         cudaStream_t stream) {
  moe_run(nullptr, w, nullptr, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, y, nullptr, nullptr, scratch, side,
          stream);
}

int64_t route_plan_calls() { return g_route_plan_calls; }

void route_moe(const float* logits, int64_t n_experts, const float* bias, const int32_t* tid2eid,
               const int32_t* tokens, float route_scale, const MoeWeights& w, const float* x, int64_t n_tok, int64_t k,
               float swiglu_limit, const LinearOpts& q, bool bf16, int32_t* ids, float* wts, float* y, void* scratch,
               const SideStream* side, cudaStream_t stream) {
  if (n_tok <= 0) return;
  check_route_shape(n_experts, k);
  RouteIn r;
  r.logits = logits;
  r.E = n_experts;
  r.bias = bias;
  r.tid2eid = tid2eid;
  r.tokens = tokens;
  r.route_scale = route_scale;
  r.ids = ids;
  r.wts = wts;
  moe_run(&r, w, nullptr, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, y, nullptr, nullptr, scratch, side, stream);
}

void moe_resident(const MoeWeights& w, const uint8_t* resident, const float* x, int64_t n_tok, const int32_t* ids,
                  const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* o_pairs,
                  float* o_shared, void* scratch, const SideStream* side, cudaStream_t stream) {
  moe_run(nullptr, w, resident, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, nullptr, o_pairs, o_shared, scratch,
          side, stream);
}

void moe_combine(const float* o_pairs, const int32_t* ids, int64_t n_tok, int64_t k, int64_t D,
                 const float* o_shared, bool bf16, float* y, cudaStream_t stream) {
  if (n_tok <= 0) return;
  if (k <= 0 || k > 8) gemm_internal::fail_msg("moe: k must be in 1..8");
  const int64_t nd = cdiv(D, 1024);
  launch_pdl(moe_combine_kernel, static_cast<unsigned>(n_tok * nd), 256, 0, stream, ids, nullptr, n_tok, k, o_pairs,
             o_shared, D, bf16, y);
}

}  // namespace dsv4::cuda
