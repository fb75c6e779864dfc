// Device-neutral op interface of the DeepSeek V4 forward pass (spec §4, §5). The model (src/model/) is written once
// against `Ops`; each Backend (backend.h) provides an implementation: CpuOps (cpu_ops.h, the reference) and CudaOps
// (cuda/cuda_ops.h).
//
// Conventions (every op):
// * Every pointer lives on the backend's device. Ops are queued in order; none reads device data back to the host
//   (the two data-dependent steps of V4, indexer top-k and MoE routing, happen inside ops), so a forward step runs
//   without a host round trip until its logits are copied out.
// * Activations are fp32 buffers, row-major, with the token index outermost ([n_tok, ...]); nothing assumes
//   n_tok == 1 or a single sequence: index lists (built by the step plan, model/step_plan.h) carry positions,
//   visibility and state addressing.
// * `bf16 == true` ("reference" numerics, spec §8): the op reproduces the reference's bf16 tensor semantics — inputs
//   are already bf16-representable and every output the reference stores as bf16 is rounded to bf16 (RNE).
//   `bf16 == false` ("dense" numerics): plain fp32 math, no rounding, no quantization simulation.
// * Row t of an output depends only on row t of the inputs and the rows its index lists name (never on n_tok).
//   The CPU backend is bitwise independent of the thread count (static partitioning, fixed reduction orders).
// * Shapes are validated by the caller (the model); ops assume consistent arguments. Scratch comes from the
//   backend's Workspace.
#pragma once
#include <cstdint>

#include "backend/weight_view.h"
#include "format/row_format.h"

namespace dsv4 {

// The K = V rows one sparse_attention call reads, in three segments addressed by two index lists.
struct KvRows {
  const float* ring = nullptr;   // window rows kept from earlier steps (the sliding-window ring), stored as `stored`
  int64_t n_ring = 0;
  const float* fresh = nullptr;  // window rows computed in this step (one per token), fp32 [n_fresh, dim]
  int64_t n_fresh = 0;
  const float* comp = nullptr;   // compressed rows, stored as `stored`
  int64_t n_comp = 0;
  int64_t dim = 0;               // row width (elements); rows are contiguous
  // How ring and comp rows are stored (format/row_format.h): f32 (default; kind f32 with any dim means [*, dim]
  // floats) or a compact format (rows of stored.bytes() bytes, decoded exactly; only backends whose
  // Backend::compact_state_rows() is true receive these).
  RowCodec stored{};
  // win index i: i < n_ring -> ring[i], else fresh[i - n_ring].
};

// Rows of a paged pool as each token sees them (paged sequence state, model/state_pool.h): logical row j of token t
// is pool row  pages[table[t] + j / page_rows] * page_rows + j % page_rows  (pages == nullptr: pool row j, one
// contiguous buffer shared by every token). Pool row ids are int32; their element offsets are computed in 64 bits.
struct PagedRows {
  const float* rows = nullptr;       // the pool [*, dim]
  const int32_t* pages = nullptr;    // concatenated page tables (page ids), or nullptr (contiguous)
  const int32_t* table = nullptr;    // [n_tok] start of token t's page table in `pages` (with pages)
  int64_t page_rows = 0;             // rows per page (with pages)
  // Host hint, performance only: the longest run of consecutive tokens that share one page table (the tokens of one
  // sequence in a step); <= 0: unknown. Backends may pick tile shapes by it; results never depend on it.
  int64_t max_run = 0;
  // How the rows are stored (see KvRows::stored): f32 (default) or key_fp4.
  RowCodec stored{};
};

// One routed or shared SwiGLU expert: w2( silu(w1 x) * (w3 x) ).
struct ExpertView {
  WeightView w1, w2, w3;
};

// The experts of one MoE layer, resident on the backend's device.
struct MoeWeights {
  const ExpertView* experts = nullptr;  // host array [n_experts] of device views
  int64_t n_experts = 0;
  const void* device_table = nullptr;   // the same ExpertView array copied to the device (read by device code)
  const ExpertView* shared = nullptr;   // host pointer to the shared expert's views, or nullptr
};

// A new op is also forwarded by the op decorators' base (forwarding_ops.h: one method there) and gets a case in
// tests/backend/test_op_decorators.cpp.
class Ops {
 public:
  virtual ~Ops() = default;

