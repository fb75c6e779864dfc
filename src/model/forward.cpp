// The DeepSeek V4 forward pass over one sequence (spec §5.1–§5.3, §5.8): step plan, embedding into the hc streams,
// blocks with hyper-connections, final hc_head + norm + head for the wanted rows. Attention, compressor, indexer and
// MoE live in their own files. Everything between the plan upload and the logits copy runs on the backend's device.
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
  if (st.backend != be_) fail("internal: sequence state lives on another backend");
  if (st.n_past + n > cfg_.max_position_embeddings)
    fail("context overflow: {} + {} positions exceed max_position_embeddings {}", st.n_past, n,
         cfg_.max_position_embeddings);
  for (int32_t t : tokens)
    if (t < 0 || t >= cfg_.vocab_size) fail("token id {} outside the vocabulary [0, {})", t, cfg_.vocab_size);
  std::lock_guard<std::mutex> lock(mu_);
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
  const StepPlan plan = StepPlan::build(cfg_, rope_plain_, rope_yarn_, st.n_past, tokens, want);
  st.reserve(cfg_, st.n_past + n);
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  const DevicePlan dp = DevicePlan::upload(plan, *be_, ws);

  // §5.1: e = embed[token]; X = [e, e, e, e]
  float* X = ws.alloc<float>(n * HC * D);
  ops().embed(embed_, dp.tokens, n, int(HC), X);
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) block(l, st, plan, dp, X);
  st.n_past += n;

  // §5.8 head for the requested positions, a few rows at a time (bounded scratch); one copy back per group.
  constexpr int64_t kHeadRows = 16;
  const int64_t V = cfg_.vocab_size, nl = int64_t(plan.logit_rows.size());
  for (int64_t r0 = 0; r0 < nl; r0 += kHeadRows) {
    Workspace::Scope hs(ws);
    const int64_t nr = std::min<int64_t>(kHeadRows, nl - r0);
    float* xs = ws.alloc<float>(nr * HC * D);
    ops().gather_rows(X, n, nullptr, dp.logit_rows + r0, nr, HC * D, xs);
    float* logits = ws.alloc<float>(nr * V);
    head(xs, nr, logits);
    int32_t* bad = ws.alloc<int32_t>(nr);
    ops().check_finite(logits, nr, V, bad);
    bad_host_.resize(size_t(nr));
    be_->copy_to_host(bad_host_.data(), bad, size_t(nr) * 4);
    logits_host_.resize(size_t(nr * V));
    be_->copy_to_host(logits_host_.data(), logits, size_t(nr * V) * 4);
    for (int64_t i = 0; i < nr; ++i) {
      const int64_t p = plan.logit_pos[size_t(r0 + i)];
      if (bad_host_[size_t(i)]) fail("non-finite logits at position {}", p);
      if (sink) sink(p, std::span<const float>(&logits_host_[size_t(i * V)], size_t(V)));
    }
  }
}

void Model::block(int l, SequenceState& st, const StepPlan& plan, const DevicePlan& dp, float* X) const {
  const LayerResident& p = lr_[size_t(l)];
  const int64_t n = plan.n, D = cfg_.hidden_size;
  const int HC = cfg_.hc_mult;
  const float hc_eps = float(cfg_.hc_eps), eps = float(cfg_.rms_norm_eps);
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* u = ws.alloc<float>(n * D);
  float* post = ws.alloc<float>(n * HC);
  float* comb = ws.alloc<float>(n * HC * HC);
  float* y = ws.alloc<float>(n * D);
  // §5.2 attention sublayer
  ops().hc_pre(X, n, HC, D, p.hc_attn_fn, p.hc_attn_scale, p.hc_attn_base, cfg_.hc_sinkhorn_iters, hc_eps, eps, bf16(),
               u, post, comb);
  ops().rmsnorm(u, n, D, p.attn_norm, eps, bf16(), u);
  attention(l, st.layers[size_t(l)], plan, dp, u, y);
  ops().hc_post(y, X, post, comb, n, HC, D, bf16(), X);
  // §5.2 FFN sublayer
  ops().hc_pre(X, n, HC, D, p.hc_ffn_fn, p.hc_ffn_scale, p.hc_ffn_base, cfg_.hc_sinkhorn_iters, hc_eps, eps, bf16(),
               u, post, comb);
  ops().rmsnorm(u, n, D, p.ffn_norm, eps, bf16(), u);
  moe(l, dp, n, u, y);
  ops().hc_post(y, X, post, comb, n, HC, D, bf16(), X);
}

void Model::head(const float* X, int64_t n, float* logits) const {
  const int64_t D = cfg_.hidden_size;
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* u = ws.alloc<float>(n * D);
  ops().hc_head(X, n, cfg_.hc_mult, D, hc_head_fn_, hc_head_scale_, hc_head_base_, float(cfg_.hc_eps),
                float(cfg_.rms_norm_eps), bf16(), u);
  ops().rmsnorm(u, n, D, norm_, float(cfg_.rms_norm_eps), bf16(), u);
  ops().linear(head_, u, n, logits, LinearOpts{});  // fp32 logits from the upcast bf16 head (§5.8)
}

std::vector<float> Model::logits_all(std::span<const int32_t> tokens) const {
  SequenceState st = fresh_state();
  const int64_t V = cfg_.vocab_size;
  std::vector<float> out(tokens.size() * size_t(V));
  forward(st, tokens, [](int64_t) { return true; },
          [&](int64_t p, std::span<const float> lg) { std::copy(lg.begin(), lg.end(), out.begin() + p * V); });
  return out;
}

}  // namespace dsv4
