// Test helper: writes a replica of a DeepSeek V4 checkpoint folder (config.json, sharded safetensors files,
// model.safetensors.index.json) whose tensor names / dtypes / shapes follow the checkpoint layout of spec §3,
// generated from a config.json (so V4-Flash, V4-Pro and tiny test configs share one code path).
// Data regions are holes (ftruncate) unless a filler is given, so a full-size Flash replica costs a few MB on disk.
// Hooks let tests corrupt individual shard headers and the index. Header-only (tests/common).
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsv4::testing {

struct ReplicaTensor {
  std::string name;
  std::string dtype;             // safetensors dtype string
  std::vector<int64_t> shape;

  uint64_t nbytes() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= uint64_t(d);
    const uint64_t es = dtype == "F32" || dtype == "I32" ? 4 : dtype == "I64" ? 8 : dtype == "BF16" || dtype == "F16" ? 2 : 1;
    return n * es;
  }
};

// Tensor table of spec §3 (3.1 global, 3.2 every layer, 3.3 ratio-4 extras, 3.4 ratio-128 extras, 3.5 MTP), derived
// from the HF config fields. FP8 linears: F8_E4M3 + F8_E8M0 scale on the weight_block_size grid (ceil division);
// routed experts: I8 packed FP4 [out, in/2] + F8_E8M0 [out, in/32]; hash layers carry tid2eid (I64); others gate.bias.
// When the config has dspark_* keys, the mtp.* tensors are the DSpark drafter of docs/dspark.md instead of MTP: one
// window-only block per compress_ratios entry after the main layers, mtp.0 main_proj / main_norm, the last stage's
// norm, hc_head_*, Markov head and confidence projection.
inline std::vector<ReplicaTensor> v4_layout(const nlohmann::json& c) {
  std::vector<ReplicaTensor> t;
  const int64_t V = c["vocab_size"], D = c["hidden_size"], L = c["num_hidden_layers"], H = c["num_attention_heads"];
  const int64_t Dh = c["head_dim"], QL = c["q_lora_rank"], OL = c["o_lora_rank"], G = c["o_groups"];
  const int64_t E = c["n_routed_experts"], I = c["moe_intermediate_size"], K = c["num_experts_per_tok"];
  const int64_t NS = c.value("n_shared_experts", 1), HC = c["hc_mult"], NH = c.value("num_hash_layers", 0);
  const int64_t IH = c.value("index_n_heads", 0), IDh = c.value("index_head_dim", 0);
  const int64_t MTP = c.value("num_nextn_predict_layers", 0);
  int64_t br = 128, bc = 128;
  if (c.contains("quantization_config") && c["quantization_config"].contains("weight_block_size")) {
    br = c["quantization_config"]["weight_block_size"][0];
    bc = c["quantization_config"]["weight_block_size"][1];
  }
  bool dspark = false;
  for (auto it = c.begin(); it != c.end(); ++it) dspark |= it.key().rfind("dspark_", 0) == 0;
  const std::vector<int64_t> ratios = c["compress_ratios"].get<std::vector<int64_t>>();
  const int64_t mix = (2 + HC) * HC, hcd = HC * D;

  auto add = [&](std::string n, std::string dt, std::vector<int64_t> s) { t.push_back({std::move(n), std::move(dt), std::move(s)}); };
  auto fp8 = [&](const std::string& p, int64_t out, int64_t in) {
    add(p + ".weight", "F8_E4M3", {out, in});
    add(p + ".scale", "F8_E8M0", {(out + br - 1) / br, (in + bc - 1) / bc});
  };
  auto fp4 = [&](const std::string& p, int64_t out, int64_t in) {
    add(p + ".weight", "I8", {out, in / 2});
    add(p + ".scale", "F8_E8M0", {out, in / 32});
  };
  auto block = [&](const std::string& p, int64_t ratio, bool hash) {
    for (const char* s : {"attn", "ffn"}) {
      add(p + "hc_" + s + "_fn", "F32", {mix, hcd});
      add(p + "hc_" + s + "_base", "F32", {mix});
      add(p + "hc_" + s + "_scale", "F32", {3});
    }
    add(p + "attn_norm.weight", "BF16", {D});
    add(p + "ffn_norm.weight", "BF16", {D});
    add(p + "attn.attn_sink", "F32", {H});
    fp8(p + "attn.wq_a", QL, D);
    add(p + "attn.q_norm.weight", "BF16", {QL});
    fp8(p + "attn.wq_b", H * Dh, QL);
    fp8(p + "attn.wkv", Dh, D);
    add(p + "attn.kv_norm.weight", "BF16", {Dh});
    fp8(p + "attn.wo_a", G * OL, H / G * Dh);
    fp8(p + "attn.wo_b", D, G * OL);
    auto comp = [&](const std::string& q, int64_t m, int64_t w) {
      const int64_t coff = m == 4 ? 2 : 1;
      add(q + "ape", "F32", {m, coff * w});
      add(q + "wkv.weight", "BF16", {coff * w, D});
      add(q + "wgate.weight", "BF16", {coff * w, D});
      add(q + "norm.weight", "BF16", {w});
    };
    if (ratio > 0) comp(p + "attn.compressor.", ratio, Dh);
    if (ratio == 4) {
      fp8(p + "attn.indexer.wq_b", IH * IDh, QL);
      add(p + "attn.indexer.weights_proj.weight", "BF16", {IH, D});
      comp(p + "attn.indexer.compressor.", 4, IDh);
    }
    add(p + "ffn.gate.weight", "BF16", {E, D});
    if (hash) add(p + "ffn.gate.tid2eid", "I64", {V, K});
    else add(p + "ffn.gate.bias", "F32", {E});
    fp8(p + "ffn.shared_experts.w1", NS * I, D);
    fp8(p + "ffn.shared_experts.w3", NS * I, D);
    fp8(p + "ffn.shared_experts.w2", D, NS * I);
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + "ffn.experts." + std::to_string(e) + ".";
      fp4(x + "w1", I, D);
      fp4(x + "w3", I, D);
      fp4(x + "w2", D, I);
    }
  };
  add("embed.weight", "BF16", {V, D});
  for (int64_t l = 0; l < L; ++l) block("layers." + std::to_string(l) + ".", ratios.at(l), l < NH);
  add("norm.weight", "BF16", {D});
  add("head.weight", "BF16", {V, D});
  add("hc_head_fn", "F32", {HC, hcd});
  add("hc_head_base", "F32", {HC});
  add("hc_head_scale", "F32", {1});
  if (dspark) {
    const int64_t S = int64_t(ratios.size()) - L, T = int64_t(c["dspark_target_layer_ids"].size());
    const int64_t r = c["dspark_markov_rank"];
    for (int64_t k = 0; k < S; ++k) block("mtp." + std::to_string(k) + ".", ratios.at(L + k), false);
    fp8("mtp.0.main_proj", D, T * D);
    add("mtp.0.main_norm.weight", "BF16", {D});
    const std::string p = "mtp." + std::to_string(S - 1) + ".";
    add(p + "norm.weight", "BF16", {D});
    add(p + "hc_head_fn", "F32", {HC, hcd});
    add(p + "hc_head_base", "F32", {HC});
    add(p + "hc_head_scale", "F32", {1});
    add(p + "markov_head.markov_w1.weight", "BF16", {V, r});
    add(p + "markov_head.markov_w2.weight", "BF16", {V, r});
    add(p + "confidence_head.proj.weight", "BF16", {1, D + r});
  } else {
    for (int64_t k = 0; k < MTP; ++k) {
      const std::string p = "mtp." + std::to_string(k) + ".";
      block(p, ratios.at(L + k), false);
      fp8(p + "e_proj", D, D);
      fp8(p + "h_proj", D, D);
      add(p + "enorm.weight", "BF16", {D});
      add(p + "hnorm.weight", "BF16", {D});
      add(p + "norm.weight", "BF16", {D});
      add(p + "hc_head_fn", "F32", {HC, hcd});
      add(p + "hc_head_base", "F32", {HC});
      add(p + "hc_head_scale", "F32", {1});
    }
  }
  return t;
}

