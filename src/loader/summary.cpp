#include "loader/summary.h"

namespace dsv4 {

namespace {
bool ends_with(const std::string& s, std::string_view suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
}  // namespace

int64_t tensor_params(const TensorInfo& t) {
  if (ends_with(t.name, ".scale")) return 0;
  return t.dtype == DType::I8 ? 2 * t.numel() : t.numel();
}

CheckpointSummary summarize(const SafetensorsSet& set, const ModelConfig& cfg, const ModelWeights& w) {
  CheckpointSummary s;
  s.n_tensors = set.tensors().size();
  s.n_files = set.files().size();
  for (const auto& t : set.tensors()) {
    const bool mtp = t.name.rfind("mtp.", 0) == 0;
    const int64_t p = tensor_params(t);
    (mtp ? s.params_mtp : s.params_main) += p;
    s.bytes_total += t.nbytes;
    if (!mtp) s.bytes_main += t.nbytes;
    s.bytes_by_dtype[std::string(dtype_name(t.dtype))] += t.nbytes;
  }
  s.params_total = s.params_main + s.params_mtp;
  for (const auto& L : w.layers)
    for (const auto& e : L.ffn.experts) s.params_routed += e.w1.numel() + e.w2.numel() + e.w3.numel();
  s.params_active = s.params_main - s.params_routed +
                    (cfg.n_routed_experts > 0 ? s.params_routed / cfg.n_routed_experts * cfg.num_experts_per_tok : 0);
  for_each_weight(w, [&](const WeightRef& r) { s.weights_by_format[weight_format_name(r.fmt)] += 1; });
  return s;
}

}  // namespace dsv4
