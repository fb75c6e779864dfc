// ModelConfig parsing: the official Flash config, the derived Pro / 0731 configs, and rejected inputs.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "common/replica.h"
#include "core/error.h"
#include "loader/config.h"

namespace dsv4 {
namespace {
using testing::configs_dir;
using testing::read_json_file;

nlohmann::json flash_json() { return read_json_file(configs_dir() / "deepseek-v4-flash-config.json"); }

std::string parse_error(const nlohmann::json& j) {
  try {
    parse_config(j, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, OfficialFlash) {
  const ModelConfig c = load_config(configs_dir() / "deepseek-v4-flash-config.json");
  EXPECT_EQ(c.model_type, "deepseek_v4");
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 43);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.qk_nope_head_dim(), 448);
  EXPECT_EQ(c.q_lora_rank, 1024);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.heads_per_group(), 8);
  EXPECT_EQ(c.group_in_dim(), 4096);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_EQ(c.compress_ratios.size(), 44u);
  EXPECT_EQ(c.num_hash_layers, 3);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_EQ(c.scoring_func, "sqrtsoftplus");
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 10.0);
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.hc_mix_dim(), 24);
  EXPECT_EQ(c.hc_dim(), 16384);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_DOUBLE_EQ(c.hc_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000);
  EXPECT_DOUBLE_EQ(c.compress_rope_theta, 160000);
  EXPECT_TRUE(c.rope_scaling.enabled);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 16);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 65536);
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_fast, 32);
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_slow, 1);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.num_mtp_layers(), 1);
  EXPECT_TRUE(c.quantization.present);
  EXPECT_EQ(c.quantization.fmt, "e4m3");
  EXPECT_EQ(c.quantization.scale_fmt, "ue8m0");
  EXPECT_EQ(c.quantization.weight_block_rows, 128);
  EXPECT_EQ(c.quantization.weight_block_cols, 128);
  EXPECT_FALSE(c.dspark.present);
  EXPECT_NEAR(c.softmax_scale(), 0.044194173824159216, 1e-15);

  // Layer schedule (spec §2.2)
  EXPECT_EQ(c.count_layers_with_ratio(0), 2);
  EXPECT_EQ(c.count_layers_with_ratio(4), 21);
  EXPECT_EQ(c.count_layers_with_ratio(128), 20);
  for (int l = 0; l < 43; ++l) {
    const int want = l < 2 ? 0 : (l % 2 == 0 ? 4 : 128);
    EXPECT_EQ(c.compress_ratio(l), want) << l;
    EXPECT_EQ(c.is_hash_layer(l), l < 3) << l;
    EXPECT_EQ(c.has_indexer(l), want == 4) << l;
  }
  EXPECT_EQ(c.compress_ratio(43), 0);  // MTP
  EXPECT_FALSE(c.is_hash_layer(43));
  EXPECT_THROW(c.compress_ratio(44), Error);
  EXPECT_THROW(c.compress_ratio(-1), Error);
  EXPECT_EQ(ModelConfig::compressor_coff(4), 2);
  EXPECT_EQ(ModelConfig::compressor_coff(128), 1);
}

TEST(Config, ProAnd0731) {
  const ModelConfig p = load_config(configs_dir() / "deepseek-v4-pro-config.json");
  EXPECT_EQ(p.num_hidden_layers, 61);
  EXPECT_EQ(p.hidden_size, 7168);
  EXPECT_EQ(p.num_attention_heads, 128);
  EXPECT_EQ(p.o_groups, 16);
  EXPECT_EQ(p.heads_per_group(), 8);
  EXPECT_EQ(p.count_layers_with_ratio(0), 0);
  EXPECT_EQ(p.count_layers_with_ratio(4), 30);
  EXPECT_EQ(p.count_layers_with_ratio(128), 31);
  EXPECT_EQ(p.compress_ratio(0), 128);
  EXPECT_EQ(p.compress_ratio(61), 0);

  const ModelConfig d = load_config(configs_dir() / "deepseek-v4-flash-0731-config.json");
  EXPECT_TRUE(d.dspark.present);
  EXPECT_EQ(d.dspark.block_size, 5);
  EXPECT_EQ(d.dspark.target_layer_ids, (std::vector<int>{40, 41, 42}));
  EXPECT_EQ(d.dspark.markov_rank, 256);
  EXPECT_EQ(d.dspark.noise_token_id, 128799);
  EXPECT_EQ(d.num_nextn_predict_layers, 1);
  EXPECT_EQ(d.num_mtp_layers(), 0);
  EXPECT_EQ(d.compress_ratios.size(), 46u);
  EXPECT_EQ(d.dspark.n_stages, 3);
  EXPECT_EQ(d.num_draft_layers(), 3);
}

