// Device-neutral op interface of the DeepSeek V4 forward pass (spec §4, §5). The model (src/model/) is written once
// against `Ops`; the CPU implementation is `cpu_ops()` (cpu_ops.h), a CUDA backend will implement the same interface.
//
// Conventions (every op):
// * Activations are fp32 buffers, row-major, with the token index outermost ([n_tok, ...]); nothing assumes
//   n_tok == 1 or a single sequence (index lists carry the per-query visibility).
// * `bf16 == true` ("reference" numerics, spec §8): the op reproduces the reference's bf16 tensor semantics — inputs
//   are already bf16-representable and every output the reference stores as bf16 is rounded to bf16 (RNE).
//   `bf16 == false` ("dense" numerics): plain fp32 math, no rounding, no quantization simulation.
// * Results are bitwise independent of the thread count: every output element is computed by one thread with a fixed
//   reduction order (static partitioning over rows/tokens).
// * Shapes are validated by the caller (the model); ops assume consistent arguments.
#pragma once
#include <cstdint>
#include <span>

#include "backend/gemm.h"
#include "backend/numerics.h"
#include "loader/weights.h"

namespace dsv4 {

// A set of K/V rows addressed by one index space: index i < n_a is row a[i], otherwise row b[i - n_a].
// (The attention pool = raw window rows of the ubatch followed by the layer's compressed rows, without copying the
// compressed rows out of the sequence state.)
struct RowSource {
  const float* a = nullptr;
  int64_t n_a = 0;
  const float* b = nullptr;
  int64_t n_b = 0;
  int64_t dim = 0;  // row width (elements); rows are contiguous
  const float* row(int64_t i) const { return i < n_a ? a + i * dim : b + (i - n_a) * dim; }
};

class Ops {
 public:
  virtual ~Ops() = default;

  // ---- GEMM (task C2's kernels; the caller chooses the spec's quantization points through LinearOpts) ----------
  // y[n_tok, rows-subrange] = x[n_tok, W.cols] · Wᵀ. Row t of y depends only on row t of x (never on n_tok).
  virtual void linear(const WeightRef& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o) const = 0;

