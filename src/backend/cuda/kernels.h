// Launchers of the CUDA kernels behind CudaOps (cuda_ops.cpp). Each launcher queues its kernels on `stream` and
// returns without synchronizing; every pointer is device memory. The semantics of each launcher are those of the Ops
// method of the same name (backend/ops.h); where a launcher needs scratch, the caller allocates
// *_scratch_bytes(...) bytes of device memory from the workspace and passes it in.
//
// This header is included by .cu files (nvcc) and by cuda_ops.cpp (the host compiler): C++17, no CUDA types beyond
// cudaStream_t and cudaEvent_t.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/ops.h"
#include "backend/weight_view.h"

namespace dsv4::cuda {

// Streaming multiprocessors of the current device (cached per device; k_attention.cu).
int sm_count();

// Programmatic Dependent Launch of the decode-path kernels (device_pdl.cuh; pdl.cu). Process-wide switch,
// default on (the CLI's --no-pdl turns it off): later launches follow it; recorded step graphs are keyed by it.
void set_pdl(bool on);
bool pdl();
// Whether launches on the current device get the attribute: pdl() and compute capability 9.0+ (cached per device).
bool pdl_active();

// A second stream for work that may overlap the caller's (CudaOps::branch_*, the shared expert in moe), with the
// events that fork it from the caller's stream (the side waits for `fork`) and join it back (the caller waits for
// `join`). Usable while a graph is being captured: the fork pulls the side stream into the capture.
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};

// ---- GEMM (k_gemm.cu) --------------------------------------------------------------------------------------------
// Semantics: backend/gemm.h (Q) and (D). W.aux may hold fp32-widened scales (see gemm_cublaslt.cpp); kernels that do
// not need them ignore it.
// Backend-private data kept with a resident weight (WeightView::aux), built once at upload; 0 bytes: none.
size_t weight_aux_bytes(const WeightView& W);
void build_weight_aux(const WeightView& W, void* aux, cudaStream_t stream);
size_t linear_scratch_bytes(const WeightView& W, int64_t n_tok, const LinearOpts& o);
// Grouped linear (Ops::linear_grouped) in one gemv launch: fast mode, (D) options, n_tok <= 8 and a gemv shape;
// returns false (nothing launched) otherwise.
bool linear_grouped(const WeightView& W, const float* x, int64_t n_tok, int64_t groups, float* y, const LinearOpts& o,
                    cudaStream_t stream);
// Whether linear_grouped runs its f16 tensor-core kernel (FP8 weights, (D), 1..8 tokens: wo_a) for this call.
bool linear_grouped_tc(const WeightView& W, int64_t n_tok, int64_t groups, const float* x, const LinearOpts& o);
void linear(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o, void* scratch,
            cudaStream_t stream);
// Ops::linear_pair: y1 = linear(W1, x), y3 = linear(W3, x) (the same o; W1 and W3 of one K and format, rows may
// differ): one tensor-core launch where linear() would run gemv_tc_kernel for each with the same K slices (o's row
// range the whole of both), else the two calls; each output bitwise its linear().
void linear_pair(const WeightView& W1, const WeightView& W3, const float* x, int64_t n_tok, float* y1, float* y3,
                 const LinearOpts& o, void* scratch, cudaStream_t stream);

// ---- elementwise / rows (k_elementwise.cu) -----------------------------------------------------------------------
void fill(float* x, int64_t n, float value, cudaStream_t stream);
void round_bf16(float* x, int64_t n, cudaStream_t stream);
void scale(float* x, int64_t n, float alpha, bool bf16, cudaStream_t stream);
void embed(const WeightView& table, const int32_t* ids, int64_t n_tok, int copies, float* out, cudaStream_t stream);
void rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16, float* y,
             cudaStream_t stream);
void head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16, cudaStream_t stream);
void rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin, bool inverse,
          bool bf16, cudaStream_t stream);
// Ops::head_rms_rope in one kernel (each head's row normalized, then its rope pairs; bitwise the two launchers).
void head_rms_rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, float eps, int64_t rd,
                   const float* cos_sin, bool bf16, cudaStream_t stream);
