// KV compressor (spec §5.5): fp32 projections k = wkv x, s = wgate x + ape[p mod m]; every window of m tokens
// (2m candidates for the overlapping ratio-4 variant) completed in this step is pooled with a per-feature softmax
// over candidates from this step's rows and the frontier state (the step plan names them); then the frontier
// advances. Emitted rows: bf16 -> RMSNorm -> RoPE at the window's first position -> FP8 simulation (attention) or
// Hadamard + FP4 simulation (indexer). Prefill and decode use the same plan, so chunking never changes the result.
#include "model/model.h"

namespace dsv4 {

void Model::compressor(const CompressorResident& w, CompressorState& cs, const StepPlan& plan, const DevicePlan& dp,
                       const float* x, bool indexer, float* rows) const {
  const RatioPlan& rp = *plan.ratio(cs.ratio);
  const DeviceRatioPlan& drp = dp.ratios[size_t(&rp - plan.ratios.data())];
  const int64_t n = plan.n, c = cs.c, width = cs.width(), rd = cfg_.qk_rope_head_dim;
  const bool bf = bf16();
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* kp = ws.alloc<float>(n * width);     // [n, coff*c]
  float* sp = ws.alloc<float>(n * width);
  ops().linear(w.wkv, x, n, kp, LinearOpts{});   // fp32 projections of fp32(x) (reference: fp32 F.linear)
  ops().linear(w.wgate, x, n, sp, LinearOpts{});
  ops().add_rows(sp, n, width, w.ape, drp.ape_row);

  const int64_t ne = rp.n_emit;
  if (ne > 0) {
    float* e = rows + rp.n_comp_before * c;     // [ne, c] appended compressed rows
    ops().compress_pool(kp, sp, n, cs.k.as<float>(), cs.s.as<float>(), drp.cand, ne, rp.coff * rp.m, rp.coff, c, e);
    if (bf) ops().round_bf16(e, ne * c);
    ops().rmsnorm(e, ne, c, w.norm, float(cfg_.rms_norm_eps), bf, e);
    ops().rope(e, ne, 1, c, rd, drp.emit_cs, false, bf);
    if (bf) {
      if (indexer) {
        ops().hadamard(e, ne, c, true);
        ops().fp4_sim(e, ne, c);
      } else {
        ops().fp8_sim(e, ne, c, c - rd, 64);
      }
    }
  }
  // the new frontier (gathered first: its sources include the old frontier rows)
  const int64_t nr = cs.rows();
  float* nk = ws.alloc<float>(nr * width);
  float* ns = ws.alloc<float>(nr * width);
  ops().gather_rows(kp, n, cs.k.as<float>(), drp.upd, nr, width, nk);
  ops().gather_rows(sp, n, cs.s.as<float>(), drp.upd, nr, width, ns);
  be_->copy_on_device(cs.k.data(), nk, size_t(nr * width) * 4);
  be_->copy_on_device(cs.s.data(), ns, size_t(nr * width) * 4);
}

}  // namespace dsv4
