// The DeepSeek V4 forward pass over one sequence (spec §5.1–§5.3, §5.8): embedding, stream expansion, blocks with
// hyper-connections, final hc_head + norm + head. Attention, compressor, indexer and MoE live in their own files.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/model.h"

namespace dsv4 {

void Model::forward(SequenceState& st, std::span<const int32_t> tokens, const std::function<bool(int64_t)>& want_logits,
                    const LogitsSink& sink) const {
  const int64_t n = int64_t(tokens.size());
  if (n == 0) return;
  if (st.layers.size() != size_t(cfg_.num_hidden_layers)) fail("internal: sequence state does not match the model");
  if (st.n_past + n > cfg_.max_position_embeddings)
    fail("context overflow: {} + {} positions exceed max_position_embeddings {}", st.n_past, n,
         cfg_.max_position_embeddings);
  for (int32_t t : tokens)
    if (t < 0 || t >= cfg_.vocab_size) fail("token id {} outside the vocabulary [0, {})", t, cfg_.vocab_size);
  for (int64_t i = 0; i < n;) {
    const int64_t m = std::min(opts_.ubatch, n - i);
    std::vector<char> want(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) want[size_t(j)] = want_logits ? char(want_logits(st.n_past + j)) : 0;
    forward_ubatch(st, tokens.subspan(static_cast<size_t>(i), size_t(m)), want, sink);
    i += m;
  }
}

void Model::forward_ubatch(SequenceState& st, std::span<const int32_t> tokens, const std::vector<char>& want,
                           const LogitsSink& sink) const {
  const int64_t n = int64_t(tokens.size()), D = cfg_.hidden_size, HC = cfg_.hc_mult;
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[size_t(t)] = st.n_past + t;
  // §5.1: e = embed[token]; X = [e, e, e, e]
  std::vector<float> e(static_cast<size_t>(n * D));
  ops_->embed(w_.embed, tokens.data(), n, e.data());
  std::vector<float> X(static_cast<size_t>(n * HC * D));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < HC; ++j) std::memcpy(&X[size_t((t * HC + j) * D)], &e[size_t(t * D)], size_t(D) * 4);
  e = {};
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) block(l, st, tokens, pos, X);
  st.n_past += n;

  // §5.8 head for the requested positions, a few rows at a time (bounded scratch).
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < n; ++t)
    if (want[size_t(t)]) rows.push_back(t);
  constexpr int64_t kHeadRows = 16;
  const int64_t V = cfg_.vocab_size;
  std::vector<float> xs, logits;
  for (size_t r0 = 0; r0 < rows.size(); r0 += kHeadRows) {
    const int64_t nr = std::min<int64_t>(kHeadRows, int64_t(rows.size() - r0));
    xs.resize(static_cast<size_t>(nr * HC * D));
    for (int64_t i = 0; i < nr; ++i)
      std::memcpy(&xs[size_t(i * HC * D)], &X[size_t(rows[r0 + size_t(i)] * HC * D)], size_t(HC * D) * 4);
    logits.resize(static_cast<size_t>(nr * V));
    head(xs.data(), nr, logits.data());
    for (int64_t i = 0; i < nr; ++i) {
      std::span<const float> lg(&logits[size_t(i * V)], size_t(V));
      const int64_t p = pos[size_t(rows[r0 + size_t(i)])];
      for (float v : lg)
        if (!std::isfinite(v)) fail("non-finite logits at position {}", p);
      if (sink) sink(p, lg);
    }
  }
}

void Model::block(int l, SequenceState& st, std::span<const int32_t> tokens, std::span<const int64_t> pos,
                  std::vector<float>& X) const {
  const LayerParams& p = lp_[size_t(l)];
  const int64_t n = int64_t(pos.size()), D = cfg_.hidden_size;
  const int HC = cfg_.hc_mult;
  const float hc_eps = float(cfg_.hc_eps), eps = float(cfg_.rms_norm_eps);
  std::vector<float> u(static_cast<size_t>(n * D)), post(static_cast<size_t>(n * HC)), comb(static_cast<size_t>(n * HC * HC)), y(static_cast<size_t>(n * D));
  // §5.2 attention sublayer
  ops_->hc_pre(X.data(), n, HC, D, p.hc_attn_fn.data(), p.hc_attn_scale.data(), p.hc_attn_base.data(),
               cfg_.hc_sinkhorn_iters, hc_eps, eps, bf16(), u.data(), post.data(), comb.data());
  ops_->rmsnorm(u.data(), n, D, p.attn_norm.data(), eps, bf16(), u.data());
  attention(l, st.layers[size_t(l)], pos, u.data(), y.data());
  ops_->hc_post(y.data(), X.data(), post.data(), comb.data(), n, HC, D, bf16(), X.data());
  // §5.2 FFN sublayer
  ops_->hc_pre(X.data(), n, HC, D, p.hc_ffn_fn.data(), p.hc_ffn_scale.data(), p.hc_ffn_base.data(),
               cfg_.hc_sinkhorn_iters, hc_eps, eps, bf16(), u.data(), post.data(), comb.data());
  ops_->rmsnorm(u.data(), n, D, p.ffn_norm.data(), eps, bf16(), u.data());
  moe(l, tokens, u.data(), y.data());
  ops_->hc_post(y.data(), X.data(), post.data(), comb.data(), n, HC, D, bf16(), X.data());
}

void Model::head(const float* X, int64_t n, float* logits) const {
  const int64_t D = cfg_.hidden_size;
  std::vector<float> u(static_cast<size_t>(n * D));
  ops_->hc_head(X, n, cfg_.hc_mult, D, hc_head_fn_.data(), hc_head_scale_.data(), hc_head_base_.data(),
                float(cfg_.hc_eps), float(cfg_.rms_norm_eps), bf16(), u.data());
  ops_->rmsnorm(u.data(), n, D, norm_.data(), float(cfg_.rms_norm_eps), bf16(), u.data());
  ops_->linear(w_.head, u.data(), n, logits, LinearOpts{});  // fp32 logits from the upcast bf16 head (§5.8)
}

std::vector<float> Model::logits_all(std::span<const int32_t> tokens) const {
  SequenceState st = SequenceState::fresh(cfg_);
  const int64_t V = cfg_.vocab_size;
  std::vector<float> out(tokens.size() * size_t(V));
  forward(st, tokens, [](int64_t) { return true; },
          [&](int64_t p, std::span<const float> lg) { std::copy(lg.begin(), lg.end(), out.begin() + p * V); });
  return out;
}

}  // namespace dsv4
