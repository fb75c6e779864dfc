#include "loader/config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "loader/json_text.h"

namespace dsv4 {
namespace {

using json = nlohmann::json;

struct Reader {
  const json& j;
  const std::string& origin;
  std::set<std::string> used;

  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    fail("{}: field '{}': {}", origin, key, what);
  }
  const json* get(const std::string& key) {
    used.insert(key);
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return nullptr;
    return &*it;
  }
  const json& need(const std::string& key) {
    const json* v = get(key);
    if (!v) bad(key, "missing");
    return *v;
  }
  static int64_t as_int(const Reader& r, const std::string& key, const json& v, int64_t lo, int64_t hi) {
    int64_t x;
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        r.bad(key, "integer out of range");
      x = v.get<int64_t>();
    } else if (v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>() &&
               std::fabs(v.get<double>()) < 9e15) {
      x = static_cast<int64_t>(v.get<double>());
    } else {
      r.bad(key, fmt::format("expected an integer, got {}", v.dump().substr(0, 40)));
    }
    if (x < lo || x > hi) r.bad(key, fmt::format("value {} outside [{}, {}]", x, lo, hi));
    return x;
  }
  int64_t i64(const std::string& key, int64_t lo, int64_t hi) { return as_int(*this, key, need(key), lo, hi); }
  int64_t i64_or(const std::string& key, int64_t dflt, int64_t lo, int64_t hi) {
    const json* v = get(key);
    return v ? as_int(*this, key, *v, lo, hi) : dflt;
  }
  static double as_num(const Reader& r, const std::string& key, const json& v, double lo, double hi) {
    if (!v.is_number()) r.bad(key, fmt::format("expected a number, got {}", v.dump().substr(0, 40)));
    double x = v.get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) r.bad(key, fmt::format("value {} outside [{}, {}]", x, lo, hi));
    return x;
  }
  double num(const std::string& key, double lo, double hi) { return as_num(*this, key, need(key), lo, hi); }
  double num_or(const std::string& key, double dflt, double lo, double hi) {
    const json* v = get(key);
    return v ? as_num(*this, key, *v, lo, hi) : dflt;
  }
  std::string str_or(const std::string& key, const std::string& dflt) {
    const json* v = get(key);
    if (!v) return dflt;
    if (!v->is_string()) bad(key, "expected a string");
    return v->get<std::string>();
  }
  std::string str(const std::string& key) {
    const json& v = need(key);
    if (!v.is_string()) bad(key, "expected a string");
    return v.get<std::string>();
  }
  bool boolean_or(const std::string& key, bool dflt) {
    const json* v = get(key);
    if (!v) return dflt;
    if (!v->is_boolean()) bad(key, "expected true or false");
    return v->get<bool>();
  }
};

constexpr int64_t kBig = int64_t(1) << 40;

// Keys of the official configs that carry no architecture information dsv4 needs.
const std::set<std::string> kIgnoredKnown = {"attention_bias", "attention_dropout", "initializer_range",
                                             "transformers_version", "use_cache", "expert_dtype_comment", "dtype"};

}  // namespace

int ModelConfig::compress_ratio(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(compress_ratios.size()))
    fail("{}: layer {} has no entry in compress_ratios ({} entries)", origin, layer, compress_ratios.size());
  return compress_ratios[layer];
}

double ModelConfig::softmax_scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }

int ModelConfig::count_layers_with_ratio(int ratio) const {
  int n = 0;
  for (int l = 0; l < num_hidden_layers; ++l) n += compress_ratios[l] == ratio;
  return n;
}

