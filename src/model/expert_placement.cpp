#include "model/expert_placement.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_depth.h"

namespace dsv4 {

namespace {
double gib(double b) { return b / double(uint64_t(1) << 30); }
}  // namespace

ExpertProfile read_expert_profile(const std::filesystem::path& file) {
  std::ifstream f(file);
  if (!f) fail("--hot-experts {}: cannot open the file", file.string());
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  if (json_nesting_exceeds(text, kMaxJsonRequestDepth))
    fail("--hot-experts {}: not JSON (nested deeper than {} levels)", file.string(), kMaxJsonRequestDepth);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail("--hot-experts {}: not JSON ({})", file.string(), e.what());
  }
  if (!j.is_object() || j.value("format", "") != "dsv4-expert-profile")
    fail("--hot-experts {}: not an expert profile (\"format\": \"dsv4-expert-profile\"; made by dsv4 profile-experts)",
         file.string());
  if (!j.contains("counts") || !j["counts"].is_array())
    fail("--hot-experts {}: no \"counts\" array (one row of counts per layer)", file.string());
  if (j.contains("version") && !(j["version"].is_number_integer() && j["version"].get<int64_t>() == 1))
    fail("--hot-experts {}: profile version {} (this dsv4 reads version 1; make a new one with dsv4 profile-experts)",
         file.string(), j["version"].dump());
  // the other fields, where present, of their types (a wrong one is this one-line error, not a JSON type error)
  auto count_field = [&](const char* key) -> int64_t {
    if (!j.contains(key)) return 0;
    const auto& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      fail("--hot-experts {}: \"{}\" is {}, not a count", file.string(), key, v.dump());
    return v.get<int64_t>();
  };
  ExpertProfile p;
  if (j.contains("model")) {
    if (!j["model"].is_string()) fail("--hot-experts {}: \"model\" is {}, not a name", file.string(), j["model"].dump());
    p.model = j["model"].get<std::string>();
  }
  p.prompts = count_field("prompts");
  p.tokens = count_field("tokens");
  p.top_k = count_field("top_k");
  p.hidden_size = count_field("hidden_size");
  p.vocab_size = count_field("vocab_size");
  const int64_t n_layers = count_field("n_layers"), n_experts = count_field("n_experts");
  for (size_t l = 0; l < j["counts"].size(); ++l) {
    const auto& row = j["counts"][l];
    if (!row.is_array()) fail("--hot-experts {}: counts[{}] is not an array of counts", file.string(), l);
    std::vector<uint64_t> r;
    for (const auto& c : row) {
      if (!c.is_number_unsigned() && !(c.is_number_integer() && c.get<int64_t>() >= 0))
        fail("--hot-experts {}: counts[{}] holds {}, not a count", file.string(), l, c.dump());
      r.push_back(c.get<uint64_t>());
    }
    p.counts.push_back(std::move(r));
  }
  if (j.contains("n_layers") && n_layers != int64_t(p.counts.size()))
    fail("--hot-experts {}: \"n_layers\" is {} but \"counts\" has {} rows (an edited file? make a new one with dsv4 "
         "profile-experts)", file.string(), n_layers, p.counts.size());
  if (j.contains("n_experts"))
    for (size_t l = 0; l < p.counts.size(); ++l)
      if (int64_t(p.counts[l].size()) != n_experts)
        fail("--hot-experts {}: \"n_experts\" is {} but counts[{}] has {} (an edited file? make a new one with dsv4 "
             "profile-experts)", file.string(), n_experts, l, p.counts[l].size());
  return p;
}

void write_expert_profile(const ExpertProfile& p, const std::filesystem::path& file) {
  nlohmann::json j;
  j["format"] = "dsv4-expert-profile";
  j["version"] = 1;
  j["model"] = p.model;
  j["prompts"] = p.prompts;
  j["tokens"] = p.tokens;
  j["n_layers"] = p.counts.size();
  // experts per layer: written when every row has the same length (what dsv4 profile-experts writes)
  const size_t n_experts = p.counts.empty() ? size_t(0) : p.counts[0].size();
  if (std::all_of(p.counts.begin(), p.counts.end(), [&](const auto& r) { return r.size() == n_experts; }))
    j["n_experts"] = n_experts;
  j["top_k"] = p.top_k;
  if (p.hidden_size > 0) j["hidden_size"] = p.hidden_size;
  if (p.vocab_size > 0) j["vocab_size"] = p.vocab_size;
  j["counts"] = p.counts;
  std::ofstream f(file);
  if (!f) fail("{}: cannot write the profile", file.string());
  f << j.dump() << "\n";
  if (!f) fail("{}: write failed", file.string());
}