void fp8_sim(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block, cudaStream_t stream);
void fp4_sim(float* x, int64_t n_rows, int64_t dim, cudaStream_t stream);
void hadamard(float* x, int64_t n_rows, int64_t dim, bool bf16, cudaStream_t stream);
void check_finite(const float* x, int64_t n_rows, int64_t dim, int32_t* bad, cudaStream_t stream);
void gather_rows(const float* a, int64_t n_a, const float* b, const int32_t* idx, int64_t n, int64_t dim, float* out,
                 cudaStream_t stream);
void scatter_rows(const float* src, const int32_t* src_idx, float* dst, const int32_t* dst_idx, int64_t n,
                  int64_t dim, cudaStream_t stream);
void add_rows(float* x, int64_t n, int64_t dim, const float* table, const int32_t* rows, cudaStream_t stream);
void swiglu(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit, const float* row_w, bool bf16,
            float* h, cudaStream_t stream);

// ---- hyper-connections (k_hc.cu) ---------------------------------------------------------------------------------
void hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
            const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u, float* post,
            float* comb, cudaStream_t stream);
// hc_pre, then (where its fast path can: decode calls, 1024 < dim <= 8192) the rmsnorm of u by norm_w in the same
// kernel, bitwise what rmsnorm() would give; returns false when it did not normalize (the caller runs rmsnorm()).
bool hc_pre_norm(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                 const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, const float* norm_w,
                 float* u, float* post, float* comb, cudaStream_t stream);
void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc, int64_t dim,
             bool bf16, float* Xout, cudaStream_t stream);
void hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
             const float* base, float hc_eps, float norm_eps, bool bf16, float* u, cudaStream_t stream);

// ---- attention (k_attention.cu) ----------------------------------------------------------------------------------
// split_scratch: split_bytes of device memory for the fast decode kernel's split mode (entries in fixed pieces over
// more CTAs, then a combine); used when attention_split_bytes(...) fit, else (or nullptr) one CTA runs all entries.
size_t attention_split_bytes(int64_t n_tok, int64_t n_heads, int64_t dim, int64_t k);
// How many sparse_attention calls of this process ran the tensor-core prefill kernel (for tests).
int64_t sparse_attention_tc_calls();
void sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv, const int32_t* win_idx,
                      int64_t k_win, const int32_t* comp_idx, int64_t k_comp, const float* sink, float scale,
                      bool bf16, float* out, void* split_scratch, size_t split_bytes, cudaStream_t stream);

// ---- compressor (k_compressor.cu) --------------------------------------------------------------------------------
void compress_pool(const float* kv, const float* score, int64_t n_tok, const float* state_kv, const float* state_score,
                   const int32_t* cand, int64_t n_emit, int64_t n_cand, int coff, int64_t c, float* out,
                   cudaStream_t stream);

// ---- lightning indexer (k_indexer.cu) ----------------------------------------------------------------------------
// max_visible: an upper bound of n_visible[t] over the tokens (known to the host from positions). keys: paged
// (PagedRows, ops.h); sel receives pool row ids.
size_t indexer_topk_scratch_bytes(int64_t n_tok, int64_t max_visible, int64_t topk);
void indexer_topk(const float* q, int64_t n_tok, int64_t n_heads, int64_t dim, const PagedRows& keys,
                  const int32_t* n_visible, int64_t max_visible, const float* w, int64_t topk, bool bf16,
                  int32_t* sel, void* scratch, cudaStream_t stream);

// ---- MoE (k_route.cu, k_moe.cu) ----------------------------------------------------------------------------------
void route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias, const int32_t* tid2eid,
           const int32_t* tokens, float route_scale, int32_t* ids_out, float* w_out, cudaStream_t stream);
