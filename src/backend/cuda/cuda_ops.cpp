#include <algorithm>
#include "backend/cuda/cuda_ops.h"

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/fused_kernels.h"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"
#include "core/log.h"

namespace dsv4::cuda {

namespace {
// A launch error (bad configuration, missing kernel image for this GPU) surfaces here; faults inside kernels surface
// at the next synchronize().
void launched(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) check(e, op);
}
}  // namespace

#define DSV4_CUDA_OP(name, ...)        \
  do {                                 \
    be_.activate();                    \
    cuda::name(__VA_ARGS__, stream()); \
    launched(#name);                   \
  } while (0)

cudaStream_t CudaOps::stream() const { return in_branch_ ? be_.side().stream : be_.stream(); }
const SideStream* CudaOps::moe_side() const { return in_branch_ || branch_open_ ? nullptr : &be_.side(); }

// The branch's scratch: its ops release their workspace scratch when they return, while their kernels may still run
// on the side stream; branch_end() moves the workspace past everything the branch used, so the main stream's ops
// after it never reuse that memory before branch_join() (the enclosing Scope releases it).
void CudaOps::branch_begin() const {
  if (branch_open_) fail("internal: Ops::branch_begin inside a branch");
  be_.activate();
  const SideStream& s = be_.side();
  check(cudaEventRecord(s.fork, be_.stream()), "branch (fork)");
  check(cudaStreamWaitEvent(s.stream, s.fork, 0), "branch (fork)");
  be_.workspace().reset_furthest();
  in_branch_ = branch_open_ = true;
}
void CudaOps::branch_end() const {
  if (!in_branch_) fail("internal: Ops::branch_end without branch_begin");
  in_branch_ = false;
  Workspace& ws = be_.workspace();
  ws.advance_to(ws.furthest());
}
void CudaOps::branch_join() const {
  if (!branch_open_ || in_branch_) fail("internal: Ops::branch_join without branch_begin / branch_end");
  be_.activate();
  const SideStream& s = be_.side();
  check(cudaEventRecord(s.join, s.stream), "branch (join)");
  check(cudaStreamWaitEvent(be_.stream(), s.join, 0), "branch (join)");
  branch_open_ = false;
}

void CudaOps::linear(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o) const {
  if (n_tok <= 0) return;
  Workspace::Scope scope(be_.workspace());
  void* scratch = be_.workspace().alloc_bytes(linear_scratch_bytes(W, n_tok, o));
  DSV4_CUDA_OP(linear, W, x, n_tok, y, o, scratch);
}

// One tensor-core launch for both where linear() would run gemv_tc_kernel for each (decode), else the two linears.
void CudaOps::linear_pair(const WeightView& Wa, const WeightView& Wb, const float* x, int64_t n_tok, float* ya,
                          float* yb, const LinearOpts& o) const {
  if (n_tok <= 0) return;
  if (Wa.cols != Wb.cols || o.row_begin != 0 || (o.row_end != -1 && (o.row_end != Wa.rows || o.row_end != Wb.rows)))
    return Ops::linear_pair(Wa, Wb, x, n_tok, ya, yb, o);  // (fails with the shapes)
  Workspace::Scope scope(be_.workspace());
  void* scratch =
      be_.workspace().alloc_bytes(std::max(linear_scratch_bytes(Wa, n_tok, o), linear_scratch_bytes(Wb, n_tok, o)));
  DSV4_CUDA_OP(linear_pair, Wa, Wb, x, n_tok, ya, yb, o, scratch);
}

// One launch for all groups where the decode kernel runs (the same kernel and per-row operations as one linear()
// per group), else the group loop.
void CudaOps::linear_grouped(const WeightView& W, const float* x, int64_t n_tok, int64_t groups, float* y,
                             const LinearOpts& o) const {
  if (n_tok <= 0) return;
  be_.activate();
  if (const size_t tb = gemm_internal::linear_grouped_bf16_bytes(W, n_tok, groups, o); tb > 0) {  // prefill: cuBLAS
    Workspace::Scope scope(be_.workspace());
    void* scratch = be_.workspace().alloc_bytes(tb);
    if (gemm_internal::linear_grouped_bf16(W, x, n_tok, groups, y, o, scratch, stream())) {
      launched("linear_grouped");
      return;
    }
  }
  if (cuda::linear_grouped(W, x, n_tok, groups, y, o, stream())) {
    launched("linear_grouped");
    return;
  }
  Ops::linear_grouped(W, x, n_tok, groups, y, o);
}

void CudaOps::fill(float* x, int64_t n, float value) const {
  if (n > 0) DSV4_CUDA_OP(fill, x, n, value);
}
void CudaOps::round_bf16(float* x, int64_t n) const {
  if (n > 0) DSV4_CUDA_OP(round_bf16, x, n);
}
void CudaOps::scale(float* x, int64_t n, float alpha, bool bf16) const {
  if (n > 0) DSV4_CUDA_OP(scale, x, n, alpha, bf16);
}
void CudaOps::embed(const WeightView& table, const int32_t* ids, int64_t n_tok, int copies, float* out) const {
  if (n_tok > 0) DSV4_CUDA_OP(embed, table, ids, n_tok, copies, out);
}
void CudaOps::rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16,
                      float* y) const {
  if (n_rows > 0) DSV4_CUDA_OP(rmsnorm, x, n_rows, dim, w, eps, bf16, y);
}
void CudaOps::head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16) const {
  if (n_rows > 0) DSV4_CUDA_OP(head_rms, x, n_rows, dim, eps, bf16);
}
void CudaOps::rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin,
                   bool inverse, bool bf16) const {
  if (n_tok > 0) DSV4_CUDA_OP(rope, x, n_tok, n_heads, head_dim, rd, cos_sin, inverse, bf16);
}
void CudaOps::head_rms_rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, float eps, int64_t rd,
                            const float* cos_sin, bool bf16) const {
  if (n_tok > 0) DSV4_CUDA_OP(head_rms_rope, x, n_tok, n_heads, head_dim, eps, rd, cos_sin, bf16);
}
void CudaOps::norm_rope_fp8(float* x, int64_t n_rows, int64_t dim, const float* w, float eps, int64_t rd,
                            const float* cos_sin, bool bf16, const int32_t* store_src, float* store,
                            const int32_t* store_dst, int64_t n_store) const {
  if (n_rows > 0)
    DSV4_CUDA_OP(norm_rope_fp8, x, n_rows, dim, w, eps, rd, cos_sin, bf16, store_src, store, store_dst, n_store);
}
void CudaOps::rope_hadamard_fp4(float* x, int64_t n_tok, int64_t n_heads, int64_t dim, int64_t rd,
                                const float* cos_sin) const {
  if (n_tok > 0) DSV4_CUDA_OP(rope_hadamard_fp4, x, n_tok, n_heads, dim, rd, cos_sin);
}
void CudaOps::fp8_sim(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block) const {
  if (n_rows > 0) DSV4_CUDA_OP(fp8_sim, x, n_rows, row_stride, n_cols, block);
}
void CudaOps::fp4_sim(float* x, int64_t n_rows, int64_t dim) const {
  if (n_rows > 0) DSV4_CUDA_OP(fp4_sim, x, n_rows, dim);
}
void CudaOps::hadamard(float* x, int64_t n_rows, int64_t dim, bool bf16) const {
  if (n_rows > 0) DSV4_CUDA_OP(hadamard, x, n_rows, dim, bf16);
}
void CudaOps::check_finite(const float* x, int64_t n_rows, int64_t dim, int32_t* bad) const {
  if (n_rows > 0) DSV4_CUDA_OP(check_finite, x, n_rows, dim, bad);
}
void CudaOps::gather_rows(const float* a, int64_t n_a, const float* b, const int32_t* idx, int64_t n, int64_t dim,
                          float* out) const {
  if (n > 0) DSV4_CUDA_OP(gather_rows, a, n_a, b, idx, n, dim, out);
}
void CudaOps::scatter_rows(const float* src, const int32_t* src_idx, float* dst, const int32_t* dst_idx, int64_t n,
                           int64_t dim) const {
  if (n > 0) DSV4_CUDA_OP(scatter_rows, src, src_idx, dst, dst_idx, n, dim);
}
void CudaOps::add_rows(float* x, int64_t n, int64_t dim, const float* table, const int32_t* rows) const {
  if (n > 0) DSV4_CUDA_OP(add_rows, x, n, dim, table, rows);
}
void CudaOps::frontier_update(const float* kv, float* score, int64_t n_tok, const float* ape, const int32_t* ape_row,
                              float* state_kv, float* state_score, const int32_t* idx, const int32_t* dst, int64_t n,
                              int64_t dim) const {
  if (n <= 0 && (ape == nullptr || n_tok <= 0)) return;
  Workspace::Scope scope(be_.workspace());
  const size_t tb = frontier_update_scratch_bytes(n_tok, n, dim);
  float* tmp = tb > 0 ? static_cast<float*>(be_.workspace().alloc_bytes(tb)) : nullptr;
  DSV4_CUDA_OP(frontier_update, kv, score, n_tok, ape, ape_row, state_kv, state_score, idx, dst, n, dim, tmp);
}
void CudaOps::hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                     const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u,
                     float* post, float* comb) const {
  if (n_tok > 0)
    DSV4_CUDA_OP(hc_pre, X, n_tok, hc, dim, fn, scale, base, sinkhorn_iters, hc_eps, norm_eps, bf16, u, post, comb);
}
// One kernel where hc_pre's fast path can normalize u itself (bitwise the same as rmsnorm after it), else the two.
void CudaOps::hc_pre_norm(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                          const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16,
                          const float* norm_w, float* u, float* post, float* comb) const {
  if (n_tok <= 0) return;
  be_.activate();
  const bool normalized = cuda::hc_pre_norm(X, n_tok, hc, dim, fn, scale, base, sinkhorn_iters, hc_eps, norm_eps,
                                            bf16, norm_w, u, post, comb, stream());
  launched("hc_pre_norm");
  if (!normalized) rmsnorm(u, n_tok, dim, norm_w, norm_eps, bf16, u);
}
void CudaOps::hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc,
                      int64_t dim, bool bf16, float* Xout) const {
  if (n_tok > 0) DSV4_CUDA_OP(hc_post, f, X, post, comb, n_tok, hc, dim, bf16, Xout);
}
void CudaOps::hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                      const float* base, float hc_eps, float norm_eps, bool bf16, float* u) const {
  if (n_tok > 0) DSV4_CUDA_OP(hc_head, X, n_tok, hc, dim, fn, scale, base, hc_eps, norm_eps, bf16, u);
}
void CudaOps::sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv,
                               const int32_t* win_idx, int64_t k_win, const int32_t* comp_idx, int64_t k_comp,
                               const float* sink, float scale, bool bf16, float* out) const {
  sparse_attention_rope(q, n_tok, n_heads, kv, win_idx, k_win, comp_idx, k_comp, sink, scale, bf16, 0, nullptr, out);
}
// (rd = 0 / cos_sin == nullptr: no rope)
void CudaOps::sparse_attention_rope(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv,
                                    const int32_t* win_idx, int64_t k_win, const int32_t* comp_idx, int64_t k_comp,
                                    const float* sink, float scale, bool bf16, int64_t rd, const float* cos_sin,
                                    float* out) const {
  if (n_tok <= 0) return;
  // the fast decode kernel's split mode: partial states of up to 256 MB of scratch (else one CTA per head group)
  constexpr size_t kMaxSplitBytes = size_t(256) << 20;
  Workspace::Scope scope(be_.workspace());
  const size_t sb = cuda::attention_split_bytes(n_tok, n_heads, kv.dim, std::max<int64_t>(k_win, 0) +
                                                                        std::max<int64_t>(k_comp, 0));
  void* split = sb > 0 && sb <= kMaxSplitBytes ? be_.workspace().alloc_bytes(sb) : nullptr;
  DSV4_CUDA_OP(sparse_attention_rope, q, n_tok, n_heads, kv, win_idx, k_win, comp_idx, k_comp, sink, scale, bf16,
               cos_sin != nullptr ? rd : 0, cos_sin, out, split, split ? sb : 0);
}
void CudaOps::compress_pool(const float* kv, const float* score, int64_t n_tok, const float* state_kv,
                            const float* state_score, const int32_t* cand, int64_t n_emit, int64_t n_cand, int coff,
                            int64_t c, float* out) const {
  if (n_emit > 0)
    DSV4_CUDA_OP(compress_pool, kv, score, n_tok, state_kv, state_score, cand, n_emit, n_cand, coff, c, out);
}
void CudaOps::indexer_topk(const float* q, int64_t n_tok, int64_t n_heads, int64_t dim, const PagedRows& keys,
                           const int32_t* n_visible, int64_t max_visible, const float* w, int64_t topk, bool bf16,
                           int32_t* sel) const {
  if (n_tok <= 0) return;
  Workspace::Scope scope(be_.workspace());
  void* scratch = be_.workspace().alloc_bytes(indexer_topk_scratch_bytes(n_tok, max_visible, topk));
  DSV4_CUDA_OP(indexer_topk, q, n_tok, n_heads, dim, keys, n_visible, max_visible, w, topk, bf16, sel, scratch);
}
void CudaOps::route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias,
                    const int32_t* tid2eid, const int32_t* tokens, float route_scale, int32_t* ids_out,
                    float* w_out) const {
  if (n_tok > 0)
    DSV4_CUDA_OP(route, logits, n_tok, n_experts, k, bias, tid2eid, tokens, route_scale, ids_out, w_out);
}
void CudaOps::swiglu(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit, const float* row_w,
                     bool bf16, float* h) const {
  if (n_rows > 0) DSV4_CUDA_OP(swiglu, g, up, n_rows, dim, limit, row_w, bf16, h);
}
namespace {
// Which kernels a large MoE call ran (prefill; debug log).
void log_moe_path(int64_t pairs, int64_t tc_before, int64_t big_before) {
  if (pairs < 4096) return;
  const MoePrefillTcStats st = moe_prefill_tc_stats();
  if (moe_tc_big_calls() > big_before)
    log::debug("moe: {} (token, slot) pairs, big segments on FP8 tensor cores (FP4 converted in the kernel)", pairs);
  else if (st.calls > tc_before) log::debug("moe: {} (token, slot) pairs on BF16 tensor cores", pairs);
  else log::debug("moe: {} (token, slot) pairs on the FP4 kernels ({})", pairs, st.last_refusal);
}
}  // namespace