  // ---- concurrency ---------------------------------------------------------------------------------------------
  // Ops queued between branch_begin() and branch_end() (the branch) may run concurrently with the ops queued after
  // branch_end(), until branch_join(); the CUDA backend runs the branch on a second stream, the CPU in queue order.
  // Both sides may read the same memory, never write what the other side reads or writes. The three calls come in
  // this order, within one Workspace::Scope (the branch's scratch stays reserved until that scope ends), not nested;
  // no copies to or from the host between branch_begin() and branch_join().
  virtual void branch_begin() const {}
  virtual void branch_end() const {}
  virtual void branch_join() const {}

  // ---- GEMM ------------------------------------------------------------------------------------------------------
  // y[n_tok, row_end-row_begin] = x[n_tok, W.cols] · W[row_begin:row_end]ᵀ with the semantics of backend/gemm.h
  // ((Q): FP8 act_quant per 128 + block-scaled product; (D): fp32 x exactly dequantized weight). x, y don't overlap.
  virtual void linear(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o) const = 0;
  // Grouped linear (the grouped output projection wo_a): for g < groups, y[g] [n_tok, R] = x[g] [n_tok, W.cols] ·
  // W[g R : (g+1) R]ᵀ with R = W.rows / groups; x [groups, n_tok, W.cols] and y [groups, n_tok, R] group-major. Each
  // group is exactly linear() with that row range (o's own row range must be the whole of W). Default: that loop.
  virtual void linear_grouped(const WeightView& W, const float* x, int64_t n_tok, int64_t groups, float* y,
                              const LinearOpts& o) const;
  // Two linears of the same x (attention's wq_a and wkv): ya = linear(Wa, x), yb = linear(Wb, x) with the same
  // options, o's row range the whole of both weights; Wa and Wb have the same cols, their rows may differ. Each
  // output is exactly its linear() (a backend may run both in one kernel: CUDA's decode steps). Default: the two calls.
  virtual void linear_pair(const WeightView& Wa, const WeightView& Wb, const float* x, int64_t n_tok, float* ya,
                           float* yb, const LinearOpts& o) const;
  // linear(W, x) and then check_finite of its rows (the head's logits): bad[t] = 1 if row t of y holds a NaN or inf,
  // else 0. Default: the two ops; the CPU checks each part of y on the thread that computed it, in the product's
  // parallel region.
  virtual void linear_check_finite(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o,
                                   int32_t* bad) const;

