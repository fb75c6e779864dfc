// The CUDA implementation of the op interface (ops.h): each op queues the kernels of kernels.h on the backend's
// stream, with scratch from the backend's workspace. Tested op by op against CpuOps (tests/gpu).
#pragma once
#include "backend/cuda/kernels.h"
#include "backend/ops.h"

namespace dsv4::cuda {

class CudaBackend;

class CudaOps final : public Ops {
 public:
  explicit CudaOps(CudaBackend& be) : be_(be) {}
  void branch_begin() const override;
  void branch_end() const override;
  void branch_join() const override;
  void linear(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o) const override;
  void linear_grouped(const WeightView& W, const float* x, int64_t n_tok, int64_t groups, float* y,
                      const LinearOpts& o) const override;
  void linear_pair(const WeightView& Wa, const WeightView& Wb, const float* x, int64_t n_tok, float* ya, float* yb,
                   const LinearOpts& o) const override;
  void fill(float* x, int64_t n, float value) const override;
  void round_bf16(float* x, int64_t n) const override;
  void scale(float* x, int64_t n, float alpha, bool bf16) const override;
  void embed(const WeightView& table, const int32_t* ids, int64_t n_tok, int copies, float* out) const override;
  void rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16,
               float* y) const override;
  void head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16) const override;
  void rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin,
            bool inverse, bool bf16) const override;
  void head_rms_rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, float eps, int64_t rd,
                     const float* cos_sin, bool bf16) const override;
  void norm_rope_fp8(float* x, int64_t n_rows, int64_t dim, const float* w, float eps, int64_t rd,
                     const float* cos_sin, bool bf16, const int32_t* store_src, float* store,
                     const int32_t* store_dst, int64_t n_store) const override;
  void rope_hadamard_fp4(float* x, int64_t n_tok, int64_t n_heads, int64_t dim, int64_t rd,
                         const float* cos_sin) const override;
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
  void hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
              const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u, float* post,
              float* comb) const override;
  void hc_pre_norm(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                   const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, const float* norm_w,
                   float* u, float* post, float* comb) const override;
  void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc,
               int64_t dim, bool bf16, float* Xout) const override;
  void hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
               const float* base, float hc_eps, float norm_eps, bool bf16, float* u) const override;
  void sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv, const int32_t* win_idx,
                        int64_t k_win, const int32_t* comp_idx, int64_t k_comp, const float* sink, float scale,
                        bool bf16, float* out) const override;
  void sparse_attention_rope(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv,
                             const int32_t* win_idx, int64_t k_win, const int32_t* comp_idx, int64_t k_comp,
                             const float* sink, float scale, bool bf16, int64_t rd, const float* cos_sin,
                             float* out) const override;
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
  void route_moe(const float* logits, int64_t n_experts, const float* bias, const int32_t* tid2eid,
                 const int32_t* tokens, float route_scale, const MoeWeights& w, const float* x, int64_t n_tok, int64_t k,
                 float swiglu_limit, const LinearOpts& q, bool bf16, int32_t* ids, float* wts,
                 float* y) const override;
  void moe_resident(const MoeWeights& w, const uint8_t* resident, const float* x, int64_t n_tok, const int32_t* ids,
                    const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* o_pairs,
                    float* o_shared) const override;
  void moe_combine(const float* o_pairs, const int32_t* ids, int64_t n_tok, int64_t k, int64_t D,
                   const float* o_shared, bool bf16, float* y) const override;

 private:
  cudaStream_t stream() const;  // the side stream inside a branch, else the backend's
  // the side stream for moe's shared expert: none inside a branch (already on it)
  const SideStream* moe_side() const;
  CudaBackend& be_;
  mutable bool in_branch_ = false, branch_open_ = false;  // queuing onto the side stream / between begin and join
};

}  // namespace dsv4::cuda
