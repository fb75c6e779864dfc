// Attention of one layer over a ubatch (spec §5.4): low-rank query with q_norm and per-head RMS, single latent KV
// with kv_norm, partial interleaved RoPE, FP8-simulated window KV, window + compressed candidates (HCA: all visible
// rows; CSA: the indexer's top-k), sparse attention with sinks, inverse RoPE, grouped low-rank output projection.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/model.h"

namespace dsv4 {

void Model::attention(int l, LayerState& ls, std::span<const int64_t> pos, const float* x, float* out) const {
  const AttentionWeights& aw = w_.layers[size_t(l)].attn;
  const LayerParams& lp = lp_[size_t(l)];
  const int64_t n = int64_t(pos.size()), H = cfg_.num_attention_heads, Dh = cfg_.head_dim;
  const int64_t rd = cfg_.qk_rope_head_dim, W = cfg_.sliding_window, QL = cfg_.q_lora_rank;
  const int ratio = lp.ratio;
  const float eps = float(cfg_.rms_norm_eps);
  const bool bf = bf16();
  const LinearOpts Q = qopts();
  const RopeTable& rope = ratio ? rope_yarn_ : rope_plain_;
  std::vector<float> cs(static_cast<size_t>(n * rd));
  rope.cos_sin(pos, cs.data());

  // 1. query: qr = q_norm(wq_a x); q = wq_b qr; per-head RMS; RoPE
  std::vector<float> qr(static_cast<size_t>(n * QL)), q(static_cast<size_t>(n * H * Dh));
  ops_->linear(aw.wq_a, x, n, qr.data(), Q);
  ops_->rmsnorm(qr.data(), n, QL, lp.q_norm.data(), eps, bf, qr.data());
  ops_->linear(aw.wq_b, qr.data(), n, q.data(), Q);
  ops_->head_rms(q.data(), n * H, Dh, eps, bf);
  ops_->rope(q.data(), n, H, Dh, rd, cs.data(), false, bf);

  // 2. window KV: kv_norm(wkv x); RoPE; FP8 simulation of the nope dims (block 64)
  std::vector<float> kv(static_cast<size_t>(n * Dh));
  ops_->linear(aw.wkv, x, n, kv.data(), Q);
  ops_->rmsnorm(kv.data(), n, Dh, lp.kv_norm.data(), eps, bf, kv.data());
  ops_->rope(kv.data(), n, 1, Dh, rd, cs.data(), false, bf);
  if (bf) ops_->fp8_sim(kv.data(), n, Dh, Dh - rd, 64);

  // 3. compressed rows (indexer first, as the reference) and the compressed candidate lists
  std::vector<int32_t> sel;
  int64_t kc = 0;
  if (ratio == 4) {
    indexer(l, ls, pos, x, qr.data(), sel);
    kc = cfg_.index_topk;
  }
  if (ratio > 0) {
    compressor(aw.compressor, lp.cmp, ls.cmp, pos, x, false, rope, ls.comp);
    if (ratio != 4) kc = (pos.back() + 1) / ratio;
  }
  const int64_t n_comp = ratio > 0 ? int64_t(ls.comp.size()) / Dh : 0;

  // 4. candidate pool: [ring (W rows) | this ubatch's kv (n rows)] then the compressed rows
  std::vector<float> win(static_cast<size_t>((W + n) * Dh));
  std::memcpy(win.data(), ls.ring.data(), size_t(W * Dh) * 4);
  std::memcpy(win.data() + W * Dh, kv.data(), size_t(n * Dh) * 4);
  const int64_t K = W + kc, p0 = pos.front();
  std::vector<int32_t> idx(static_cast<size_t>(n * K), -1);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = pos[size_t(t)];
    int32_t* row = &idx[size_t(t * K)];
    int64_t c = 0;
    for (int64_t qp = std::max<int64_t>(0, p - W + 1); qp <= p; ++qp)  // oldest -> newest
      row[c++] = int32_t(qp >= p0 ? W + (qp - p0) : qp % W);
    if (ratio == 4) {
      for (int64_t i = 0; i < kc; ++i) {
        const int32_t s = sel[size_t(t * kc + i)];
        row[W + i] = s < 0 ? -1 : int32_t(W + n + s);
      }
    } else if (ratio > 0) {
      const int64_t nv = (p + 1) / ratio;  // row j visible iff (j+1)*ratio <= p+1
      for (int64_t j = 0; j < nv; ++j) row[W + j] = int32_t(W + n + j);
    }
  }
  RowSource src{win.data(), W + n, ls.comp.data(), n_comp, Dh};

  // 5-6. sparse attention with sinks; inverse RoPE on the output
  std::vector<float> o(static_cast<size_t>(n * H * Dh));
  ops_->sparse_attention(q.data(), n, H, src, idx.data(), K, lp.attn_sink.data(), float(cfg_.softmax_scale()), bf,
                         o.data());
  ops_->rope(o.data(), n, H, Dh, rd, cs.data(), true, bf);

  // 7. grouped low-rank output projection: z_g = wo_a[g] · o_g (reference: bf16 weight, bf16 product); out = wo_b z
  const int64_t G = cfg_.o_groups, R = cfg_.o_lora_rank, Dg = cfg_.group_in_dim();
  std::vector<float> z(static_cast<size_t>(n * G * R)), xg(static_cast<size_t>(n * Dg)), zg(static_cast<size_t>(n * R));
  LinearOpts oa;
  oa.weight_as_bf16 = bf;
  oa.out_bf16 = bf;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(&xg[size_t(t * Dg)], &o[size_t(t * H * Dh + g * Dg)], size_t(Dg) * 4);
    oa.row_begin = g * R;
    oa.row_end = (g + 1) * R;
    ops_->linear(aw.wo_a, xg.data(), n, zg.data(), oa);
    for (int64_t t = 0; t < n; ++t) std::memcpy(&z[size_t(t * G * R + g * R)], &zg[size_t(t * R)], size_t(R) * 4);
  }
  ops_->linear(aw.wo_b, z.data(), n, out, Q);

  // 8. window ring update (after every query of the ubatch has read the old rows)
  for (int64_t t = std::max<int64_t>(0, n - W); t < n; ++t)
    std::memcpy(&ls.ring[size_t((pos[size_t(t)] % W) * Dh)], &kv[size_t(t * Dh)], size_t(Dh) * 4);
}

}  // namespace dsv4