bool ExpertPlacement::all_device() const { return n_host() == 0; }

int64_t ExpertPlacement::n_host(int layer) const {
  if (layer < 0 || size_t(layer) >= on_device.size()) return 0;
  const auto& r = on_device[size_t(layer)];
  return int64_t(std::count(r.begin(), r.end(), uint8_t(0)));
}

int64_t ExpertPlacement::n_host() const {
  int64_t n = 0;
  for (size_t l = 0; l < on_device.size(); ++l) n += n_host(int(l));
  return n;
}

int64_t ExpertPlacement::n_total() const {
  int64_t n = 0;
  for (const auto& r : on_device) n += int64_t(r.size());
  return n;
}

std::string ExpertPlacement::summary() const {
  const int64_t h = n_host(), t = n_total();
  if (h == 0) return "routed experts: all on the device";
  std::string all, part;
  for (size_t l = 0; l < on_device.size(); ++l) {
    const int64_t nh = n_host(int(l));
    std::string* list = nh == int64_t(on_device[l].size()) ? &all : nh > 0 ? &part : nullptr;
    if (list == nullptr) continue;
    if (!list->empty()) *list += ',';
    *list += std::to_string(l);  // (appended piecewise: "," + to_string() trips GCC 12's -Wrestrict)
  }
  std::string where;
  if (!all.empty()) where += "all of layers " + all;
  if (!part.empty()) where += (where.empty() ? "" : "; ") + std::string("some of layers ") + part;
  return fmt::format("routed experts: {} on the device, {} on the CPU ({})", t - h, h, where);
}

uint64_t placement_reserve_bytes(const ModelConfig& c, int64_t ubatch) {
  // Workspace of one ubatch: the MoE scratch (hidden rows, k slot rows of inter + 2 x hidden, fp32) and the
  // attention / mHC activations (~16 x hidden + 4 x heads x head_dim per token, fp32), plus 1 GiB for the state of
  // the first sequences, the head's logits and the small tensors.
  const double per_tok = 4.0 * double(c.num_experts_per_tok * (c.moe_intermediate_size + 2 * c.hidden_size) +
                                      16 * c.hidden_size + 4 * c.num_attention_heads * c.head_dim);
  return uint64_t(per_tok * double(std::max<int64_t>(ubatch, 1))) + (uint64_t(1) << 30);
}

namespace {

// --gpu-experts N as a number (-1 for "auto", "" or not a number).
int64_t gpu_experts_count(const std::string& g) {
  const auto digit = [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; };
  if (g.empty() || g.size() >= 10 || !std::all_of(g.begin(), g.end(), digit)) return -1;
  return std::stoll(g);
}

}  // namespace

void check_placement(const ModelConfig& cfg, const PlacementOptions& o) {
  const int L = cfg.num_hidden_layers;
  const int64_t E = cfg.n_routed_experts;
  if (!o.any() || E == 0) return;
  const int modes = int(o.cpu_moe) + int(o.n_cpu_moe >= 0) + int(!o.gpu_experts.empty() || !o.hot_experts.empty());
  if (modes > 1)
    usage_fail("--cpu-moe, --n-cpu-moe and --gpu-experts / --hot-experts choose the expert placement in different "
               "ways; give one of them");
  if (o.n_cpu_moe > L) usage_fail("--n-cpu-moe {}: the model has {} layers (give 0 .. {})", o.n_cpu_moe, L, L);
  const std::string& g = o.gpu_experts;
  if (!g.empty() && g != "auto" && (gpu_experts_count(g) < 0 || gpu_experts_count(g) > E))
    usage_fail("--gpu-experts must be auto or a number of experts per layer in 0 .. {} (got '{}')", E, g);
}

