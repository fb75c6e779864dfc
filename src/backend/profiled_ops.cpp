#include "backend/profiled_ops.h"

namespace dsv4 {

template <class F>
void ProfiledOps::timed(const char* name, F&& f) const {
  be_.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  be_.synchronize();
  Entry& e = times_[name];
  e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++e.calls;
}

// The profile's name of a linear of W's format.
static const char* linear_kind(const WeightView& W) {
  return W.fmt == GemmFormat::fp4 ? "linear fp4" : W.fmt == GemmFormat::fp8 ? "linear fp8"
         : W.fmt == GemmFormat::bf16 ? "linear bf16" : "linear f32";
}

void ProfiledOps::linear(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o) const {
  timed(linear_kind(W), [&] { inner_.linear(W, x, n_tok, y, o); });
}
void ProfiledOps::linear_check_finite(const WeightView& W, const float* x, int64_t n_tok, float* y,
                                      const LinearOpts& o, int32_t* bad) const {
  timed(linear_kind(W), [&] { inner_.linear_check_finite(W, x, n_tok, y, o, bad); });
}
void ProfiledOps::linear_grouped(const WeightView& W, const float* x, int64_t n_tok, int64_t groups, float* y,
                                 const LinearOpts& o) const {
  timed(linear_kind(W), [&] { inner_.linear_grouped(W, x, n_tok, groups, y, o); });
}

void ProfiledOps::linear_pair(const WeightView& Wa, const WeightView& Wb, const float* x, int64_t n_tok, float* ya,
                              float* yb, const LinearOpts& o) const {
  timed(linear_kind(Wa), [&] { inner_.linear_pair(Wa, Wb, x, n_tok, ya, yb, o); });
}

void ProfiledOps::fill(float* x, int64_t n, float value) const {
  timed("fill", [&] { inner_.fill(x, n, value); });
}

void ProfiledOps::round_bf16(float* x, int64_t n) const {
  timed("round_bf16", [&] { inner_.round_bf16(x, n); });
}

void ProfiledOps::scale(float* x, int64_t n, float alpha, bool bf16) const {
  timed("scale", [&] { inner_.scale(x, n, alpha, bf16); });
}

void ProfiledOps::embed(const WeightView& table, const int32_t* ids, int64_t n_tok, int copies, float* out) const {
  timed("embed", [&] { inner_.embed(table, ids, n_tok, copies, out); });
}

void ProfiledOps::rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16, float* y) const {
  timed("rmsnorm", [&] { inner_.rmsnorm(x, n_rows, dim, w, eps, bf16, y); });
}

void ProfiledOps::head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16) const {
  timed("head_rms", [&] { inner_.head_rms(x, n_rows, dim, eps, bf16); });
}

void ProfiledOps::rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin, bool inverse, bool bf16) const {
  timed("rope", [&] { inner_.rope(x, n_tok, n_heads, head_dim, rd, cos_sin, inverse, bf16); });
}

void ProfiledOps::norm_rope_fp8(float* x, int64_t n_rows, int64_t dim, const float* w, float eps, int64_t rd,
                                const float* cos_sin, bool bf16, const int32_t* store_src, float* store,
                                const int32_t* store_dst, int64_t n_store) const {
  timed("norm_rope_fp8",
        [&] { inner_.norm_rope_fp8(x, n_rows, dim, w, eps, rd, cos_sin, bf16, store_src, store, store_dst, n_store); });
}

void ProfiledOps::rope_hadamard_fp4(float* x, int64_t n_tok, int64_t n_heads, int64_t dim, int64_t rd,
                                    const float* cos_sin) const {
  timed("rope_hadamard_fp4", [&] { inner_.rope_hadamard_fp4(x, n_tok, n_heads, dim, rd, cos_sin); });
}

void ProfiledOps::fp8_sim(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block) const {
  timed("fp8_sim", [&] { inner_.fp8_sim(x, n_rows, row_stride, n_cols, block); });
}

void ProfiledOps::fp4_sim(float* x, int64_t n_rows, int64_t dim) const {
  timed("fp4_sim", [&] { inner_.fp4_sim(x, n_rows, dim); });
}

void ProfiledOps::hadamard(float* x, int64_t n_rows, int64_t dim, bool bf16) const {
  timed("hadamard", [&] { inner_.hadamard(x, n_rows, dim, bf16); });
}

void ProfiledOps::check_finite(const float* x, int64_t n_rows, int64_t dim, int32_t* bad) const {
  timed("check_finite", [&] { inner_.check_finite(x, n_rows, dim, bad); });
}

void ProfiledOps::gather_rows(const float* a, int64_t n_a, const float* b, const int32_t* idx, int64_t n, int64_t dim, float* out) const {
  timed("gather_rows", [&] { inner_.gather_rows(a, n_a, b, idx, n, dim, out); });
}