void CudaOps::route_moe(const float* logits, int64_t n_experts, const float* bias, const int32_t* tid2eid,
                        const int32_t* tokens, float route_scale, const MoeWeights& w, const float* x, int64_t n_tok,
                        int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, int32_t* ids, float* wts,
                        float* y) const {
  if (n_tok <= 0) return;
  Workspace::Scope scope(be_.workspace());
  void* scratch = be_.workspace().alloc_bytes(moe_scratch_bytes(w, n_tok, k, q));
  const int64_t tc_before = moe_prefill_tc_stats().calls, big_before = moe_tc_big_calls();
  DSV4_CUDA_OP(route_moe, logits, n_experts, bias, tid2eid, tokens, route_scale, w, x, n_tok, k, swiglu_limit, q, bf16,
               ids, wts, y, scratch, moe_side());
  log_moe_path(n_tok * k, tc_before, big_before);
}
void CudaOps::moe(const MoeWeights& w, const float* x, int64_t n_tok, const int32_t* ids, const float* wts, int64_t k,
                  float swiglu_limit, const LinearOpts& q, bool bf16, float* y) const {
  if (n_tok <= 0) return;
  Workspace::Scope scope(be_.workspace());
  void* scratch = be_.workspace().alloc_bytes(moe_scratch_bytes(w, n_tok, k, q));
  const int64_t tc_before = moe_prefill_tc_stats().calls, big_before = moe_tc_big_calls();
  DSV4_CUDA_OP(moe, w, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, y, scratch, moe_side());
  log_moe_path(n_tok * k, tc_before, big_before);
}

void CudaOps::moe_resident(const MoeWeights& w, const uint8_t* resident, const float* x, int64_t n_tok,
                           const int32_t* ids, const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q,
                           bool bf16, float* o_pairs, float* o_shared) const {
  if (n_tok <= 0) return;
  Workspace::Scope scope(be_.workspace());
  void* scratch = be_.workspace().alloc_bytes(moe_scratch_bytes(w, n_tok, k, q));
  DSV4_CUDA_OP(moe_resident, w, resident, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, o_pairs, o_shared, scratch,
               moe_side());
}
void CudaOps::moe_combine(const float* o_pairs, const int32_t* ids, int64_t n_tok, int64_t k, int64_t D,
                          const float* o_shared, bool bf16, float* y) const {
  if (n_tok > 0) DSV4_CUDA_OP(moe_combine, o_pairs, ids, n_tok, k, D, o_shared, bf16, y);
}

#undef DSV4_CUDA_OP

}  // namespace dsv4::cuda