struct ReplicaOptions {
  int n_shards = 46;
  // Fill a tensor's bytes (size t.nbytes()); when empty the data regions are holes (sparse files).
  std::function<void(const ReplicaTensor& t, uint8_t* data)> fill;
  // Edit a shard's header JSON before it is written (corruption tests). Offsets are already assigned.
  std::function<void(int shard, nlohmann::json& header)> edit_header;
  // Edit the index JSON before it is written.
  std::function<void(nlohmann::json& index)> edit_index;
  // Pad the header so that the data region starts at an odd offset (1 mod 8) instead of 8-aligned.
  bool unaligned = false;
};

inline std::string shard_name(int i, int n) {
  char b[64];
  std::snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", i + 1, n);
  return b;
}

// Write config.json, the shards and the index into `dir` (created). Returns the sum of tensor bytes.
inline uint64_t write_replica(const std::filesystem::path& dir, const nlohmann::json& config,
                              const std::vector<ReplicaTensor>& tensors, const ReplicaOptions& opt = {}) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.nbytes();
  // Contiguous runs of tensors, about total / n_shards bytes per shard.
  const int n = opt.n_shards;
  std::vector<int> shard_of(tensors.size());
  {
    uint64_t acc = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      int s = static_cast<int>((acc * uint64_t(n)) / (total ? total : 1));
      shard_of[i] = std::min(s, n - 1);
      acc += tensors[i].nbytes();
    }
  }
  nlohmann::json index;
  index["metadata"]["total_size"] = total;
  index["weight_map"] = nlohmann::json::object();
  for (int s = 0; s < n; ++s) {
    nlohmann::json h = nlohmann::json::object();
    h["__metadata__"] = {{"format", "pt"}};
    uint64_t off = 0;
    std::vector<size_t> mine;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (shard_of[i] != s) continue;
      const auto& t = tensors[i];
      h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.nbytes()}}};
      off += t.nbytes();
      mine.push_back(i);
      index["weight_map"][t.name] = shard_name(s, n);
    }
    if (opt.edit_header) opt.edit_header(s, h);
    std::string hs = h.dump();
    while ((8 + hs.size()) % 8 != (opt.unaligned ? 1u : 0u)) hs += ' ';  // data region 8-aligned like HF writers
    const std::filesystem::path p = dir / shard_name(s, n);
    int fd = ::open(p.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) throw std::runtime_error("cannot create " + p.string());
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t(hs.size()) >> (8 * i));
    bool ok = ::write(fd, len, 8) == 8 && ::write(fd, hs.data(), hs.size()) == ssize_t(hs.size());
    if (opt.fill) {
      std::vector<uint8_t> buf;
      for (size_t i : mine) {
        buf.assign(tensors[i].nbytes(), 0);
        opt.fill(tensors[i], buf.data());
        ok = ok && ::write(fd, buf.data(), buf.size()) == ssize_t(buf.size());
      }
    }
    ok = ok && ::ftruncate(fd, off_t(8 + hs.size() + off)) == 0;
    ::close(fd);
    if (!ok) throw std::runtime_error("cannot write " + p.string());
  }
  if (opt.edit_index) opt.edit_index(index);
  std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
  return total;
}