  // ---- elementwise / per-row -----------------------------------------------------------------------------------
  // x ← bf16(x).
  virtual void round_bf16(float* x, int64_t n) const = 0;
  // Embedding rows (spec §5.1): out[t, :] = float(table[ids[t], :]); table BF16 or F32 [vocab, dim].
  // Throws dsv4::Error for an id outside [0, vocab).
  virtual void embed(const WeightRef& table, const int32_t* ids, int64_t n_tok, float* out) const = 0;
  // RMSNorm with weight (spec §4.1): y = w * (x * rsqrt(mean(x²) + eps)) in fp32, bf16(y) when bf16. y may alias x.
  // x, y: [n_rows, dim]; w: [dim] fp32.
  virtual void rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16,
                       float* y) const = 0;
  // Unweighted per-head RMS of the query (spec §4.2), in place on x [n_rows, dim]. bf16: every tensor op rounds to
  // bf16 as the reference (square, mean, +eps, rsqrt, multiply); else fp32.
  virtual void head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16) const = 0;
  // Interleaved (GPT-J) RoPE on the last `rd` dims of every head (spec §4.7), in place.
  // x: [n_tok, n_heads, head_dim]; cos_sin: [n_tok, rd/2, 2] (cos, sin) fp32 for the token's position;
  // inverse: multiply by the conjugate. Pairs (x[2i], x[2i+1]) of the rotated slice are complex numbers.
  virtual void rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin,
                    bool inverse, bool bf16) const = 0;
  // In-place FP8 e4m3 "QAT" simulation (spec §4.3, act_quant inplace=True): per row of x [n_rows, row_stride],
  // columns [0, n_cols) in blocks of `block`; x ← bf16(e4m3(clamp(x/s)) · s) with s = 2^ceil(log2(max(amax,1e-4)/448)).
  virtual void fp8_sim(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block) const = 0;
  // In-place FP4 e2m1 simulation (spec §4.4, fp4_act_quant inplace=True), blocks of 32 over rows of width dim.
  virtual void fp4_sim(float* x, int64_t n_rows, int64_t dim) const = 0;
  // Walsh–Hadamard rotation (spec §4.6) of every row of x [n_rows, dim] (dim a power of two), scaled by dim^-0.5.
  virtual void hadamard(float* x, int64_t n_rows, int64_t dim, bool bf16) const = 0;

  // ---- hyper-connections (spec §5.3) -----------------------------------------------------------------------------
  // X: [n_tok, hc, dim] streams. fn: [mix, hc*dim] fp32 with mix = (2+hc)*hc; scale: [3]; base: [mix].
  // Outputs u: [n_tok, dim] (bf16 when bf16), post: [n_tok, hc], comb: [n_tok, hc, hc] (C[j][k]), fp32.
  virtual void hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                      const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u,
                      float* post, float* comb) const = 0;
  // Xout[t,k,:] = post[t,k]·f[t,:] + Σ_j comb[t,j,k]·X[t,j,:] (bf16 when bf16). Xout may alias X.
  virtual void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc,
                       int64_t dim, bool bf16, float* Xout) const = 0;
  // Final collapse (spec §5.3 hc_head): fn [hc, hc*dim], scale [1], base [hc] -> u [n_tok, dim].
  virtual void hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                       const float* base, float hc_eps, float norm_eps, bool bf16, float* u) const = 0;

  // ---- attention (spec §4.8, §5.4) -------------------------------------------------------------------------------
  // Sparse attention with a per-head sink. q: [n_tok, n_heads, dim]; kv: K = V rows; idx: [n_tok, k] indices into
  // kv (-1 = unused slot); sink: [n_heads] logits (not scaled); out: [n_tok, n_heads, dim].
  // bf16: online softmax over blocks of 64 list entries, P rounded to bf16 for the PV product, bf16 output;
  // else exact fp32 softmax. The sink only enters the denominator.
  virtual void sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const RowSource& kv,
                                const int32_t* idx, int64_t k, const float* sink, float scale, bool bf16,
                                float* out) const = 0;

  // ---- compressor (spec §5.5) ----------------------------------------------------------------------------------
  // Gated softmax pooling: out[d] = Σ_r softmax_r(s[r, d]) · kv[r, d] over n_cand candidate rows (fp32; -inf scores
  // get weight 0). kv, s: [n_cand, dim]; out: [dim].
  virtual void softmax_pool(const float* kv, const float* s, int64_t n_cand, int64_t dim, float* out) const = 0;

  // ---- lightning indexer (spec §5.6) ----------------------------------------------------------------------------
  // For each query t: score_j = Σ_h relu(q[t,h,:]·keys[j,:]) · w[t,h] over j < n_visible[t]; writes the indices of
  // the top min(topk, n_visible[t]) scores (descending; ties -> lower index first) to sel[t, :], padding with -1.
  // q: [n_tok, n_heads, dim]; keys: [n_keys, dim]; w: [n_tok, n_heads]; sel: [n_tok, topk].
  // bf16: each dot product, relu·w product and the head sum are rounded to bf16 (reference einsum in bf16).
  // Scratch is per thread and O(n_keys) (no [n_tok, n_keys] matrix).
  virtual void indexer_topk(const float* q, int64_t n_tok, int64_t n_heads, int64_t dim, const float* keys,
                            const int64_t* n_visible, const float* w, int64_t topk, bool bf16,
                            int32_t* sel) const = 0;

  // ---- MoE (spec §5.7) -------------------------------------------------------------------------------------------
  // Router: sc = sqrt(softplus(logits)) (fp32). Expert ids: hash_ids[t, :] when hash_ids != nullptr, else the top-k
  // of sc + bias (bias may be nullptr; ties -> lower id). Weights: sc[id] / Σ sc[ids] · route_scale.
  // logits: [n_tok, n_experts]; hash_ids: [n_tok, k]; ids_out: [n_tok, k]; w_out: [n_tok, k].
  virtual void route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias,
                     const int32_t* hash_ids, float route_scale, int32_t* ids_out, float* w_out) const = 0;
  // SwiGLU with clamp (spec §5.7): g = min(g, limit), up = clamp(up, -limit, limit) when limit > 0;
  // h = silu(g) · up · row_w[r] (row_w may be nullptr), bf16(h) when bf16. g, up, h: [n_rows, dim]; h may alias g.
  virtual void swiglu(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit, const float* row_w,
                      bool bf16, float* h) const = 0;
};

// The CPU implementation (OpenMP, deterministic).
const Ops& cpu_ops();

}  // namespace dsv4
