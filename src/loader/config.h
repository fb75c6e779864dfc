// ModelConfig: the architecture hyper-parameters of a DeepSeek V4 checkpoint, parsed from its HF config.json
// (field names and meaning: spec §2.1; per-layer schedule §2.2; V4-Pro / 0731 variants §10.1, §10.3).
// Unknown keys are ignored (logged once at info level). Missing or inconsistent required values throw dsv4::Error
// "<origin>: field '<name>': <problem>".
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsv4 {

// rope_scaling (YaRN). enabled == false when config.json has no rope_scaling (then factor = 1, no YaRN anywhere).
// YaRN applies only to layers with compress_ratio > 0 (spec §2.2, §4.7).
struct RopeScaling {
  bool enabled = false;
  std::string type;                                 // "yarn"
  double factor = 1.0;                              // 16
  int64_t original_max_position_embeddings = 0;     // 65536 (reference `original_seq_len`)
  double beta_fast = 32.0;                          // 32
  double beta_slow = 1.0;                           // 1
};

// quantization_config (+ the top-level expert_dtype). present == false for an unquantized (all-BF16) checkpoint.
struct QuantizationConfig {
  bool present = false;
  std::string quant_method;           // "fp8"
  std::string fmt;                    // "e4m3"
  std::string scale_fmt;              // "ue8m0" (E8M0 scales) — F32 scales are also accepted (Flash-Base, §10.2)
  std::string activation_scheme;      // "dynamic"
  int64_t weight_block_rows = 128;    // weight_block_size[0]: FP8 scale block along the output dim
  int64_t weight_block_cols = 128;    // weight_block_size[1]: along the input dim
  std::string expert_dtype;           // "fp4" | "fp8" | "" (absent: decided by the tensors' dtypes)
};

// DSpark block drafter of the 0731 / 0813 releases (spec §10.3, docs/dspark.md). When present, the `mtp.*` tensors
// are the drafter's `n_stages` window-only stages (no MTP module).
struct DsparkConfig {
  bool present = false;
  int block_size = 0;                    // dspark_block_size (5): block positions per draft pass = drafts at most
  std::vector<int> target_layer_ids;     // dspark_target_layer_ids ([40,41,42]), strictly increasing main layers
  int markov_rank = 0;                   // dspark_markov_rank (256)
  int64_t noise_token_id = -1;           // dspark_noise_token_id (128799), fills block positions 1 .. block_size-1
  int n_stages = 0;                      // drafter stages: compress_ratios entries after the main layers (3)
};

struct ModelConfig {
  std::string origin;                    // where it was read from (file path), used in error messages
  std::string model_type;                // "deepseek_v4" (the only accepted value)
  std::vector<std::string> architectures;  // ["DeepseekV4ForCausalLM"]

  int64_t vocab_size = 0;                // 129280
  int64_t hidden_size = 0;               // n_embd, D = 4096
  int num_hidden_layers = 0;             // 43 main layers (MTP not included)
  int num_attention_heads = 0;           // n_head, H = 64
  int num_key_value_heads = 1;           // 1 (single shared latent KV; must be 1)
  int head_dim = 0;                      // Dh = 512 (q, latent KV and per-head output width)
  int qk_rope_head_dim = 0;              // Dr = 64 (last 64 dims of each head are rotated)
  int64_t q_lora_rank = 0;               // 1024
  int64_t o_lora_rank = 0;               // 1024 (per output group)
  int o_groups = 0;                      // G = 8
  int sliding_window = 0;                // W = 128 raw KV rows kept per layer
  // One ratio per layer: [0, num_hidden_layers) main layers, then one per drafter layer (MTP layers; the 0731
  // configs: the 3 DSpark stages) (Flash: 44 entries, the 0731 configs 46). Values: 0 (sliding window only), 4 (CSA: overlapping compressor + indexer), 128 (HCA); any
  // positive value is accepted, the compressor overlaps iff ratio == 4 and only ratio-4 layers have an indexer.
  std::vector<int> compress_ratios;
  int num_hash_layers = 0;               // 3: layers [0, 3) route by token-id hash (ffn.gate.tid2eid)
  int n_routed_experts = 0;              // E = 256
  int n_shared_experts = 0;              // 1
  int num_experts_per_tok = 0;           // top-k = 6
  int64_t moe_intermediate_size = 0;     // 2048 (routed and per shared expert)
  double routed_scaling_factor = 1.0;    // 1.5
  std::string scoring_func;              // "sqrtsoftplus" (also accepted: "softmax", "sigmoid")
  std::string topk_method;               // "noaux_tc"
  bool norm_topk_prob = true;
  double swiglu_limit = 0.0;             // 10.0 (0 = no clamp)
  std::string hidden_act = "silu";
  int index_n_heads = 0;                 // IH = 64
  int index_head_dim = 0;                // IDh = 128
  int index_topk = 0;                    // 512
  int hc_mult = 0;                       // HC = 4 residual streams
  int hc_sinkhorn_iters = 0;             // 20
  double hc_eps = 0.0;                   // 1e-6
  double rms_norm_eps = 0.0;             // 1e-6
  double rope_theta = 0.0;               // 10000: layers with compress_ratio == 0
  double compress_rope_theta = 0.0;      // 160000: layers with compress_ratio > 0
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;   // 1048576
  int64_t bos_token_id = 0;              // 0
  int64_t eos_token_id = 1;              // 1 (first id if config lists several)
  int num_nextn_predict_layers = 0;      // MTP layers (1); 0 usable MTP layers when dspark.present
  bool tie_word_embeddings = false;      // must be false (separate embed / head)
  std::string torch_dtype;               // "bfloat16"
  QuantizationConfig quantization;
  DsparkConfig dspark;

  // ---- derived -------------------------------------------------------------------------------------------------
  // Ratio of layer `layer` in [0, num_hidden_layers + num_draft_layers()); drafter layer k is num_hidden_layers + k.
  // Throws dsv4::Error for an index outside compress_ratios.
  int compress_ratio(int layer) const;
  // True for main layers < num_hash_layers (MTP layers never hash-route).
  bool is_hash_layer(int layer) const { return layer >= 0 && layer < num_hash_layers && layer < num_hidden_layers; }
  // Compressor overlap factor of a ratio (2 for ratio 4, else 1), spec §5.5.
  static int compressor_coff(int ratio) { return ratio == 4 ? 2 : 1; }
  bool has_indexer(int layer) const { return compress_ratio(layer) == 4; }
  // MTP layers that dsv4 binds and may run: num_nextn_predict_layers, or 0 when the mtp.* tensors are a DSpark drafter.
  int num_mtp_layers() const { return dspark.present ? 0 : num_nextn_predict_layers; }
  // Layers after the main ones that a drafter brings: the DSpark stages, or the MTP layers.
  int num_draft_layers() const { return dspark.present ? dspark.n_stages : num_mtp_layers(); }
  int qk_nope_head_dim() const { return head_dim - qk_rope_head_dim; }      // 448
  int heads_per_group() const { return num_attention_heads / o_groups; }    // 8
  int64_t group_in_dim() const { return int64_t(heads_per_group()) * head_dim; }  // 4096
  int64_t hc_mix_dim() const { return int64_t(2 + hc_mult) * hc_mult; }   // 24
  int64_t hc_dim() const { return int64_t(hc_mult) * hidden_size; }       // 16384
  double softmax_scale() const;          // head_dim^-0.5
  // Counts of main layers per ratio (Flash: 2 / 21 / 20).
  int count_layers_with_ratio(int ratio) const;
};

// Parse a config.json already read as JSON; `origin` names it in error messages. Validates every required field
// (type, range) and the cross-field consistency (head_dim > qk_rope_head_dim, heads divisible by o_groups,
// compress_ratios long enough, top-k <= experts, ...).
ModelConfig parse_config(const nlohmann::json& j, const std::string& origin);
// Read and parse a config.json file (malformed JSON -> dsv4::Error naming the file and the parse position).
ModelConfig load_config(const std::filesystem::path& config_json);

}  // namespace dsv4
