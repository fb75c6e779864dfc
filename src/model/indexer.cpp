// Lightning indexer of ratio-4 layers (spec §5.6): its own overlapping compressor (Hadamard + FP4 keys), queries
// from the q latent (wq_b, RoPE, Hadamard, FP4), per-head weights from x, score_j = Σ_h relu(q_h·k_j)·w_h over the
// visible rows j < floor((p+1)/4) of the token's own sequence (paged keys), top-k selection as pool row ids (inside
// the op: no host round trip).
#include <cmath>

#include "model/model.h"

namespace dsv4 {

void Model::indexer(int l, StatePool& pool, const StepPlan& plan, const DevicePlan& dp, const float* x,
                    const float* qr, int32_t* sel) const {
  const LayerResident& lp = lr_[size_t(l)];
  const int64_t n = plan.n, IH = cfg_.index_n_heads, IDh = cfg_.index_head_dim;
  const int64_t rd = cfg_.qk_rope_head_dim, topk = cfg_.index_topk;
  const bool bf = bf16();
  StatePool::LayerBuffers& lb = pool.layer(l);
  CompressorPools cp;
  cp.ratio = 4;
  cp.coff = 2;
  cp.c = IDh;
  cp.k = lb.idx_k.as<float>();
  cp.s = lb.idx_s.as<float>();
  cp.rows = lb.keys.as<float>();
  cp.stored = pool.layout().key_row;
  cp.snap_k = lb.snap_idx_k.as<float>();
  cp.snap_s = lb.snap_idx_s.as<float>();
  cp.spec_k = lb.spec_idx_k.as<float>();
  cp.spec_s = lb.spec_idx_s.as<float>();
  compressor(lp.idx_cmp, cp, plan, dp, x, true);
  const RatioPlan& rp = *plan.ratio(4);
  const DeviceRatioPlan& drp = dp.ratios[size_t(&rp - plan.ratios.data())];

  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* q = ws.alloc<float>(n * IH * IDh);   // [n, IH, IDh]
  ops().linear(lp.idx_wq_b, qr, n, q, qopts());
  if (bf)
    ops().rope_hadamard_fp4(q, n, IH, IDh, rd, dp.cs_yarn);  // rope, hadamard, fp4_sim
  else
    ops().rope(q, n, IH, IDh, rd, dp.cs_yarn, false, bf);
  float* w = ws.alloc<float>(n * IH);         // [n, IH]
  LinearOpts wo;
  wo.out_bf16 = bf;  // reference: bf16 F.linear
  wo.x_bf16 = bf;
  ops().linear(lp.idx_weights_proj, x, n, w, wo);
  const float wscale = float(std::pow(double(IDh), -0.5) * std::pow(double(IH), -0.5));
  ops().scale(w, n * IH, wscale, bf);
  PagedRows keys;
  keys.rows = lb.keys.as<float>();
  keys.pages = drp.key_pages;
  keys.table = drp.key_table;
  keys.page_rows = rp.rpp;
  keys.max_run = rp.max_run;
  keys.stored = pool.layout().key_row;
  // recorded steps pass the bucket of max_visible (StepPlan::shape_key); the selection is the same
  const int64_t mv = graphs_ ? StepPlan::visible_bucket(rp.max_visible) : rp.max_visible;
  ops().indexer_topk(q, n, IH, IDh, keys, drp.n_visible, mv, w, topk, bf, sel);  // pool rows
}

}  // namespace dsv4