// dspark_* keys (docs/dspark.md): all four required, checked against the model; the stages are the compress_ratios
// entries after the main layers, window-only.
TEST(Config, RejectsBadDsparkKeys) {
  std::ifstream f(configs_dir() / "deepseek-v4-flash-0731-config.json");
  const nlohmann::json base = nlohmann::json::parse(f);
  struct Case {
    const char* field;
    nlohmann::json value;  // null = remove
    const char* expect;
  };
  const Case cases[] = {
      {"dspark_block_size", nullptr, "field 'dspark_block_size': missing"},
      {"dspark_block_size", 0, "field 'dspark_block_size': value 0 outside [1, 64]"},
      {"dspark_markov_rank", nullptr, "field 'dspark_markov_rank': missing"},
      {"dspark_noise_token_id", 129280, "field 'dspark_noise_token_id': value 129280 outside"},
      {"dspark_target_layer_ids", nlohmann::json::array(), "field 'dspark_target_layer_ids': expected a non-empty"},
      {"dspark_target_layer_ids", {41, 40}, "layer ids must be strictly increasing"},
      {"dspark_target_layer_ids", {40, 43}, "field 'dspark_target_layer_ids': value 43 outside [0, 42]"},
      {"dspark_markov_head_type", "gated", "field 'dspark_markov_head_type': unknown DSpark key"},
      {"dspark_n_routed_experts", 128, "DSpark stages with 128 experts top-6"},
  };
  for (const auto& k : cases) {
    auto j = base;
    if (k.value.is_null()) j.erase(k.field);
    else j[k.field] = k.value;
    const std::string msg = parse_error(j);
    EXPECT_NE(msg.find(k.expect), std::string::npos) << k.field << " -> '" << msg << "'";
  }
  auto j = base;
  j["compress_ratios"].back() = 4;
  EXPECT_NE(parse_error(j).find("entry 45 (DSpark stage 2) is 4: the stages are window-only"), std::string::npos);
  j = base;
  j["compress_ratios"] = std::vector<int>(43, 0);
  EXPECT_NE(parse_error(j).find("a DSpark drafter needs one entry per stage"), std::string::npos);
  j = base;
  j["dspark_n_routed_experts"] = 256;  // the main model's values are accepted
  j["dspark_num_experts_per_tok"] = 6;
  EXPECT_EQ(parse_error(j), "");
}

TEST(Config, UnknownKeysIgnored) {
  auto j = flash_json();
  j["some_future_key"] = {1, 2, 3};
  j["eos_token_id"] = {1, 7};
  const ModelConfig c = parse_config(j, "cfg.json");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.eos_token_id, 1);
}

TEST(Config, RejectsBadValues) {
  struct Case {
    const char* field;
    nlohmann::json value;  // null = remove
    const char* expect;    // substring of the message
  };
  const Case cases[] = {
      {"hidden_size", nullptr, "field 'hidden_size': missing"},
      {"hidden_size", "4096", "field 'hidden_size': expected an integer"},
      {"hidden_size", 4096.5, "field 'hidden_size': expected an integer"},
      {"hidden_size", -1, "field 'hidden_size': value -1 outside"},
      {"num_hidden_layers", 50, "field 'compress_ratios'"},
      {"model_type", "deepseek_v41", "field 'model_type': unsupported model_type 'deepseek_v41'"},
      {"model_type", nullptr, "field 'model_type': missing"},
      {"o_groups", 7, "field 'o_groups'"},
      {"num_key_value_heads", 8, "field 'num_key_value_heads'"},
      {"qk_rope_head_dim", 512, "field 'qk_rope_head_dim'"},
      {"num_experts_per_tok", 300, "field 'num_experts_per_tok'"},
      {"compress_ratios", "0,0,4", "field 'compress_ratios'"},
      {"compress_ratios", nlohmann::json::array({0, -4}), "field 'compress_ratios'"},
      {"scoring_func", "relu", "field 'scoring_func'"},
      {"rms_norm_eps", "x", "field 'rms_norm_eps'"},
      {"rope_scaling", nlohmann::json({{"type", "linear"}, {"factor", 2}}), "field 'rope_scaling.type'"},
      {"rope_scaling", nlohmann::json({{"type", "yarn"}}), "field 'rope_scaling.factor': missing"},
      {"quantization_config", nlohmann::json({{"weight_block_size", {128}}}), "weight_block_size"},
      {"tie_word_embeddings", true, "field 'tie_word_embeddings'"},
      {"index_topk", nullptr, "field 'index_topk': missing"},
  };
  for (const auto& k : cases) {
    auto j = flash_json();
    if (k.value.is_null()) j.erase(k.field);
    else j[k.field] = k.value;
    const std::string msg = parse_error(j);
    EXPECT_NE(msg.find(k.expect), std::string::npos) << k.field << " -> '" << msg << "'";
    EXPECT_EQ(msg.find('\n'), std::string::npos);
    EXPECT_EQ(msg.rfind("cfg.json: ", 0), 0u) << msg;
  }
  EXPECT_NE(parse_error(nlohmann::json::array()).find("JSON object"), std::string::npos);
}

TEST(Config, MalformedFile) {
  testing::TempDir t;
  const auto p = t.path / "config.json";
  std::ofstream(p) << "{\"model_type\": \"deepseek_v4\", \n \"hidden_size\": 40";
  try {
    load_config(p);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(p.string()), std::string::npos) << m;
    EXPECT_NE(m.find("malformed config JSON"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
  std::ofstream(p) << std::string(100000, '[');
  EXPECT_THROW(load_config(p), Error);
  EXPECT_THROW(load_config(t.path / "absent.json"), Error);
}

}  // namespace
}  // namespace dsv4