// A small V4-shaped config (5 layers: ratios 0,0,4,128,4 + 1 MTP with ratio 0; 3 hash layers; 8 experts) derived
// from the official Flash config, with a 16x16 FP8 block grid and q_lora 40 so that edge blocks are partial.
inline nlohmann::json tiny_config(const nlohmann::json& flash) {
  nlohmann::json c = flash;
  c["vocab_size"] = 300;
  c["hidden_size"] = 64;
  c["num_hidden_layers"] = 5;
  c["num_attention_heads"] = 4;
  c["head_dim"] = 32;
  c["qk_rope_head_dim"] = 8;
  c["q_lora_rank"] = 40;
  c["o_lora_rank"] = 24;
  c["o_groups"] = 2;
  c["sliding_window"] = 8;
  c["compress_ratios"] = {0, 0, 4, 128, 4, 0};
  c["n_routed_experts"] = 8;
  c["num_experts_per_tok"] = 2;
  c["moe_intermediate_size"] = 32;
  c["index_n_heads"] = 2;
  c["index_head_dim"] = 16;
  c["index_topk"] = 4;
  c["quantization_config"]["weight_block_size"] = {16, 16};
  return c;
}

// Deterministic contents for a tensor: valid E8M0 scales (120..134, never the NaN code), finite F32 values,
// tid2eid ids in [0, n_experts), arbitrary bytes elsewhere (FP8 / FP4 / BF16 codes).
inline void fill_pattern(const ReplicaTensor& t, uint8_t* d, int64_t n_experts = 8) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : t.name) h = (h ^ uint8_t(ch)) * 1099511628211ull;
  const uint64_t n = t.nbytes();
  if (t.dtype == "F8_E8M0") {
    for (uint64_t i = 0; i < n; ++i) d[i] = uint8_t(120 + (h + i * 7) % 15);
  } else if (t.dtype == "F32") {
    for (uint64_t i = 0; i < n / 4; ++i) {
      const float v = float(int64_t((h + i * 2654435761ull) % 2001) - 1000) / 256.0f;
      std::memcpy(d + 4 * i, &v, 4);
    }
  } else if (t.dtype == "I64") {
    for (uint64_t i = 0; i < n / 8; ++i) {
      const int64_t v = int64_t((h + i) % uint64_t(n_experts));
      std::memcpy(d + 8 * i, &v, 8);
    }
  } else {
    for (uint64_t i = 0; i < n; ++i) d[i] = uint8_t((h >> (8 * (i % 7))) + i * 131);
  }
}

inline nlohmann::json read_json_file(const std::filesystem::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error("cannot read " + p.string());
  return nlohmann::json::parse(f);
}

inline std::filesystem::path configs_dir() { return std::filesystem::path(DSV4_SOURCE_DIR) / "tests/data/configs"; }

// A fresh temporary folder, removed on destruction.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/dsv4-test-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace dsv4::testing