ModelConfig parse_config(const json& j, const std::string& origin) {
  if (!j.is_object()) fail("{}: config must be a JSON object", origin);
  Reader r{j, origin, {}};
  ModelConfig c;
  c.origin = origin;

  c.model_type = r.str("model_type");
  if (c.model_type != "deepseek_v4")
    r.bad("model_type", fmt::format("unsupported model_type '{}' (dsv4 runs deepseek_v4 checkpoints)", c.model_type));
  if (const json* a = r.get("architectures")) {
    if (!a->is_array()) r.bad("architectures", "expected an array of strings");
    for (const auto& s : *a) {
      if (!s.is_string()) r.bad("architectures", "expected an array of strings");
      c.architectures.push_back(s.get<std::string>());
    }
  }

  c.vocab_size = r.i64("vocab_size", 1, 1 << 24);
  c.hidden_size = r.i64("hidden_size", 1, 1 << 20);
  c.num_hidden_layers = static_cast<int>(r.i64("num_hidden_layers", 1, 1024));
  c.num_attention_heads = static_cast<int>(r.i64("num_attention_heads", 1, 1 << 14));
  c.num_key_value_heads = static_cast<int>(r.i64_or("num_key_value_heads", 1, 1, 1 << 14));
  c.head_dim = static_cast<int>(r.i64("head_dim", 1, 1 << 16));
  c.qk_rope_head_dim = static_cast<int>(r.i64("qk_rope_head_dim", 0, 1 << 16));
  c.q_lora_rank = r.i64("q_lora_rank", 1, 1 << 20);
  c.o_lora_rank = r.i64("o_lora_rank", 1, 1 << 20);
  c.o_groups = static_cast<int>(r.i64("o_groups", 1, 1 << 14));
  c.sliding_window = static_cast<int>(r.i64("sliding_window", 1, 1 << 24));
  c.num_nextn_predict_layers = static_cast<int>(r.i64_or("num_nextn_predict_layers", 0, 0, 64));

  // dspark_* keys (0731 / 0813 releases): the mtp.* tensors are a DSpark drafter (docs/dspark.md).
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key().rfind("dspark_", 0) == 0) c.dspark.present = true;
  if (c.dspark.present) {
    c.dspark.block_size = static_cast<int>(r.i64("dspark_block_size", 1, 64));
    c.dspark.markov_rank = static_cast<int>(r.i64("dspark_markov_rank", 1, 1 << 16));
    c.dspark.noise_token_id = r.i64("dspark_noise_token_id", 0, c.vocab_size - 1);
    const json& t = r.need("dspark_target_layer_ids");
    if (!t.is_array() || t.empty()) r.bad("dspark_target_layer_ids", "expected a non-empty array of layer ids");
    for (const auto& v : t) {
      const int id = static_cast<int>(Reader::as_int(r, "dspark_target_layer_ids", v, 0, c.num_hidden_layers - 1));
      if (!c.dspark.target_layer_ids.empty() && id <= c.dspark.target_layer_ids.back())
        r.bad("dspark_target_layer_ids", "layer ids must be strictly increasing");
      c.dspark.target_layer_ids.push_back(id);
    }
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key().rfind("dspark_", 0) == 0 && !r.used.count(it.key()) && it.key() != "dspark_n_routed_experts" &&
          it.key() != "dspark_num_experts_per_tok")
        r.bad(it.key(), "unknown DSpark key (dsv4 knows dspark_block_size, dspark_target_layer_ids, "
                        "dspark_markov_rank, dspark_noise_token_id)");
  }

  {
    const json& cr = r.need("compress_ratios");
    if (!cr.is_array()) r.bad("compress_ratios", "expected an array of integers");
    for (const auto& v : cr) c.compress_ratios.push_back(static_cast<int>(Reader::as_int(r, "compress_ratios", v, 0, 1 << 20)));
    if (c.dspark.present) {
      // the stages follow the main layers, one entry each, window-only
      c.dspark.n_stages = int(c.compress_ratios.size()) - c.num_hidden_layers;
      if (c.dspark.n_stages < 1)
        r.bad("compress_ratios", fmt::format("{} entries: a DSpark drafter needs one entry per stage after the {} main "
                                             "layers", c.compress_ratios.size(), c.num_hidden_layers));
      for (int s = 0; s < c.dspark.n_stages; ++s)
        if (c.compress_ratios[size_t(c.num_hidden_layers + s)] != 0)
          r.bad("compress_ratios", fmt::format("entry {} (DSpark stage {}) is {}: the stages are window-only (0)",
                                               c.num_hidden_layers + s, s, c.compress_ratios[size_t(c.num_hidden_layers + s)]));
    }
    const size_t need = size_t(c.num_hidden_layers) + size_t(c.num_mtp_layers());
    if (c.compress_ratios.size() < need)
      r.bad("compress_ratios", fmt::format("{} entries, need at least {} (num_hidden_layers {} + MTP layers {})",
                                           c.compress_ratios.size(), need, c.num_hidden_layers, c.num_mtp_layers()));
  }

  c.num_hash_layers = static_cast<int>(r.i64_or("num_hash_layers", 0, 0, c.num_hidden_layers));
  c.n_routed_experts = static_cast<int>(r.i64("n_routed_experts", 1, 1 << 16));
  c.n_shared_experts = static_cast<int>(r.i64_or("n_shared_experts", 0, 0, 64));
  c.num_experts_per_tok = static_cast<int>(r.i64("num_experts_per_tok", 1, c.n_routed_experts));
  c.moe_intermediate_size = r.i64("moe_intermediate_size", 1, 1 << 20);
  if (c.dspark.present) {  // V4.1-style stages with their own MoE size: only the main model's is supported
    const int64_t e = r.i64_or("dspark_n_routed_experts", c.n_routed_experts, 0, 1 << 16);
    const int64_t k = r.i64_or("dspark_num_experts_per_tok", c.num_experts_per_tok, 0, 1 << 16);
    if ((e != 0 && e != c.n_routed_experts) || (k != 0 && k != c.num_experts_per_tok))
      r.bad("dspark_n_routed_experts", fmt::format("DSpark stages with {} experts top-{} (the main layers: {} top-{}) "
                                                   "are not supported", e, k, c.n_routed_experts, c.num_experts_per_tok));
  }
  c.routed_scaling_factor = r.num_or("routed_scaling_factor", 1.0, 0.0, 1e6);
  c.scoring_func = r.str_or("scoring_func", "softmax");
  if (c.scoring_func != "sqrtsoftplus" && c.scoring_func != "softmax" && c.scoring_func != "sigmoid")
    r.bad("scoring_func", fmt::format("unsupported value '{}'", c.scoring_func));
  c.topk_method = r.str_or("topk_method", "");
  c.norm_topk_prob = r.boolean_or("norm_topk_prob", true);
  c.swiglu_limit = r.num_or("swiglu_limit", 0.0, 0.0, 1e30);
  c.hidden_act = r.str_or("hidden_act", "silu");
  if (c.hidden_act != "silu") r.bad("hidden_act", fmt::format("unsupported value '{}'", c.hidden_act));

  bool any_csa = false, any_compressed = false;
  for (int l = 0; l < c.num_hidden_layers + c.num_draft_layers(); ++l) {
    any_csa |= c.compress_ratios[l] == 4;
    any_compressed |= c.compress_ratios[l] > 0;
  }
  c.index_n_heads = static_cast<int>(any_csa ? r.i64("index_n_heads", 1, 1 << 14) : r.i64_or("index_n_heads", 0, 0, 1 << 14));
  c.index_head_dim = static_cast<int>(any_csa ? r.i64("index_head_dim", 1, 1 << 16) : r.i64_or("index_head_dim", 0, 0, 1 << 16));
  c.index_topk = static_cast<int>(any_csa ? r.i64("index_topk", 1, 1 << 30) : r.i64_or("index_topk", 0, 0, 1 << 30));

  c.hc_mult = static_cast<int>(r.i64("hc_mult", 1, 64));
  c.hc_sinkhorn_iters = static_cast<int>(r.i64("hc_sinkhorn_iters", 0, 1 << 16));
  c.hc_eps = r.num("hc_eps", 0.0, 1.0);
  c.rms_norm_eps = r.num("rms_norm_eps", 0.0, 1.0);
  c.rope_theta = r.num("rope_theta", 1e-30, 1e30);
  c.compress_rope_theta = any_compressed ? r.num("compress_rope_theta", 1e-30, 1e30)
                                         : r.num_or("compress_rope_theta", c.rope_theta, 1e-30, 1e30);
  c.max_position_embeddings = r.i64("max_position_embeddings", 1, kBig);

  if (const json* rs = r.get("rope_scaling")) {
    if (!rs->is_object()) r.bad("rope_scaling", "expected an object");
    Reader sr{*rs, origin, {}};
    std::string type = rs->contains("type") ? sr.str("type") : sr.str_or("rope_type", "");
    if (type != "yarn") r.bad("rope_scaling.type", fmt::format("unsupported rope scaling '{}' (expected yarn)", type));
    c.rope_scaling.enabled = true;
    c.rope_scaling.type = type;
    try {
      c.rope_scaling.factor = sr.num("factor", 1.0, 1e9);
      c.rope_scaling.original_max_position_embeddings = sr.i64("original_max_position_embeddings", 1, kBig);
      c.rope_scaling.beta_fast = sr.num_or("beta_fast", 32.0, 0.0, 1e9);
      c.rope_scaling.beta_slow = sr.num_or("beta_slow", 1.0, 0.0, 1e9);
    } catch (const Error& e) {
      // Re-label the nested field ("rope_scaling.factor").
      std::string m = e.what();
      auto p = m.find("field '");
      if (p != std::string::npos) m.insert(p + 7, "rope_scaling.");
      throw Error(m);
    }
  }

  c.bos_token_id = r.i64_or("bos_token_id", 0, 0, c.vocab_size - 1);
  if (const json* e = r.get("eos_token_id")) {
    const json& first = e->is_array() && !e->empty() ? (*e)[0] : *e;
    c.eos_token_id = Reader::as_int(r, "eos_token_id", first, 0, c.vocab_size - 1);
  }
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  if (c.tie_word_embeddings) r.bad("tie_word_embeddings", "true is not supported (V4 has separate embed and head)");
  c.torch_dtype = r.str_or("torch_dtype", "");

  if (const json* q = r.get("quantization_config")) {
    if (!q->is_object()) r.bad("quantization_config", "expected an object");
    auto& qc = c.quantization;
    qc.present = true;
    auto qs = [&](const char* k) -> std::string {
      auto it = q->find(k);
      if (it == q->end() || it->is_null()) return "";
      if (!it->is_string()) r.bad(std::string("quantization_config.") + k, "expected a string");
      return it->get<std::string>();
    };
    qc.quant_method = qs("quant_method");
    qc.fmt = qs("fmt");
    qc.scale_fmt = qs("scale_fmt");
    qc.activation_scheme = qs("activation_scheme");
    if (!qc.quant_method.empty() && qc.quant_method != "fp8")
      r.bad("quantization_config.quant_method", fmt::format("unsupported value '{}'", qc.quant_method));
    if (auto it = q->find("weight_block_size"); it != q->end() && !it->is_null()) {
      const std::string k = "quantization_config.weight_block_size";
      if (!it->is_array() || it->size() != 2) r.bad(k, "expected [rows, cols]");
      qc.weight_block_rows = Reader::as_int(r, k, (*it)[0], 1, 1 << 20);
      qc.weight_block_cols = Reader::as_int(r, k, (*it)[1], 1, 1 << 20);
    }
  }
  c.quantization.expert_dtype = r.str_or("expert_dtype", "");
  if (!c.quantization.expert_dtype.empty() && c.quantization.expert_dtype != "fp4" &&
      c.quantization.expert_dtype != "fp8")
    r.bad("expert_dtype", fmt::format("unsupported value '{}'", c.quantization.expert_dtype));

  // ---- cross-field consistency ----
  if (c.num_key_value_heads != 1) r.bad("num_key_value_heads", "must be 1 (single shared latent KV)");
  if (c.qk_rope_head_dim % 2 != 0 || c.qk_rope_head_dim >= c.head_dim)
    r.bad("qk_rope_head_dim", fmt::format("{} must be even and smaller than head_dim {}", c.qk_rope_head_dim, c.head_dim));
  if (c.num_attention_heads % c.o_groups != 0)
    r.bad("o_groups", fmt::format("{} does not divide num_attention_heads {}", c.o_groups, c.num_attention_heads));
  if (any_csa && (c.index_head_dim % 2 != 0 || c.qk_rope_head_dim >= c.index_head_dim))
    r.bad("index_head_dim", fmt::format("{} must be even and larger than qk_rope_head_dim {}", c.index_head_dim,
                                        c.qk_rope_head_dim));

  // Unknown keys: logged once (info).
  std::vector<std::string> unknown;
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!r.used.count(it.key()) && !kIgnoredKnown.count(it.key())) unknown.push_back(it.key());
  if (!unknown.empty()) {
    std::string list;
    for (const auto& k : unknown) list += (list.empty() ? "" : ", ") + k;
    log::info("{}: ignoring unknown config keys: {}", origin, list);
  }
  return c;
}

ModelConfig load_config(const std::filesystem::path& config_json) {
  std::ifstream f(config_json, std::ios::binary);
  if (!f) fail("{}: cannot open config", config_json.string());
  std::stringstream ss;
  ss << f.rdbuf();
  const json j = parse_json_text(ss.str(), config_json.string(), "config");
  return parse_config(j, config_json.string());
}

}  // namespace dsv4
