// KV compressor (spec §5.5): per-token fp32 projections k = wkv x, s = wgate x + ape[p mod m], fed token by token
// into the frontier state; a window of m tokens (2m candidates for the overlapping ratio-4 variant) is pooled with a
// per-feature softmax when position p completes it ((p+1) mod m == 0). Emitted rows: bf16 -> RMSNorm -> RoPE at the
// window's first position -> FP8 simulation (attention) or Hadamard + FP4 simulation (indexer).
// Prefill and decode use the same state machine, so chunking never changes the result.
#include <cstring>

#include "model/model.h"

namespace dsv4 {

void Model::compressor(const CompressorWeights& w, const CompressorParams& p, CompressorState& cs,
                       std::span<const int64_t> pos, const float* x, bool indexer, const RopeTable& rope,
                       std::vector<float>& rows) const {
  const int64_t n = int64_t(pos.size()), m = cs.ratio, c = cs.c, coff = cs.coff, width = coff * c;
  const int64_t rd = cfg_.qk_rope_head_dim;
  const bool bf = bf16();
  std::vector<float> kp(static_cast<size_t>(n * width)), sp(static_cast<size_t>(n * width));
  ops_->linear(w.wkv, x, n, kp.data(), LinearOpts{});   // fp32 projections of fp32(x) (reference: fp32 F.linear)
  ops_->linear(w.wgate, x, n, sp.data(), LinearOpts{});
  std::vector<float> emitted, cand_k, cand_s, pooled(static_cast<size_t>(c));
  std::vector<int64_t> epos;
  if (coff == 2) {
    cand_k.resize(static_cast<size_t>(2 * m * c));
    cand_s.resize(static_cast<size_t>(2 * m * c));
  }
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pp = pos[size_t(t)], r = pp % m;
    float* st = &sp[size_t(t * width)];
    const float* ape = &p.ape[size_t(r * width)];
    for (int64_t d = 0; d < width; ++d) st[d] += ape[d];
    const int64_t row = coff == 2 ? m + r : r;
    std::memcpy(&cs.k[size_t(row * width)], &kp[size_t(t * width)], size_t(width) * 4);
    std::memcpy(&cs.s[size_t(row * width)], st, size_t(width) * 4);
    if ((pp + 1) % m != 0) continue;
    if (coff == 2) {
      // candidates: previous window's first half [0, c), current window's second half [c, 2c)
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(&cand_k[size_t(i * c)], &cs.k[size_t(i * width)], size_t(c) * 4);
        std::memcpy(&cand_s[size_t(i * c)], &cs.s[size_t(i * width)], size_t(c) * 4);
        std::memcpy(&cand_k[size_t((m + i) * c)], &cs.k[size_t((m + i) * width + c)], size_t(c) * 4);
        std::memcpy(&cand_s[size_t((m + i) * c)], &cs.s[size_t((m + i) * width + c)], size_t(c) * 4);
      }
      ops_->softmax_pool(cand_k.data(), cand_s.data(), 2 * m, c, pooled.data());
      // the current window becomes the previous one
      std::memcpy(cs.k.data(), &cs.k[size_t(m * width)], size_t(m * width) * 4);
      std::memcpy(cs.s.data(), &cs.s[size_t(m * width)], size_t(m * width) * 4);
    } else {
      ops_->softmax_pool(cs.k.data(), cs.s.data(), m, c, pooled.data());
    }
    emitted.insert(emitted.end(), pooled.begin(), pooled.end());
    epos.push_back(pp + 1 - m);
  }
  const int64_t ne = int64_t(epos.size());
  if (ne == 0) return;
  if (bf) ops_->round_bf16(emitted.data(), ne * c);
  ops_->rmsnorm(emitted.data(), ne, c, p.norm.data(), float(cfg_.rms_norm_eps), bf, emitted.data());
  std::vector<float> ecs(static_cast<size_t>(ne * rd));
  rope.cos_sin(epos, ecs.data());
  ops_->rope(emitted.data(), ne, 1, c, rd, ecs.data(), false, bf);
  if (bf) {
    if (indexer) {
      ops_->hadamard(emitted.data(), ne, c, true);
      ops_->fp4_sim(emitted.data(), ne, c);
    } else {
      ops_->fp8_sim(emitted.data(), ne, c, c - rd, 64);
    }
  }
  rows.insert(rows.end(), emitted.begin(), emitted.end());
}

}  // namespace dsv4
