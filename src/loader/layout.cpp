#include "loader/layout.h"

namespace dsv4 {

uint64_t TensorSpec::nbytes() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n * dtype_size(dtype);
}

std::vector<TensorSpec> checkpoint_layout(const ModelConfig& c, bool with_drafter) {
  std::vector<TensorSpec> t;
  const int64_t V = c.vocab_size, D = c.hidden_size, H = c.num_attention_heads, Dh = c.head_dim;
  const int64_t QL = c.q_lora_rank, OL = c.o_lora_rank, G = c.o_groups, E = c.n_routed_experts;
  const int64_t I = c.moe_intermediate_size, K = c.num_experts_per_tok, NS = c.n_shared_experts, HC = c.hc_mult;
  const int64_t IH = c.index_n_heads, IDh = c.index_head_dim;
  const int64_t br = c.quantization.weight_block_rows, bc = c.quantization.weight_block_cols;
  const int64_t mix = c.hc_mix_dim(), hcd = c.hc_dim();
  const bool fp8_experts = c.quantization.expert_dtype == "fp8";
  auto add = [&](std::string n, DType dt, std::vector<int64_t> s) { t.push_back({std::move(n), dt, std::move(s)}); };
  auto fp8 = [&](const std::string& p, int64_t out, int64_t in) {
    add(p + ".weight", DType::F8_E4M3, {out, in});
    add(p + ".scale", DType::F8_E8M0, {(out + br - 1) / br, (in + bc - 1) / bc});
  };
  auto expert = [&](const std::string& p, int64_t out, int64_t in) {
    if (fp8_experts) return fp8(p, out, in);
    add(p + ".weight", DType::I8, {out, in / 2});
    add(p + ".scale", DType::F8_E8M0, {out, in / 32});
  };
  auto compressor = [&](const std::string& q, int64_t m, int64_t w) {
    const int64_t coff = ModelConfig::compressor_coff(int(m));
    add(q + "ape", DType::F32, {m, coff * w});
    add(q + "wkv.weight", DType::BF16, {coff * w, D});
    add(q + "wgate.weight", DType::BF16, {coff * w, D});
    add(q + "norm.weight", DType::BF16, {w});
  };
  auto block = [&](const std::string& p, int ratio, bool hash) {
    for (const char* s : {"attn", "ffn"}) {
      add(p + "hc_" + s + "_fn", DType::F32, {mix, hcd});
      add(p + "hc_" + s + "_base", DType::F32, {mix});
      add(p + "hc_" + s + "_scale", DType::F32, {3});
    }
    add(p + "attn_norm.weight", DType::BF16, {D});
    add(p + "ffn_norm.weight", DType::BF16, {D});
    add(p + "attn.attn_sink", DType::F32, {H});
    fp8(p + "attn.wq_a", QL, D);
    add(p + "attn.q_norm.weight", DType::BF16, {QL});
    fp8(p + "attn.wq_b", H * Dh, QL);
    fp8(p + "attn.wkv", Dh, D);
    add(p + "attn.kv_norm.weight", DType::BF16, {Dh});
    fp8(p + "attn.wo_a", G * OL, H / G * Dh);
    fp8(p + "attn.wo_b", D, G * OL);
    if (ratio > 0) compressor(p + "attn.compressor.", ratio, Dh);
    if (ratio == 4) {
      fp8(p + "attn.indexer.wq_b", IH * IDh, QL);
      add(p + "attn.indexer.weights_proj.weight", DType::BF16, {IH, D});
      compressor(p + "attn.indexer.compressor.", 4, IDh);
    }
    add(p + "ffn.gate.weight", DType::BF16, {E, D});
    if (hash) add(p + "ffn.gate.tid2eid", DType::I64, {V, K});
    else add(p + "ffn.gate.bias", DType::F32, {E});
    if (NS > 0) {
      fp8(p + "ffn.shared_experts.w1", NS * I, D);
      fp8(p + "ffn.shared_experts.w3", NS * I, D);
      fp8(p + "ffn.shared_experts.w2", D, NS * I);
    }
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + "ffn.experts." + std::to_string(e) + ".";
      expert(x + "w1", I, D);
      expert(x + "w3", I, D);
      expert(x + "w2", D, I);
    }
  };
  add("embed.weight", DType::BF16, {V, D});
  for (int l = 0; l < c.num_hidden_layers; ++l)
    block("layers." + std::to_string(l) + ".", c.compress_ratio(l), c.is_hash_layer(l));
  add("norm.weight", DType::BF16, {D});
  add("head.weight", DType::BF16, {V, D});
  add("hc_head_fn", DType::F32, {HC, hcd});
  add("hc_head_base", DType::F32, {HC});
  add("hc_head_scale", DType::F32, {1});
  if (with_drafter && c.dspark.present) {  // docs/dspark.md
    const int n = c.dspark.n_stages;
    const int64_t T = int64_t(c.dspark.target_layer_ids.size()), r = c.dspark.markov_rank;
    for (int k = 0; k < n; ++k) block("mtp." + std::to_string(k) + ".", c.compress_ratio(c.num_hidden_layers + k), false);
    fp8("mtp.0.main_proj", D, T * D);
    add("mtp.0.main_norm.weight", DType::BF16, {D});
    const std::string p = "mtp." + std::to_string(n - 1) + ".";
    add(p + "norm.weight", DType::BF16, {D});
    add(p + "hc_head_fn", DType::F32, {HC, hcd});
    add(p + "hc_head_base", DType::F32, {HC});
    add(p + "hc_head_scale", DType::F32, {1});
    add(p + "markov_head.markov_w1.weight", DType::BF16, {V, r});
    add(p + "markov_head.markov_w2.weight", DType::BF16, {V, r});
    add(p + "confidence_head.proj.weight", DType::BF16, {1, D + r});
  }
  if (with_drafter)
    for (int k = 0; k < c.num_mtp_layers(); ++k) {
      const std::string p = "mtp." + std::to_string(k) + ".";
      block(p, c.compress_ratio(c.num_hidden_layers + k), false);
      fp8(p + "e_proj", D, D);
      fp8(p + "h_proj", D, D);
      add(p + "enorm.weight", DType::BF16, {D});
      add(p + "hnorm.weight", DType::BF16, {D});
      add(p + "norm.weight", DType::BF16, {D});
      add(p + "hc_head_fn", DType::F32, {HC, hcd});
      add(p + "hc_head_base", DType::F32, {HC});
      add(p + "hc_head_scale", DType::F32, {1});
    }
  return t;
}

}  // namespace dsv4