// The expert shapes are uniform within a layer: d_model = experts[0].w1.cols, inter = experts[0].w1.rows.
size_t moe_scratch_bytes(const MoeWeights& w, int64_t n_tok, int64_t k, const LinearOpts& q);
// side (or nullptr): the shared expert runs on side->stream, concurrently with the routed experts.
void moe(const MoeWeights& w, const float* x, int64_t n_tok, const int32_t* ids, const float* wts, int64_t k,
         float swiglu_limit, const LinearOpts& q, bool bf16, float* y, void* scratch, const SideStream* side,
         cudaStream_t stream);
// Ops::route_moe: route (ids, wts written as route() writes them), then moe on them (scratch: moe_scratch_bytes).
// Calls of at most 8 tokens run the router inside the MoE's plan kernel (one launch less; the same ids and weights).
void route_moe(const float* logits, int64_t n_experts, const float* bias, const int32_t* tid2eid,
               const int32_t* tokens, float route_scale, const MoeWeights& w, const float* x, int64_t n_tok, int64_t k,
               float swiglu_limit, const LinearOpts& q, bool bf16, int32_t* ids, float* wts, float* y, void* scratch,
               const SideStream* side, cudaStream_t stream);
// How many route_moe calls of this process routed inside the plan kernel (for tests).
int64_t route_plan_calls();
// Large (prefill) FP4 calls in the fast (Q) mode on cuBLAS BF16 tensor cores (k_bf16_tc.cu): how many calls took
// that path in this process, and why the last call of >= 4096 pairs that did not take it was refused (for tests).
struct MoePrefillTcStats {
  int64_t calls = 0;
  const char* last_refusal = "";
};
MoePrefillTcStats moe_prefill_tc_stats();
// How many MoE calls of this process ran their big expert segments on moe_tc_big_kernel (k_moe_tc.cu; for tests).
int64_t moe_tc_big_calls();
// How many of those launches ran the wgmma kernel (k_moe_wgmma.cu) instead of the mma.sync one (for tests).
int64_t moe_wgmma_calls();
// How many launches of moe_tc_small_kernel (the small expert segments in the fast mode, k_gemm.cu: one per MoE
// product) this process queued (for tests).
int64_t moe_tc_small_launches();
// For tests: moe_tc_small_kernel alone, on one expert whose only segment is `rows` (1..16) sorted rows (row r's
// token is r). w13: w1 and w3 ([inter, d_model]) on a [rows, d_model] into y [rows, 2 inter]: g, then u, the fp32
// sums (no SwiGLU, no rounding); else w2 ([d_model, inter]) on a [rows, inter] into y [rows, d_model]. a: exact
// e4m3 values as fp32 with block scales sa [rows, K / 128]; dev_expert: FP4 weight views of device memory; a, sa, y
// device memory. Synchronous; false (nothing run) where the kernel cannot take the shape, the mode or the device.
bool moe_tc_small_for_test(bool w13, const ExpertView& dev_expert, const float* a, const float* sa, int64_t rows,
                           float* y);
// How many of the fp32 outputs of rounds x 64 x 256 lanes' random mma operands tc_mma_b and tc_mma disagree on
// (other than a zero's sign or a NaN's bits); -1 where the device or the binary has no FP8 mma (k_mma_check.cu;
// for tests).
int64_t tc_mma_b_mismatches(uint64_t seed, int rounds);
// Ops::moe_resident / moe_combine (scratch: moe_scratch_bytes).
void moe_resident(const MoeWeights& w, const uint8_t* resident, const float* x, int64_t n_tok, const int32_t* ids,
                  const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* o_pairs,
                  float* o_shared, void* scratch, const SideStream* side, cudaStream_t stream);
void moe_combine(const float* o_pairs, const int32_t* ids, int64_t n_tok, int64_t k, int64_t D,
                 const float* o_shared, bool bf16, float* y, cudaStream_t stream);

// ---- dummy weights (k_random.cu) ---------------------------------------------------------------------------------
// Backend::fill_random on the device; kind = int(Backend::RandomFill).
void fill_random(void* p, size_t bytes, int kind, float param, uint64_t seed, cudaStream_t stream);

}  // namespace dsv4::cuda
