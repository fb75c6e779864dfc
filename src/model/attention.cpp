// Attention of one layer over a step (spec §5.4): low-rank query with q_norm and per-head RMS, single latent KV with
// kv_norm, partial interleaved RoPE, FP8-simulated window KV, window + compressed candidates (HCA: all visible rows;
// CSA: the indexer's top-k), sparse attention with sinks, inverse RoPE, grouped low-rank output projection; then the
// step's snapshots of the window ring and the ring update. Every sequence of the step reads and writes its own rows of
// the pool (slot ring rows, page rows) through the plan's index lists. The query, window-row, ring-store and output
// pieces are shared with the DSpark stages (dspark.cpp).
#include "core/error.h"
#include "model/model.h"

namespace dsv4 {

void Model::attn_project(const LayerResident& lp, const float* x, int64_t n, float* qr, float* kv) const {
  ops().linear_pair(lp.wq_a, lp.wkv, x, n, qr, kv, qopts());  // qr = wq_a x, kv = wkv x: one op, the same x
}

void Model::attn_query(const LayerResident& lp, float* qr, int64_t n, const float* cs, float* q) const {
  const int64_t H = cfg_.num_attention_heads, Dh = cfg_.head_dim, rd = cfg_.qk_rope_head_dim, QL = cfg_.q_lora_rank;
  const float eps = float(cfg_.rms_norm_eps);
  const bool bf = bf16();
  // qr = q_norm(qr); q = wq_b qr; per-head RMS; RoPE
  ops().rmsnorm(qr, n, QL, lp.q_norm, eps, bf, qr);
  ops().linear(lp.wq_b, qr, n, q, qopts());
  ops().head_rms_rope(q, n, H, Dh, eps, rd, cs, bf);
}

void Model::window_rows(const LayerResident& lp, float* kv, int64_t n, const float* cs, const RowCodec& kc,
                        float* kv_st, float* ring, const int32_t* ring_src, const int32_t* ring_dst,
                        int64_t n_ring) const {
  const int64_t Dh = cfg_.head_dim, rd = cfg_.qk_rope_head_dim;
  const bool bf = bf16();
  if (ring != nullptr && kc.compact()) fail("internal: window_rows stores fp32 rows only");
  // kv_norm(kv); RoPE; FP8 simulation of the nope dims (block 64) (and the ring update); the same rows as the pool
  // stores them (fp32: kv itself; compact: encoded, exact) [n, KW] words
  ops().norm_rope_fp8(kv, n, Dh, lp.kv_norm, float(cfg_.rms_norm_eps), rd, cs, bf, ring_src, ring, ring_dst,
                      ring != nullptr ? n_ring : 0);
  if (kc.compact()) ops().encode_rows(kv, n, kc, kv_st);
}

void Model::store_window(int l, StatePool& pool, const StepPlan& plan, const DevicePlan& dp, const float* kv_st,
                         bool ring_done) const {
  StatePool::LayerBuffers& lb = pool.layer(l);
  const int64_t W = cfg_.sliding_window, KW = pool.layout().kv_row.words();
  float* ring = lb.ring.as<float>();
  // snapshots of the ring at 128-aligned positions inside the step (old ring rows + this step's rows, before the
  // update), then the window ring update (after every query of the step has read the old rows)
  for (size_t i = 0; i < plan.snap_ids.size(); ++i)
    ops().gather_rows(ring, plan.n_ring, kv_st, dp.snap_ring_src + int64_t(i) * W, W, KW,
                      lb.snap_ring.as<float>() + plan.snap_ids[i] * W * KW);
  if (!plan.spec_ring_src.empty())  // verify steps: the ring rows about to be overwritten, for a rollback
    ops().scatter_rows(ring, dp.spec_ring_src, lb.spec_ring.as<float>(), dp.spec_ring_dst,
                       int64_t(plan.spec_ring_src.size()), KW);
  if (!ring_done) ops().scatter_rows(kv_st, dp.ring_src, ring, dp.ring_dst, int64_t(plan.ring_src.size()), KW);
}

void Model::attn_output(const LayerResident& lp, float* o, int64_t n, const float* cs, const int32_t* group_fwd,
                        const int32_t* group_back, float* out, bool rope_done) const {
  const int64_t H = cfg_.num_attention_heads, Dh = cfg_.head_dim, rd = cfg_.qk_rope_head_dim;
  const bool bf = bf16();
  if (!rope_done) ops().rope(o, n, H, Dh, rd, cs, true, bf);
  // grouped low-rank output projection: z_g = wo_a[g] · o_g (reference: bf16 weight, bf16 product); out = wo_b z
  const int64_t G = cfg_.o_groups, R = cfg_.o_lora_rank, Dg = cfg_.group_in_dim();
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  // (one token: token-major [1, G] and group-major [G, 1] are the same layout, no reordering copies)
  const bool one = n == 1;
  float* og = one ? o : ws.alloc<float>(n * G * Dg);   // [G, n, Dg] group-major
  float* zg = ws.alloc<float>(n * G * R);              // [G, n, R]
  float* z = one ? zg : ws.alloc<float>(n * G * R);    // [n, G*R]
  if (!one) ops().gather_rows(o, n * G, nullptr, group_fwd, n * G, Dg, og);
  LinearOpts oa;
  oa.weight_as_bf16 = bf;
  oa.out_bf16 = bf;
  ops().linear_grouped(lp.wo_a, og, n, G, zg, oa);  // group g: rows [g R, (g+1) R) of wo_a
  if (!one) ops().gather_rows(zg, n * G, nullptr, group_back, n * G, R, z);
  ops().linear(lp.wo_b, z, n, out, qopts());
}

void Model::attention(int l, StatePool& pool, const StepPlan& plan, const DevicePlan& dp, const float* x,
                      float* out) const {
  StatePool::LayerBuffers& lb = pool.layer(l);
  const LayerResident& lp = lr_[size_t(l)];
  const int64_t n = plan.n, H = cfg_.num_attention_heads, Dh = cfg_.head_dim;
  const int64_t W = cfg_.sliding_window, QL = cfg_.q_lora_rank;
  const int ratio = lp.ratio;
  const bool bf = bf16();
  const float* cs = ratio ? dp.cs_yarn : dp.cs_plain;
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);

