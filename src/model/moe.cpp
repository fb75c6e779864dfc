// Mixture of experts (spec §5.7): fp32 router logits, sqrt-softplus scores, hash (tid2eid) or bias-corrected top-k
// selection, normalized weights × route scale; routed SwiGLU experts (clamped, routing weight applied before w2)
// accumulated in fp32 in ascending expert id, plus the shared expert; bf16 result in reference numerics.
#include <cstring>

#include "model/model.h"

namespace dsv4 {

void Model::moe(int l, std::span<const int32_t> tokens, const float* x, float* out) const {
  const FfnWeights& fw = w_.layers[size_t(l)].ffn;
  const LayerParams& lp = lp_[size_t(l)];
  const int64_t n = int64_t(tokens.size()), D = cfg_.hidden_size, E = cfg_.n_routed_experts;
  const int64_t k = cfg_.num_experts_per_tok;
  const bool bf = bf16();
  const LinearOpts Q = qopts();
  const float limit = float(cfg_.swiglu_limit);

  std::vector<float> logits(static_cast<size_t>(n * E));
  ops_->linear(fw.gate, x, n, logits.data(), LinearOpts{});  // fp32(x) @ fp32(gate)ᵀ
  std::vector<int32_t> hid, ids(static_cast<size_t>(n * k));
  std::vector<float> wts(static_cast<size_t>(n * k));
  if (lp.hash) {
    hid.resize(static_cast<size_t>(n * k));
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(&hid[size_t(t * k)], &lp.tid2eid[size_t(int64_t(tokens[size_t(t)]) * k)], size_t(k) * 4);
  }
  ops_->route(logits.data(), n, E, k, lp.hash || lp.gate_bias.empty() ? nullptr : lp.gate_bias.data(),
              lp.hash ? hid.data() : nullptr, float(cfg_.routed_scaling_factor), ids.data(), wts.data());

  // bucket (token, slot) pairs by expert
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(E));
  for (int64_t i = 0; i < n * k; ++i) by_expert[size_t(ids[size_t(i)])].push_back(i);

  std::vector<float> y(static_cast<size_t>(n * D), 0.0f), xe, g, up, oe, rw;
  auto run_expert = [&](const ExpertWeights& ew, int64_t ne, const float* xin, const float* row_w) {
    const int64_t inter = ew.w1.rows;
    g.resize(static_cast<size_t>(ne * inter));
    up.resize(static_cast<size_t>(ne * inter));
    oe.resize(static_cast<size_t>(ne * D));
    ops_->linear(ew.w1, xin, ne, g.data(), Q);
    ops_->linear(ew.w3, xin, ne, up.data(), Q);
    ops_->swiglu(g.data(), up.data(), ne, inter, limit, row_w, bf, g.data());
    ops_->linear(ew.w2, g.data(), ne, oe.data(), Q);
  };
  for (int64_t e = 0; e < E; ++e) {
    const auto& list = by_expert[size_t(e)];
    if (list.empty()) continue;
    const int64_t ne = int64_t(list.size());
    xe.resize(static_cast<size_t>(ne * D));
    rw.resize(static_cast<size_t>(ne));
    for (int64_t i = 0; i < ne; ++i) {
      const int64_t t = list[size_t(i)] / k;
      std::memcpy(&xe[size_t(i * D)], x + t * D, size_t(D) * 4);
      rw[size_t(i)] = wts[size_t(list[size_t(i)])];
    }
    run_expert(fw.experts[size_t(e)], ne, xe.data(), rw.data());
    for (int64_t i = 0; i < ne; ++i) {
      float* yt = &y[size_t((list[size_t(i)] / k) * D)];
      const float* o = &oe[size_t(i * D)];
      for (int64_t d = 0; d < D; ++d) yt[d] += o[d];
    }
  }
  if (fw.shared.w1.bound()) {
    run_expert(fw.shared, n, x, nullptr);
    for (int64_t i = 0; i < n * D; ++i) y[size_t(i)] += oe[size_t(i)];
  }
  if (bf) ops_->round_bf16(y.data(), n * D);
  std::memcpy(out, y.data(), size_t(n * D) * 4);
}

}  // namespace dsv4