void ProfiledOps::scatter_rows(const float* src, const int32_t* src_idx, float* dst, const int32_t* dst_idx, int64_t n, int64_t dim) const {
  timed("scatter_rows", [&] { inner_.scatter_rows(src, src_idx, dst, dst_idx, n, dim); });
}

void ProfiledOps::add_rows(float* x, int64_t n, int64_t dim, const float* table, const int32_t* rows) const {
  timed("add_rows", [&] { inner_.add_rows(x, n, dim, table, rows); });
}
void ProfiledOps::frontier_update(const float* kv, float* score, int64_t n_tok, const float* ape,
                                  const int32_t* ape_row, float* state_kv, float* state_score, const int32_t* idx,
                                  const int32_t* dst, int64_t n, int64_t dim) const {
  timed("frontier_update",
        [&] { inner_.frontier_update(kv, score, n_tok, ape, ape_row, state_kv, state_score, idx, dst, n, dim); });
}
void ProfiledOps::encode_rows(const float* x, int64_t n, const RowCodec& c, float* out) const {
  timed("encode_rows", [&] { inner_.encode_rows(x, n, c, out); });
}

void ProfiledOps::hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale, const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u, float* post, float* comb) const {
  timed("hc_pre", [&] { inner_.hc_pre(X, n_tok, hc, dim, fn, scale, base, sinkhorn_iters, hc_eps, norm_eps, bf16, u, post, comb); });
}

void ProfiledOps::hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc, int64_t dim, bool bf16, float* Xout) const {
  timed("hc_post", [&] { inner_.hc_post(f, X, post, comb, n_tok, hc, dim, bf16, Xout); });
}

void ProfiledOps::hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale, const float* base, float hc_eps, float norm_eps, bool bf16, float* u) const {
  timed("hc_head", [&] { inner_.hc_head(X, n_tok, hc, dim, fn, scale, base, hc_eps, norm_eps, bf16, u); });
}

void ProfiledOps::sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv, const int32_t* win_idx, int64_t k_win, const int32_t* comp_idx, int64_t k_comp, const float* sink, float scale, bool bf16, float* out) const {
  timed("sparse_attention", [&] { inner_.sparse_attention(q, n_tok, n_heads, kv, win_idx, k_win, comp_idx, k_comp, sink, scale, bf16, out); });
}

void ProfiledOps::sparse_attention_rope(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv,
                                        const int32_t* win_idx, int64_t k_win, const int32_t* comp_idx,
                                        int64_t k_comp, const float* sink, float scale, bool bf16, int64_t rd,
                                        const float* cos_sin, float* out) const {
  timed("sparse_attention_rope", [&] {
    inner_.sparse_attention_rope(q, n_tok, n_heads, kv, win_idx, k_win, comp_idx, k_comp, sink, scale, bf16, rd,
                                 cos_sin, out);
  });
}

void ProfiledOps::compress_pool(const float* kv, const float* score, int64_t n_tok, const float* state_kv, const float* state_score, const int32_t* cand, int64_t n_emit, int64_t n_cand, int coff, int64_t c, float* out) const {
  timed("compress_pool", [&] { inner_.compress_pool(kv, score, n_tok, state_kv, state_score, cand, n_emit, n_cand, coff, c, out); });
}

void ProfiledOps::indexer_topk(const float* q, int64_t n_tok, int64_t n_heads, int64_t dim, const PagedRows& keys, const int32_t* n_visible, int64_t max_visible, const float* w, int64_t topk, bool bf16, int32_t* sel) const {
  timed("indexer_topk", [&] { inner_.indexer_topk(q, n_tok, n_heads, dim, keys, n_visible, max_visible, w, topk, bf16, sel); });
}

void ProfiledOps::route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias, const int32_t* tid2eid, const int32_t* tokens, float route_scale, int32_t* ids_out, float* w_out) const {
  timed("route", [&] { inner_.route(logits, n_tok, n_experts, k, bias, tid2eid, tokens, route_scale, ids_out, w_out); });
}

void ProfiledOps::swiglu(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit, const float* row_w, bool bf16, float* h) const {
  timed("swiglu", [&] { inner_.swiglu(g, up, n_rows, dim, limit, row_w, bf16, h); });
}

void ProfiledOps::moe(const MoeWeights& w, const float* x, int64_t n_tok, const int32_t* ids, const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* y) const {
  timed("moe", [&] { inner_.moe(w, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, y); });
}

void ProfiledOps::moe_resident(const MoeWeights& w, const uint8_t* resident, const float* x, int64_t n_tok, const int32_t* ids, const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* o_pairs, float* o_shared) const {
  timed("moe_resident", [&] { inner_.moe_resident(w, resident, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, o_pairs, o_shared); });
}

void ProfiledOps::moe_combine(const float* o_pairs, const int32_t* ids, int64_t n_tok, int64_t k, int64_t D, const float* o_shared, bool bf16, float* y) const {
  timed("moe_combine", [&] { inner_.moe_combine(o_pairs, ids, n_tok, k, D, o_shared, bf16, y); });
}

}  // namespace dsv4
