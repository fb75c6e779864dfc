// Lightning indexer of ratio-4 layers (spec §5.6): its own overlapping compressor (Hadamard + FP4 keys), queries
// from the q latent (wq_b, RoPE, Hadamard, FP4), per-head weights from x, score_j = Σ_h relu(q_h·k_j)·w_h over the
// visible rows j < floor((p+1)/4), top-k selection.
#include <cmath>

#include "model/model.h"

namespace dsv4 {

void Model::indexer(int l, LayerState& ls, std::span<const int64_t> pos, const float* x, const float* qr,
                    std::vector<int32_t>& sel) const {
  const IndexerWeights& iw = w_.layers[size_t(l)].attn.indexer;
  const LayerParams& lp = lp_[size_t(l)];
  const int64_t n = int64_t(pos.size()), IH = cfg_.index_n_heads, IDh = cfg_.index_head_dim;
  const int64_t rd = cfg_.qk_rope_head_dim, topk = cfg_.index_topk;
  const bool bf = bf16();
  compressor(iw.compressor, lp.idx_cmp, ls.idx_cmp, pos, x, true, rope_yarn_, ls.idx);

  std::vector<float> cs(static_cast<size_t>(n * rd));
  rope_yarn_.cos_sin(pos, cs.data());
  std::vector<float> q(static_cast<size_t>(n * IH * IDh));
  ops_->linear(iw.wq_b, qr, n, q.data(), qopts());
  ops_->rope(q.data(), n, IH, IDh, rd, cs.data(), false, bf);
  if (bf) {
    ops_->hadamard(q.data(), n * IH, IDh, true);
    ops_->fp4_sim(q.data(), n * IH, IDh);
  }
  std::vector<float> w(static_cast<size_t>(n * IH));
  LinearOpts wo;
  wo.out_bf16 = bf;  // reference: bf16 F.linear
  ops_->linear(iw.weights_proj, x, n, w.data(), wo);
  const float wscale = float(std::pow(double(IDh), -0.5) * std::pow(double(IH), -0.5));
  for (auto& v : w) v = v * wscale;
  if (bf) ops_->round_bf16(w.data(), n * IH);

  std::vector<int64_t> nvis(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) nvis[size_t(t)] = (pos[size_t(t)] + 1) / 4;
  sel.assign(static_cast<size_t>(n * topk), -1);
  ops_->indexer_topk(q.data(), n, IH, IDh, ls.idx.data(), nvis.data(), w.data(), topk, bf, sel.data());
}

}  // namespace dsv4