  // ---- elementwise / per-row -----------------------------------------------------------------------------------
  // x <- value.
  virtual void fill(float* x, int64_t n, float value) const = 0;
  // x <- bf16(x).
  virtual void round_bf16(float* x, int64_t n) const = 0;
  // x <- x * alpha (fp32), then bf16 when bf16.
  virtual void scale(float* x, int64_t n, float alpha, bool bf16) const = 0;
  // Embedding rows (spec §5.1), repeated into `copies` streams: out[t, c, :] = float(table[ids[t], :]) for every
  // c < copies. table: BF16 or F32 [vocab, dim]; ids are in [0, vocab) (checked by the caller).
  virtual void embed(const WeightView& table, const int32_t* ids, int64_t n_tok, int copies, float* out) const = 0;
  // RMSNorm with weight (spec §4.1): y = w * (x * rsqrt(mean(x²) + eps)) in fp32, bf16(y) when bf16. y may alias x.
  // x, y: [n_rows, dim]; w: [dim] fp32 (nullptr: no weight).
  virtual void rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16,
                       float* y) const = 0;
  // Unweighted per-head RMS of the query (spec §4.2), in place on x [n_rows, dim]. bf16: every tensor op rounds to
  // bf16 as the reference (square, mean, +eps, rsqrt, multiply); else fp32.
  virtual void head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16) const = 0;
  // Interleaved (GPT-J) RoPE on the last `rd` dims of every head (spec §4.7), in place.
  // x: [n_tok, n_heads, head_dim]; cos_sin: [n_tok, rd/2, 2] (cos, sin) fp32 of the token's position (step plan);
  // inverse: multiply by the conjugate. Pairs (x[2i], x[2i+1]) of the rotated slice are complex numbers.
  virtual void rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin,
                    bool inverse, bool bf16) const = 0;
  // head_rms of every head of x [n_tok, n_heads, head_dim], then the forward rope of its last rd dims (the query
  // after wq_b): the two ops' result (a backend may run them as one kernel: CUDA). Default: the two calls.
  virtual void head_rms_rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, float eps, int64_t rd,
                             const float* cos_sin, bool bf16) const {
    head_rms(x, n_tok * n_heads, head_dim, eps, bf16);
    rope(x, n_tok, n_heads, head_dim, rd, cos_sin, false, bf16);
  }
  // The window KV rows (spec §5.4): rmsnorm(x, w, eps) in place over rows x [n_rows, dim], then the forward rope of
  // each row's last rd dims (one head per row; cos_sin [n_rows, rd/2, 2]), then, when bf16, fp8_sim of its first
  // dim - rd columns in blocks of 64, then scatter_rows(x, store_src, store, store_dst, n_store, dim) (n_store = 0:
  // none; store_src[i] in [0, n_rows)): the ops' result (a backend may run them as one kernel: CUDA's decode steps).
  virtual void norm_rope_fp8(float* x, int64_t n_rows, int64_t dim, const float* w, float eps, int64_t rd,
                             const float* cos_sin, bool bf16, const int32_t* store_src = nullptr,
                             float* store = nullptr, const int32_t* store_dst = nullptr, int64_t n_store = 0) const {
    rmsnorm(x, n_rows, dim, w, eps, bf16, x);
    rope(x, n_rows, 1, dim, rd, cos_sin, false, bf16);
    if (bf16) fp8_sim(x, n_rows, dim, dim - rd, 64);
    if (n_store > 0) scatter_rows(x, store_src, store, store_dst, n_store, dim);
  }
  // The indexer's query and key rows in reference numerics (spec §5.6): the forward rope (bf16) of the last rd dims
  // of every head of x [n_tok, n_heads, dim], then hadamard (bf16) and fp4_sim of every head row: the three ops'
  // result (a backend may run them as one kernel: CUDA).
  virtual void rope_hadamard_fp4(float* x, int64_t n_tok, int64_t n_heads, int64_t dim, int64_t rd,
                                 const float* cos_sin) const {
    rope(x, n_tok, n_heads, dim, rd, cos_sin, false, true);
    hadamard(x, n_tok * n_heads, dim, true);
    fp4_sim(x, n_tok * n_heads, dim);
  }
  // In-place FP8 e4m3 "QAT" simulation (spec §4.3, act_quant inplace=True): per row of x [n_rows, row_stride],
  // columns [0, n_cols) in blocks of `block`; x <- bf16(e4m3(clamp(x/s)) · s) with s = 2^ceil(log2(max(amax,1e-4)/448)).
  virtual void fp8_sim(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block) const = 0;
  // In-place FP4 e2m1 simulation (spec §4.4, fp4_act_quant inplace=True), blocks of 32 over rows of width dim.
  virtual void fp4_sim(float* x, int64_t n_rows, int64_t dim) const = 0;
  // Walsh–Hadamard rotation (spec §4.6) of every row of x [n_rows, dim] (dim a power of two), scaled by dim^-0.5.
  virtual void hadamard(float* x, int64_t n_rows, int64_t dim, bool bf16) const = 0;
  // Non-finite check of the logits: bad[r] = 1 if row r of x [n_rows, dim] holds a NaN or inf, else 0.
  virtual void check_finite(const float* x, int64_t n_rows, int64_t dim, int32_t* bad) const = 0;

  // ---- rows ------------------------------------------------------------------------------------------------------
  // out[i, :] = src(idx[i]) for i < n, where src(j) = a[j, :] for j < n_a, else b[j - n_a, :] (rows of width dim).
  // out must not overlap a or b.
  virtual void gather_rows(const float* a, int64_t n_a, const float* b, const int32_t* idx, int64_t n, int64_t dim,
                           float* out) const = 0;
  // dst[dst_idx[i], :] = src[src_idx[i], :] for i < n (distinct destinations; src and dst do not overlap).
  virtual void scatter_rows(const float* src, const int32_t* src_idx, float* dst, const int32_t* dst_idx, int64_t n,
                            int64_t dim) const = 0;
  // x[t, :] += table[rows[t], :] for t < n (rows of width dim).
  virtual void add_rows(float* x, int64_t n, int64_t dim, const float* table, const int32_t* rows) const = 0;
  // The compressor's frontier update (spec §5.5) of both of its state arrays. Sources in the state index space:
  // src_k(j) = kv[j] for j < n_tok, else state_kv[j - n_tok] (src_s likewise from score and state_score). When ape is
  // not nullptr, first score[t] += ape[ape_row[t]] for t < n_tok (add_rows). Then state_kv[dst[i]] = src_k(idx[i])
  // and state_score[dst[i]] = src_s(idx[i]) for i < n, every source row read before any row is written (sources may
  // be rows that change): gather_rows of both into scratch, then scatter_rows back, in one op (CUDA: one kernel at
  // decode). Rows of width dim; distinct destinations.
  virtual void frontier_update(const float* kv, float* score, int64_t n_tok, const float* ape, const int32_t* ape_row,
                               float* state_kv, float* state_score, const int32_t* idx, const int32_t* dst, int64_t n,
                               int64_t dim) const = 0;
  // Encode rows into a compact state row format (format/row_format.h): out row r (c.words() 4-byte words, moved
  // afterwards with gather_rows / scatter_rows of that width) = encode_row(c, x[r, 0..c.dim)). x: [n, c.dim].
  // Only backends whose Backend::compact_state_rows() is true implement it (the default throws); debug builds of
  // the CPU backend fail on a row that is not exactly representable.
  virtual void encode_rows(const float* x, int64_t n, const RowCodec& c, float* out) const;

  // ---- hyper-connections (spec §5.3) -----------------------------------------------------------------------------
  // X: [n_tok, hc, dim] streams. fn: [mix, hc*dim] fp32 with mix = (2+hc)*hc; scale: [3]; base: [mix].
  // Outputs u: [n_tok, dim] (bf16 when bf16), post: [n_tok, hc], comb: [n_tok, hc, hc] (C[j][k]), fp32.
  virtual void hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                      const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u,
                      float* post, float* comb) const = 0;
  // hc_pre, then u = rmsnorm(u) with the sublayer's norm weight norm_w [dim] and eps norm_eps: how every sublayer
  // starts. The result is the two ops' (a backend may run them as one kernel: CUDA's decode steps).
  virtual void hc_pre_norm(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                           const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16,
                           const float* norm_w, float* u, float* post, float* comb) const {
    hc_pre(X, n_tok, hc, dim, fn, scale, base, sinkhorn_iters, hc_eps, norm_eps, bf16, u, post, comb);
    rmsnorm(u, n_tok, dim, norm_w, norm_eps, bf16, u);
  }
  // Xout[t,k,:] = post[t,k]·f[t,:] + Σ_j comb[t,j,k]·X[t,j,:] (bf16 when bf16). Xout may alias X.
  virtual void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc,
                       int64_t dim, bool bf16, float* Xout) const = 0;
  // Final collapse (spec §5.3 hc_head): fn [hc, hc*dim], scale [1], base [hc] -> u [n_tok, dim].
  virtual void hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                       const float* base, float hc_eps, float norm_eps, bool bf16, float* u) const = 0;

  // ---- attention (spec §4.8, §5.4) -------------------------------------------------------------------------------
  // Sparse attention with a per-head sink. q: [n_tok, n_heads, kv.dim]; out: [n_tok, n_heads, kv.dim].
  // The candidate list of token t is win_idx[t, 0..k_win) (see KvRows) followed by comp_idx[t, 0..k_comp) (rows of
  // kv.comp); -1 = unused slot. sink: [n_heads] logits (not scaled).
  // bf16: online softmax over blocks of 64 entries of the concatenated list, P rounded to bf16 for the PV product,
  // bf16 output; else the same blocked online softmax in fp32. The sink only enters the denominator. A token with
  // no valid entry gets a zero output.
  virtual void sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv,
                                const int32_t* win_idx, int64_t k_win, const int32_t* comp_idx, int64_t k_comp,
                                const float* sink, float scale, bool bf16, float* out) const = 0;

  // sparse_attention, then the inverse rope of the last rd dims of every head of out with cos_sin [n_tok, rd/2, 2]
  // (how the attention output enters wo_a): the two ops' result (a backend may rotate inside the attention's last
  // kernel: CUDA's decode steps).
  virtual void sparse_attention_rope(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv,
                                     const int32_t* win_idx, int64_t k_win, const int32_t* comp_idx, int64_t k_comp,
                                     const float* sink, float scale, bool bf16, int64_t rd, const float* cos_sin,
                                     float* out) const {
    sparse_attention(q, n_tok, n_heads, kv, win_idx, k_win, comp_idx, k_comp, sink, scale, bf16, out);
    rope(out, n_tok, n_heads, kv.dim, rd, cos_sin, true, bf16);
  }

  // ---- compressor (spec §5.5) ----------------------------------------------------------------------------------
  // Gated softmax pooling of n_emit compressed rows. Rows of width coff*c come from two sources: this step's
  // projections kv/score [n_tok, coff*c] and the compressor frontier state_kv/state_score [*, coff*c]; candidate j of
  // emitted row e is row cand[e, j] of [kv | state] (index < n_tok: this step, else state row index - n_tok;
  // -1: an empty slot, score -inf). coff == 2 (overlapping, ratio 4): candidates j < n_cand/2 read columns [0, c) of
  // their row, the others [c, 2c); coff == 1: columns [0, c).
  // out[e, d] = Σ_j softmax_j(score_j[d]) · kv_j[d] (fp32, in candidate order; -inf scores weigh 0). out: [n_emit, c].
  virtual void compress_pool(const float* kv, const float* score, int64_t n_tok, const float* state_kv,
                             const float* state_score, const int32_t* cand, int64_t n_emit, int64_t n_cand, int coff,
                             int64_t c, float* out) const = 0;

  // ---- lightning indexer (spec §5.6) ----------------------------------------------------------------------------
  // For each query t: score_j = Σ_h relu(q[t,h,:]·key_t(j)) · w[t,h] over the logical key rows j < n_visible[t] of
  // token t (key_t(j): row j of `keys` as token t sees it, PagedRows); selects the top min(topk, n_visible[t])
  // scores (descending; ties -> lower logical index j first) and writes their POOL row ids (keys.pages == nullptr:
  // j itself) to sel[t, :] in that order, padding with -1. The selection and its order depend only on the scores
  // and the logical indices, never on where the pages lie.
  // q: [n_tok, n_heads, dim]; w: [n_tok, n_heads]; n_visible: [n_tok]; max_visible >= every n_visible[t] (known to
  // the host from positions; sizes device scratch). sel: [n_tok, topk]. bf16: each dot product, relu·w product and
  // the head sum are rounded to bf16 (reference einsum in bf16).
  virtual void indexer_topk(const float* q, int64_t n_tok, int64_t n_heads, int64_t dim, const PagedRows& keys,
                            const int32_t* n_visible, int64_t max_visible, const float* w, int64_t topk,
                            bool bf16, int32_t* sel) const = 0;

  // ---- MoE (spec §5.7) -------------------------------------------------------------------------------------------
  // Router: sc = sqrt(softplus(logits)) (fp32). Expert ids: tid2eid[tokens[t], :] when tid2eid != nullptr (hash
  // layers; table [vocab, k] of valid ids), else the top-k of sc + bias (bias may be nullptr; ties -> lower id).
  // Weights: sc[id] / Σ sc[ids] · route_scale. logits: [n_tok, n_experts]; ids_out, w_out: [n_tok, k].
  virtual void route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias,
                     const int32_t* tid2eid, const int32_t* tokens, float route_scale, int32_t* ids_out,
                     float* w_out) const = 0;
  // SwiGLU with clamp (spec §5.7): g = min(g, limit), up = clamp(up, -limit, limit) when limit > 0;
  // h = silu(g) · up · row_w[r] (row_w may be nullptr), bf16(h) when bf16. g, up, h: [n_rows, dim]; h may alias g.
  virtual void swiglu(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit, const float* row_w,
                      bool bf16, float* h) const = 0;
  // Routed + shared experts (spec §5.7): for every token t, each slot i < k runs expert ids[t, i] on x[t]:
  //   g = w1 x, up = w3 x (linear with `q`), h = swiglu(g, up, limit, wts[t, i]) (bf16 when bf16), o = w2 h (`q`);
  // y[t] = Σ o over the slots in ascending (expert id, slot) order, then + the shared expert's o (no weight), all
  // fp32; bf16(y) when bf16. x, y: [n_tok, D]; ids, wts: [n_tok, k].
  virtual void moe(const MoeWeights& w, const float* x, int64_t n_tok, const int32_t* ids, const float* wts, int64_t k,
                   float swiglu_limit, const LinearOpts& q, bool bf16, float* y) const = 0;

  // route, then moe with the ids and weights it wrote (ids, wts: [n_tok, k], outputs as route writes them; y: moe's
  // output), for a layer whose experts are all on the device. A backend may compute the routing inside the MoE's
  // dispatch (CUDA's decode steps: one kernel routes and plans). Default: the two calls.
  virtual void route_moe(const float* logits, int64_t n_experts, const float* bias, const int32_t* tid2eid,
                         const int32_t* tokens, float route_scale, const MoeWeights& w, const float* x, int64_t n_tok,
                         int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, int32_t* ids, float* wts,
                         float* y) const {
    route(logits, n_tok, n_experts, k, bias, tid2eid, tokens, route_scale, ids, wts);
    moe(w, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, y);
  }

  // ---- MoE split between the device and the host (model/split_moe.h) ---------------------------------------------
  // The two halves of `moe` for a layer whose routed experts are partly elsewhere (on the host CPU). Device half:
  // for every pair p = t * k + i whose expert is resident (resident[ids[p]] != 0; resident: [n_experts] bytes on
  // the device), o_pairs[p, :] = that expert's o for the pair, exactly as `moe` computes it (rows of the other
  // pairs are left untouched); the shared expert's o [n_tok, D] goes to o_shared (when w.shared and o_shared).
  // Experts whose views are unbound (w == nullptr) must not be marked resident; their shapes must still be set.
  virtual void moe_resident(const MoeWeights& w, const uint8_t* resident, const float* x, int64_t n_tok,
                            const int32_t* ids, const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q,
                            bool bf16, float* o_pairs, float* o_shared) const = 0;
  // The combine of `moe` over per-pair rows: y[t] = Σ o_pairs[t * k + i] over the slots in ascending (ids, slot)
  // order from 0, then + o_shared[t] (nullptr: none), fp32; bf16(y) when bf16. o_pairs: [n_tok * k, D].
  virtual void moe_combine(const float* o_pairs, const int32_t* ids, int64_t n_tok, int64_t k, int64_t D,
                           const float* o_shared, bool bf16, float* y) const = 0;
};

}  // namespace dsv4
