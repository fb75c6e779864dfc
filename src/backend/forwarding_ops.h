// The base of the benchmarks' op decorators (ProfiledOps: per-op timing; TimelineOps: a host / device timeline):
// every Ops method forwarded to a wrapped Ops as it is, each op through one hook, around(call, body), which a
// decorator overrides to do its work before and after body() (the wrapped op). The composite ops are forwarded
// whole (the wrapped backend runs its fused kernels); the branch calls are forwarded without the hook.
//
// An op added to Ops gets its forwarding method here (one place for every decorator) and a case in
// tests/backend/test_op_decorators.cpp; a pure virtual op left out makes the decorators abstract (a compile error),
// an op with a default would silently run as that default's parts, which the test's list of every op catches.
#pragma once
#include <cstdint>
#include <type_traits>

#include "backend/ops.h"

namespace dsv4 {

// One op call as the hook sees it.
struct OpCall {
  const char* op = "";   // the op's name: its Ops method's, linears with their weight's format ("linear_pair fp8")
  int64_t n = 0;         // the op's rows (tokens, or rows of the buffer)
  int64_t a = 0, b = 0;  // two sizes: the weight's rows and cols (linears, embed), k_win and k_comp (attention),
                         // max_visible and topk (indexer), n_experts and k (route, MoE); 0 for the other ops
  const WeightView* weight = nullptr;  // linears: the (first) weight, whose format the name carries
};

// The wrapped op of one call: a reference to the forwarding method's lambda (no allocation, no copy), valid while
// the hook runs.
class OpBody {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, OpBody>)
  OpBody(F&& f)  // NOLINT(google-explicit-constructor): the forwarding methods pass their lambdas as they are
      : f_(&f), run_([](const void* p) { (*static_cast<const std::remove_reference_t<F>*>(p))(); }) {}
  void operator()() const { run_(f_); }

 private:
  const void* f_;
  void (*run_)(const void*);
};

// The name of a linear op of W's format: "linear fp8", "linear_pair bf16", ...
enum class LinearOp { linear, pair, grouped, check_finite };
inline const char* linear_op_name(LinearOp op, const WeightView& W) {
  static const char* const names[4][4] = {
      {"linear fp4", "linear fp8", "linear bf16", "linear f32"},
      {"linear_pair fp4", "linear_pair fp8", "linear_pair bf16", "linear_pair f32"},
      {"linear_grouped fp4", "linear_grouped fp8", "linear_grouped bf16", "linear_grouped f32"},
      {"linear_check_finite fp4", "linear_check_finite fp8", "linear_check_finite bf16", "linear_check_finite f32"}};
  const int f = W.fmt == GemmFormat::fp4 ? 0 : W.fmt == GemmFormat::fp8 ? 1 : W.fmt == GemmFormat::bf16 ? 2 : 3;
  return names[int(op)][f];
}

class ForwardingOps : public Ops {
 public:
  explicit ForwardingOps(const Ops& inner) : inner_(inner) {}

  // ---- concurrency: forwarded without the hook -------------------------------------------------------------------
  void branch_begin() const override { inner_.branch_begin(); }
  void branch_end() const override { inner_.branch_end(); }
  void branch_join() const override { inner_.branch_join(); }

  // ---- GEMM --------------------------------------------------------------------------------------------------------
  void linear(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o) const override {
    around({linear_op_name(LinearOp::linear, W), n_tok, W.rows, W.cols, &W}, [&] { inner_.linear(W, x, n_tok, y, o); });
  }
  void linear_grouped(const WeightView& W, const float* x, int64_t n_tok, int64_t groups, float* y,
                      const LinearOpts& o) const override {
    around({linear_op_name(LinearOp::grouped, W), n_tok, W.rows, W.cols, &W},
           [&] { inner_.linear_grouped(W, x, n_tok, groups, y, o); });
  }
  void linear_pair(const WeightView& Wa, const WeightView& Wb, const float* x, int64_t n_tok, float* ya, float* yb,
                   const LinearOpts& o) const override {
    around({linear_op_name(LinearOp::pair, Wa), n_tok, Wa.rows + Wb.rows, Wa.cols, &Wa},
           [&] { inner_.linear_pair(Wa, Wb, x, n_tok, ya, yb, o); });
  }
  void linear_check_finite(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o,
                           int32_t* bad) const override {
    around({linear_op_name(LinearOp::check_finite, W), n_tok, W.rows, W.cols, &W},
           [&] { inner_.linear_check_finite(W, x, n_tok, y, o, bad); });
  }

