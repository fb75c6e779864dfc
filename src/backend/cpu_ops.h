// CPU implementation of the op interface (ops.h) — the reference every other backend is tested against: OpenMP over
// tokens / rows with static partitioning and fixed reduction orders (results do not depend on the thread count).
// GEMMs are delegated to gemm.h.
#pragma once
#include "backend/ops.h"

namespace dsv4 {

class CpuOps : public Ops {
 public:
  void linear(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o) const override;
  void linear_check_finite(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o,
                           int32_t* bad) const override;
  void fill(float* x, int64_t n, float value) const override;
  void round_bf16(float* x, int64_t n) const override;
  void scale(float* x, int64_t n, float alpha, bool bf16) const override;
  void embed(const WeightView& table, const int32_t* ids, int64_t n_tok, int copies, float* out) const override;
  void rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16,
               float* y) const override;
  void head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16) const override;
  void rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin,
            bool inverse, bool bf16) const override;
  void fp8_sim(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block) const override;
  void fp4_sim(float* x, int64_t n_rows, int64_t dim) const override;
  void hadamard(float* x, int64_t n_rows, int64_t dim, bool bf16) const override;
  void check_finite(const float* x, int64_t n_rows, int64_t dim, int32_t* bad) const override;
  void gather_rows(const float* a, int64_t n_a, const float* b, const int32_t* idx, int64_t n, int64_t dim,
                   float* out) const override;
  void scatter_rows(const float* src, const int32_t* src_idx, float* dst, const int32_t* dst_idx, int64_t n,
                    int64_t dim) const override;
  void add_rows(float* x, int64_t n, int64_t dim, const float* table, const int32_t* rows) const override;
  void frontier_update(const float* kv, float* score, int64_t n_tok, const float* ape, const int32_t* ape_row,
                       float* state_kv, float* state_score, const int32_t* idx, const int32_t* dst, int64_t n,
                       int64_t dim) const override;
  void encode_rows(const float* x, int64_t n, const RowCodec& c, float* out) const override;
  void hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
              const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u, float* post,
              float* comb) const override;
  void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc,
               int64_t dim, bool bf16, float* Xout) const override;
  void hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
               const float* base, float hc_eps, float norm_eps, bool bf16, float* u) const override;
  void sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv, const int32_t* win_idx,
                        int64_t k_win, const int32_t* comp_idx, int64_t k_comp, const float* sink, float scale,
                        bool bf16, float* out) const override;
  void compress_pool(const float* kv, const float* score, int64_t n_tok, const float* state_kv,
                     const float* state_score, const int32_t* cand, int64_t n_emit, int64_t n_cand, int coff,
                     int64_t c, float* out) const override;
  void indexer_topk(const float* q, int64_t n_tok, int64_t n_heads, int64_t dim, const PagedRows& keys,
                    const int32_t* n_visible, int64_t max_visible, const float* w, int64_t topk, bool bf16,
                    int32_t* sel) const override;
  void route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias,
             const int32_t* tid2eid, const int32_t* tokens, float route_scale, int32_t* ids_out,
             float* w_out) const override;
  void swiglu(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit, const float* row_w,
              bool bf16, float* h) const override;
  void moe(const MoeWeights& w, const float* x, int64_t n_tok, const int32_t* ids, const float* wts, int64_t k,
           float swiglu_limit, const LinearOpts& q, bool bf16, float* y) const override;
  void moe_resident(const MoeWeights& w, const uint8_t* resident, const float* x, int64_t n_tok, const int32_t* ids,
                    const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* o_pairs,
                    float* o_shared) const override;
  void moe_combine(const float* o_pairs, const int32_t* ids, int64_t n_tok, int64_t k, int64_t D,
                   const float* o_shared, bool bf16, float* y) const override;
};

// The expert part of CpuOps::moe (cpu_moe.cpp), shared with the host half of a split MoE layer (model/split_moe.h):
// runs the routed experts selected by `use` (use[e] != 0; nullptr: all) on their (token, slot) pairs, and the shared
// expert on every token when with_shared (and w.shared). out receives the selected pairs' o rows in bucket order
// (ascending expert id, then pair index p = t * k + i), then the shared expert's n_tok rows; pair_of_row[r] = the
// pair of routed row r. Experts run in parallel; every row equals CpuOps::moe's bitwise (a row depends only on its
// token, expert and weight). Capacity: out [(n_tok * k + n_tok) * D], pair_of_row [n_tok * k]. Returns the number
// of routed rows. D = the experts' input width (w.experts[0].w1.cols; views of unselected experts may be unbound).
int64_t cpu_expert_rows(const MoeWeights& w, int64_t D, const uint8_t* use, const float* x, int64_t n_tok,
                        const int32_t* ids, const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q,
                        bool bf16, bool with_shared, int32_t* pair_of_row, float* out);

}  // namespace dsv4
