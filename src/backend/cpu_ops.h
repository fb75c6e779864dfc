// CPU implementation of the op interface (ops.h): OpenMP over tokens / rows with static partitioning, fixed
// reduction orders (results do not depend on the thread count). GEMMs are delegated to gemm.h (task C2).
#pragma once
#include "backend/ops.h"

namespace dsv4 {

class CpuOps final : public Ops {
 public:
  void linear(const WeightRef& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o) const override;
  void round_bf16(float* x, int64_t n) const override;
  void embed(const WeightRef& table, const int32_t* ids, int64_t n_tok, float* out) const override;
  void rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16,
               float* y) const override;
  void head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16) const override;
  void rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin,
            bool inverse, bool bf16) const override;
  void fp8_sim(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block) const override;
  void fp4_sim(float* x, int64_t n_rows, int64_t dim) const override;
  void hadamard(float* x, int64_t n_rows, int64_t dim, bool bf16) const override;
  void hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
              const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u, float* post,
              float* comb) const override;
  void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc,
               int64_t dim, bool bf16, float* Xout) const override;
  void hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
               const float* base, float hc_eps, float norm_eps, bool bf16, float* u) const override;
  void sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const RowSource& kv, const int32_t* idx,
                        int64_t k, const float* sink, float scale, bool bf16, float* out) const override;
  void softmax_pool(const float* kv, const float* s, int64_t n_cand, int64_t dim, float* out) const override;
  void indexer_topk(const float* q, int64_t n_tok, int64_t n_heads, int64_t dim, const float* keys,
                    const int64_t* n_visible, const float* w, int64_t topk, bool bf16, int32_t* sel) const override;
  void route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias,
             const int32_t* hash_ids, float route_scale, int32_t* ids_out, float* w_out) const override;
  void swiglu(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit, const float* row_w,
              bool bf16, float* h) const override;
};

}  // namespace dsv4
