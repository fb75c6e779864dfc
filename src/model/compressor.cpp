// KV compressor (spec §5.5): fp32 projections k = wkv x, s = wgate x + ape[p mod m]; every window of m tokens
// (2m candidates for the overlapping ratio-4 variant) completed in this step is pooled with a per-feature softmax
// over candidates from this step's rows and the frontier state (the step plan names them); then the frontier
// advances. Emitted rows: bf16 -> RMSNorm -> RoPE at the window's first position -> FP8 simulation (attention) or
// Hadamard + FP4 simulation (indexer), then scattered to their page rows. Prefill and decode use the same plan, so
// chunking never changes the result; several sequences per step pool only their own candidates.
#include "model/model.h"

namespace dsv4 {

void Model::compressor(const CompressorResident& w, const CompressorPools& cp, const StepPlan& plan,
                       const DevicePlan& dp, const float* x, bool indexer) const {
  const RatioPlan& rp = *plan.ratio(cp.ratio);
  const DeviceRatioPlan& drp = dp.ratios[size_t(&rp - plan.ratios.data())];
  const int64_t n = plan.n, c = cp.c, width = int64_t(cp.coff) * c, rd = cfg_.qk_rope_head_dim;
  const bool bf = bf16();
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* kp = ws.alloc<float>(n * width);     // [n, coff*c]
  float* sp = ws.alloc<float>(n * width);
  ops().linear(w.wkv, x, n, kp, bf16_weight_opts());   // fp32 projections of fp32(x) (reference: fp32 F.linear)
  ops().linear(w.wgate, x, n, sp, bf16_weight_opts());
  // s += ape[p mod m]: here when this step reads s before the frontier update (pooling, snapshots, verify backups),
  // else inside the update (the same sums)
  const int64_t ne = rp.n_emit;
  const bool ape_in_update = ne == 0 && (rp.coff != 2 || plan.snap_ids.empty()) && rp.sp_src.empty();
  if (!ape_in_update) ops().add_rows(sp, n, width, w.ape, drp.ape_row);

  if (ne > 0) {
    Workspace::Scope es(ws);
    float* e = ws.alloc<float>(ne * c);         // [ne, c] the rows completed in this step
    ops().compress_pool(kp, sp, n, cp.k, cp.s, drp.cand, ne, rp.nr, rp.coff, c, e);
    if (bf) ops().round_bf16(e, ne * c);
    const float eps = float(cfg_.rms_norm_eps);
    if (indexer) {
      ops().rmsnorm(e, ne, c, w.norm, eps, bf, e);
      if (bf)
        ops().rope_hadamard_fp4(e, ne, 1, c, rd, drp.emit_cs);
      else
        ops().rope(e, ne, 1, c, rd, drp.emit_cs, false, bf);
    } else {
      ops().norm_rope_fp8(e, ne, c, w.norm, eps, rd, drp.emit_cs, bf);  // rmsnorm, rope, fp8_sim (bf16)
    }
    if (cp.stored.compact()) {  // stored compactly (exact: the rows are simulated above)
      float* st = ws.alloc<float>(ne * cp.stored.words());  // [ne, words]
      ops().encode_rows(e, ne, cp.stored, st);
      ops().scatter_rows(st, dp.iota, cp.rows, drp.emit_dst, ne, cp.stored.words());  // to their page rows
    } else {
      ops().scatter_rows(e, dp.iota, cp.rows, drp.emit_dst, ne, c);  // to their page rows
    }
  }
  // snapshots: frontier rows [0, m) at each 128-aligned position of the step (ratio 4; read before the update)
  if (rp.coff == 2)
    for (size_t i = 0; i < plan.snap_ids.size(); ++i) {
      const int64_t id = plan.snap_ids[i], m = rp.m;
      ops().gather_rows(kp, n, cp.k, drp.snap_src + int64_t(i) * m, m, width, cp.snap_k + id * m * width);
      ops().gather_rows(sp, n, cp.s, drp.snap_src + int64_t(i) * m, m, width, cp.snap_s + id * m * width);
    }
  // verify steps: the frontier rows about to change and the step's projections, for a rollback
  if (!rp.bk_src.empty()) {
    ops().scatter_rows(cp.k, drp.bk_src, cp.spec_k, drp.bk_dst, int64_t(rp.bk_src.size()), width);
    ops().scatter_rows(cp.s, drp.bk_src, cp.spec_s, drp.bk_dst, int64_t(rp.bk_src.size()), width);
  }
  if (!rp.sp_src.empty()) {
    ops().scatter_rows(kp, drp.sp_src, cp.spec_k, drp.sp_dst, int64_t(rp.sp_src.size()), width);
    ops().scatter_rows(sp, drp.sp_src, cp.spec_s, drp.sp_dst, int64_t(rp.sp_src.size()), width);
  }
  // the new frontiers of the step's slots (their sources include the old frontier rows)
  ops().frontier_update(kp, sp, n, ape_in_update ? w.ape : nullptr, drp.ape_row, cp.k, cp.s, drp.upd, drp.upd_dst,
                        int64_t(rp.upd.size()), width);
}

}  // namespace dsv4