ExpertPlacement resolve_placement(const ModelConfig& cfg, const PlacementOptions& o, uint64_t expert_bytes,
                                  int64_t auto_budget) {
  const int L = cfg.num_hidden_layers;
  const int64_t E = cfg.n_routed_experts;
  ExpertPlacement pl;
  if (!o.any() || E == 0) return pl;
  check_placement(cfg, o);
  pl.on_device.assign(size_t(L), std::vector<uint8_t>(size_t(E), 1));
  if (o.cpu_moe) {
    for (auto& r : pl.on_device) std::fill(r.begin(), r.end(), uint8_t(0));
    return pl;
  }
  if (o.n_cpu_moe >= 0) {
    for (int l = L - o.n_cpu_moe; l < L; ++l)
      std::fill(pl.on_device[size_t(l)].begin(), pl.on_device[size_t(l)].end(), uint8_t(0));
    return pl;
  }
  // --gpu-experts auto | N, optionally ordered by a profile
  std::vector<std::vector<uint64_t>> counts;
  if (!o.hot_experts.empty()) {
    const ExpertProfile p = read_expert_profile(o.hot_experts);
    if (int64_t(p.counts.size()) > L)
      fail("--hot-experts {}: the profile has {} layers but the model {} (layer {} does not exist)", o.hot_experts,
           p.counts.size(), L, L);
    for (size_t l = 0; l < p.counts.size(); ++l)
      if (int64_t(p.counts[l].size()) != E)
        fail("--hot-experts {}: layer {} of the profile has {} experts but the model {}{}", o.hot_experts, l,
             p.counts[l].size(), E,
             int64_t(p.counts[l].size()) > E ? fmt::format(" (expert {} does not exist)", E) : std::string());
    if (int64_t(p.counts.size()) < L)
      fail("--hot-experts {}: the profile has {} layers but the model {} (a profile of another model? make one with "
           "dsv4 profile-experts)", o.hot_experts, p.counts.size(), L);
    // the same layer and expert counts but another model: its other dimensions, where the profile records them
    const auto other = [&](const char* what, int64_t prof_v, int64_t model_v) {
      if (prof_v > 0 && prof_v != model_v)
        fail("--hot-experts {}: the profile was recorded on a model with {} {} but this model has {} (a profile of "
             "another model{}; make one with dsv4 profile-experts)", o.hot_experts, what, prof_v, model_v,
             p.model.empty() ? std::string() : fmt::format(", '{}'", p.model));
    };
    other("top_k", p.top_k, cfg.num_experts_per_tok);
    other("hidden_size", p.hidden_size, cfg.hidden_size);
    other("vocab_size", p.vocab_size, cfg.vocab_size);
    counts = p.counts;
  }
  counts.resize(size_t(L), std::vector<uint64_t>(size_t(E), 0));
  const std::string& g = o.gpu_experts.empty() ? std::string("auto") : o.gpu_experts;
  if (g != "auto") {
    const int64_t n = gpu_experts_count(g);  // (in 0 .. E: check_placement)
    for (int l = 0; l < L; ++l) {
      std::vector<int64_t> ord(static_cast<size_t>(E));
      std::iota(ord.begin(), ord.end(), 0);
      const auto& c = counts[size_t(l)];
      std::stable_sort(ord.begin(), ord.end(), [&](int64_t a, int64_t b) { return c[size_t(a)] > c[size_t(b)]; });
      auto& r = pl.on_device[size_t(l)];
      std::fill(r.begin(), r.end(), uint8_t(0));
      for (int64_t i = 0; i < n; ++i) r[size_t(ord[size_t(i)])] = 1;
    }
    return pl;
  }
  // auto: as many experts as the budget holds
  if (auto_budget < 0)
    fail("--gpu-experts auto: the weights other than the routed experts and the reserve for state and workspaces "
         "need {:.2f} GiB more than the device has free; use a smaller model (bench: --layers) or --device cpu",
         gib(double(-auto_budget)));
  const int64_t total = int64_t(L) * E;
  const int64_t n_dev =
      expert_bytes == 0 ? total : std::min<int64_t>(total, int64_t(uint64_t(auto_budget) / expert_bytes));
  std::vector<int64_t> ord(static_cast<size_t>(total));  // (layer, expert) flattened
  std::iota(ord.begin(), ord.end(), 0);
  if (!o.hot_experts.empty())
    std::stable_sort(ord.begin(), ord.end(), [&](int64_t a, int64_t b) {
      return counts[size_t(a / E)][size_t(a % E)] > counts[size_t(b / E)][size_t(b % E)];
    });
  for (auto& r : pl.on_device) std::fill(r.begin(), r.end(), uint8_t(0));
  for (int64_t i = 0; i < n_dev; ++i) pl.on_device[size_t(ord[size_t(i)] / E)][size_t(ord[size_t(i)] % E)] = 1;
  return pl;
}

}  // namespace dsv4