  // ---- elementwise / per-row ---------------------------------------------------------------------------------------
  void fill(float* x, int64_t n, float value) const override {
    around({"fill", n}, [&] { inner_.fill(x, n, value); });
  }
  void round_bf16(float* x, int64_t n) const override {
    around({"round_bf16", n}, [&] { inner_.round_bf16(x, n); });
  }
  void scale(float* x, int64_t n, float alpha, bool bf16) const override {
    around({"scale", n}, [&] { inner_.scale(x, n, alpha, bf16); });
  }
  void embed(const WeightView& table, const int32_t* ids, int64_t n_tok, int copies, float* out) const override {
    around({"embed", n_tok, table.rows, table.cols}, [&] { inner_.embed(table, ids, n_tok, copies, out); });
  }
  void rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16,
               float* y) const override {
    around({"rmsnorm", n_rows}, [&] { inner_.rmsnorm(x, n_rows, dim, w, eps, bf16, y); });
  }
  void head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16) const override {
    around({"head_rms", n_rows}, [&] { inner_.head_rms(x, n_rows, dim, eps, bf16); });
  }
  void rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin, bool inverse,
            bool bf16) const override {
    around({"rope", n_tok}, [&] { inner_.rope(x, n_tok, n_heads, head_dim, rd, cos_sin, inverse, bf16); });
  }
  void head_rms_rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, float eps, int64_t rd,
                     const float* cos_sin, bool bf16) const override {
    around({"head_rms_rope", n_tok},
           [&] { inner_.head_rms_rope(x, n_tok, n_heads, head_dim, eps, rd, cos_sin, bf16); });
  }
  void norm_rope_fp8(float* x, int64_t n_rows, int64_t dim, const float* w, float eps, int64_t rd,
                     const float* cos_sin, bool bf16, const int32_t* store_src, float* store,
                     const int32_t* store_dst, int64_t n_store) const override {
    around({"norm_rope_fp8", n_rows}, [&] {
      inner_.norm_rope_fp8(x, n_rows, dim, w, eps, rd, cos_sin, bf16, store_src, store, store_dst, n_store);
    });
  }
  void rope_hadamard_fp4(float* x, int64_t n_tok, int64_t n_heads, int64_t dim, int64_t rd,
                         const float* cos_sin) const override {
    around({"rope_hadamard_fp4", n_tok}, [&] { inner_.rope_hadamard_fp4(x, n_tok, n_heads, dim, rd, cos_sin); });
  }
  void fp8_sim(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block) const override {
    around({"fp8_sim", n_rows}, [&] { inner_.fp8_sim(x, n_rows, row_stride, n_cols, block); });
  }
  void fp4_sim(float* x, int64_t n_rows, int64_t dim) const override {
    around({"fp4_sim", n_rows}, [&] { inner_.fp4_sim(x, n_rows, dim); });
  }
  void hadamard(float* x, int64_t n_rows, int64_t dim, bool bf16) const override {
    around({"hadamard", n_rows}, [&] { inner_.hadamard(x, n_rows, dim, bf16); });
  }
  void check_finite(const float* x, int64_t n_rows, int64_t dim, int32_t* bad) const override {
    around({"check_finite", n_rows}, [&] { inner_.check_finite(x, n_rows, dim, bad); });
  }

  // ---- rows --------------------------------------------------------------------------------------------------------
  void gather_rows(const float* a, int64_t n_a, const float* b, const int32_t* idx, int64_t n, int64_t dim,
                   float* out) const override {
    around({"gather_rows", n}, [&] { inner_.gather_rows(a, n_a, b, idx, n, dim, out); });
  }
  void scatter_rows(const float* src, const int32_t* src_idx, float* dst, const int32_t* dst_idx, int64_t n,
                    int64_t dim) const override {
    around({"scatter_rows", n}, [&] { inner_.scatter_rows(src, src_idx, dst, dst_idx, n, dim); });
  }
  void add_rows(float* x, int64_t n, int64_t dim, const float* table, const int32_t* rows) const override {
    around({"add_rows", n}, [&] { inner_.add_rows(x, n, dim, table, rows); });
  }
  void frontier_update(const float* kv, float* score, int64_t n_tok, const float* ape, const int32_t* ape_row,
                       float* state_kv, float* state_score, const int32_t* idx, const int32_t* dst, int64_t n,
                       int64_t dim) const override {
    around({"frontier_update", n},
           [&] { inner_.frontier_update(kv, score, n_tok, ape, ape_row, state_kv, state_score, idx, dst, n, dim); });
  }
  void encode_rows(const float* x, int64_t n, const RowCodec& c, float* out) const override {
    around({"encode_rows", n}, [&] { inner_.encode_rows(x, n, c, out); });
  }

  // ---- hyper-connections -------------------------------------------------------------------------------------------
  void hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
              const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u, float* post,
              float* comb) const override {
    around({"hc_pre", n_tok}, [&] {
      inner_.hc_pre(X, n_tok, hc, dim, fn, scale, base, sinkhorn_iters, hc_eps, norm_eps, bf16, u, post, comb);
    });
  }
  void hc_pre_norm(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                   const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16,
                   const float* norm_w, float* u, float* post, float* comb) const override {
    around({"hc_pre_norm", n_tok}, [&] {
      inner_.hc_pre_norm(X, n_tok, hc, dim, fn, scale, base, sinkhorn_iters, hc_eps, norm_eps, bf16, norm_w, u, post,
                         comb);
    });
  }
  void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc,
               int64_t dim, bool bf16, float* Xout) const override {
    around({"hc_post", n_tok}, [&] { inner_.hc_post(f, X, post, comb, n_tok, hc, dim, bf16, Xout); });
  }
  void hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
               const float* base, float hc_eps, float norm_eps, bool bf16, float* u) const override {
    around({"hc_head", n_tok}, [&] { inner_.hc_head(X, n_tok, hc, dim, fn, scale, base, hc_eps, norm_eps, bf16, u); });
  }

  // ---- attention, compressor, indexer ------------------------------------------------------------------------------
  void sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv, const int32_t* win_idx,
                        int64_t k_win, const int32_t* comp_idx, int64_t k_comp, const float* sink, float scale,
                        bool bf16, float* out) const override {
    around({"sparse_attention", n_tok, k_win, k_comp}, [&] {
      inner_.sparse_attention(q, n_tok, n_heads, kv, win_idx, k_win, comp_idx, k_comp, sink, scale, bf16, out);
    });
  }
  void sparse_attention_rope(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv,
                             const int32_t* win_idx, int64_t k_win, const int32_t* comp_idx, int64_t k_comp,
                             const float* sink, float scale, bool bf16, int64_t rd, const float* cos_sin,
                             float* out) const override {
    around({"sparse_attention_rope", n_tok, k_win, k_comp}, [&] {
      inner_.sparse_attention_rope(q, n_tok, n_heads, kv, win_idx, k_win, comp_idx, k_comp, sink, scale, bf16, rd,
                                   cos_sin, out);
    });
  }
  void compress_pool(const float* kv, const float* score, int64_t n_tok, const float* state_kv,
                     const float* state_score, const int32_t* cand, int64_t n_emit, int64_t n_cand, int coff,
                     int64_t c, float* out) const override {
    around({"compress_pool", n_emit}, [&] {
      inner_.compress_pool(kv, score, n_tok, state_kv, state_score, cand, n_emit, n_cand, coff, c, out);
    });
  }
  void indexer_topk(const float* q, int64_t n_tok, int64_t n_heads, int64_t dim, const PagedRows& keys,
                    const int32_t* n_visible, int64_t max_visible, const float* w, int64_t topk, bool bf16,
                    int32_t* sel) const override {
    around({"indexer_topk", n_tok, max_visible, topk},
           [&] { inner_.indexer_topk(q, n_tok, n_heads, dim, keys, n_visible, max_visible, w, topk, bf16, sel); });
  }

  // ---- MoE ---------------------------------------------------------------------------------------------------------
  void route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias,
             const int32_t* tid2eid, const int32_t* tokens, float route_scale, int32_t* ids_out,
             float* w_out) const override {
    around({"route", n_tok, n_experts, k},
           [&] { inner_.route(logits, n_tok, n_experts, k, bias, tid2eid, tokens, route_scale, ids_out, w_out); });
  }
  void swiglu(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit, const float* row_w,
              bool bf16, float* h) const override {
    around({"swiglu", n_rows}, [&] { inner_.swiglu(g, up, n_rows, dim, limit, row_w, bf16, h); });
  }
  void moe(const MoeWeights& w, const float* x, int64_t n_tok, const int32_t* ids, const float* wts, int64_t k,
           float swiglu_limit, const LinearOpts& q, bool bf16, float* y) const override {
    around({"moe", n_tok, w.n_experts, k}, [&] { inner_.moe(w, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, y); });
  }
  void route_moe(const float* logits, int64_t n_experts, const float* bias, const int32_t* tid2eid,
                 const int32_t* tokens, float route_scale, const MoeWeights& w, const float* x, int64_t n_tok,
                 int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, int32_t* ids, float* wts,
                 float* y) const override {
    around({"route_moe", n_tok, n_experts, k}, [&] {
      inner_.route_moe(logits, n_experts, bias, tid2eid, tokens, route_scale, w, x, n_tok, k, swiglu_limit, q, bf16,
                       ids, wts, y);
    });
  }
  void moe_resident(const MoeWeights& w, const uint8_t* resident, const float* x, int64_t n_tok, const int32_t* ids,
                    const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* o_pairs,
                    float* o_shared) const override {
    around({"moe_resident", n_tok, w.n_experts, k}, [&] {
      inner_.moe_resident(w, resident, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, o_pairs, o_shared);
    });
  }
  void moe_combine(const float* o_pairs, const int32_t* ids, int64_t n_tok, int64_t k, int64_t D,
                   const float* o_shared, bool bf16, float* y) const override {
    around({"moe_combine", n_tok, 0, k}, [&] { inner_.moe_combine(o_pairs, ids, n_tok, k, D, o_shared, bf16, y); });
  }

 protected:
  // One op: run body() (the wrapped op) exactly once, with the decorator's work around it.
  virtual void around(const OpCall& call, OpBody body) const = 0;

  const Ops& inner_;
};

}  // namespace dsv4