  // The two projections of x that start the query and the window KV (one op), then two independent chains,
  // concurrently where the backend can (Ops::branch_*): the window KV and the compressor on one side; the query and
  // the indexer (which reads qr) on the other.
  float* qr = ws.alloc<float>(n * QL);        // [n, q_lora]
  float* q = ws.alloc<float>(n * H * Dh);     // [n, H, Dh]
  float* kv = ws.alloc<float>(n * Dh);        // [n, Dh] this step's window rows
  const RowCodec& kc = pool.layout().kv_row;
  const int64_t KW = kc.words();
  float* kv_st = kc.compact() ? ws.alloc<float>(n * KW) : kv;
  int32_t* sel = ratio == 4 ? ws.alloc<int32_t>(n * cfg_.index_topk) : nullptr;  // [n, topk] compressed row ids

  // One token per sequence (decode), fp32 rows, no snapshot or verify backup of the ring in this step: the ring row
  // each token overwrites holds position p - W, which no query of the step reads (window p - W + 1 .. p), so the
  // ring update goes with the window rows (one op less) instead of after the attention.
  const bool ring_early = !kc.compact() && n == int64_t(plan.pieces.size()) && plan.snap_ids.empty() &&
                          plan.spec_ring_src.empty();

  attn_project(lp, x, n, qr, kv);
  ops().branch_begin();
  // 2. window KV
  if (ring_early)
    window_rows(lp, kv, n, cs, kc, kv_st, lb.ring.as<float>(), dp.ring_src, dp.ring_dst, int64_t(plan.ring_src.size()));
  else
    window_rows(lp, kv, n, cs, kc, kv_st);
  // 3b. this layer's compressed rows (reads x and its own state only)
  if (ratio > 0) {
    CompressorPools cp;
    cp.ratio = ratio;
    cp.coff = ModelConfig::compressor_coff(ratio);
    cp.c = Dh;
    cp.k = lb.cmp_k.as<float>();
    cp.s = lb.cmp_s.as<float>();
    cp.rows = lb.comp.as<float>();
    cp.stored = kc;
    cp.snap_k = lb.snap_cmp_k.as<float>();
    cp.snap_s = lb.snap_cmp_s.as<float>();
    cp.spec_k = lb.spec_cmp_k.as<float>();
    cp.spec_s = lb.spec_cmp_s.as<float>();
    compressor(lp.cmp, cp, plan, dp, x, false);
  }
  ops().branch_end();

  // 1. query
  attn_query(lp, qr, n, cs, q);
  // 3a. CSA: the indexer's top-k compressed rows (its own compressor and key pool)
  if (ratio == 4) indexer(l, pool, plan, dp, x, qr, sel);
  ops().branch_join();

  // the compressed candidate lists
  const int32_t* comp_idx = nullptr;
  int64_t k_comp = 0, n_comp = 0;
  if (ratio == 4) {
    comp_idx = sel;
    k_comp = cfg_.index_topk;
  }
  if (ratio > 0) {
    const RatioPlan* rp = plan.ratio(ratio);
    n_comp = pool.n_pages() * rp->rpp;
    if (ratio != 4) {
      size_t ri = size_t(rp - plan.ratios.data());
      comp_idx = dp.ratios[ri].all_idx;
      k_comp = rp->k_all;
    }
  }

  // 4-7. sparse attention over [ring | fresh] window rows and the compressed rows with the inverse RoPE on its
  // output (one op); output projection
  KvRows rows{lb.ring.as<float>(), plan.n_ring, kv, n, ratio > 0 ? lb.comp.as<float>() : nullptr, n_comp, Dh, kc};
  float* o = ws.alloc<float>(n * H * Dh);     // [n, H, Dh]
  ops().sparse_attention_rope(q, n, H, rows, dp.win_idx, W, comp_idx, k_comp, lp.attn_sink,
                              float(cfg_.softmax_scale()), bf, cfg_.qk_rope_head_dim, cs, o);
  attn_output(lp, o, n, cs, dp.group_fwd, dp.group_back, out, true);

  // 8. snapshots, verify backups and the ring update
  store_window(l, pool, plan, dp, kv_st, ring_early);
}

}  // namespace dsv4
