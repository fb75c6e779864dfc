// bind_weights on generated replicas: tiny model with real data (formats, dequant), full-size sparse Flash / Pro /
// 0731 replicas (every official tensor name, params and bytes of spec §2.4 / §10.1).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <cstring>

#include "common/replica.h"
#include "core/error.h"
#include "format/dtype.h"
#include "format/numeric.h"
#include "loader/config.h"
#include "loader/safetensors.h"
#include "loader/summary.h"
#include "loader/weights.h"

namespace dsv4 {
namespace {
using namespace dsv4::testing;

nlohmann::json flash_json() { return read_json_file(configs_dir() / "deepseek-v4-flash-config.json"); }

struct Tiny {
  TempDir dir;
  nlohmann::json cfg_json = tiny_config(flash_json());
  ModelConfig cfg;
  std::unique_ptr<SafetensorsSet> set;
  Tiny() {
    ReplicaOptions o;
    o.n_shards = 3;
    o.fill = [](const ReplicaTensor& t, uint8_t* d) { fill_pattern(t, d); };
    write_replica(dir.path, cfg_json, v4_layout(cfg_json), o);
    cfg = load_config(dir.path / "config.json");
    set = std::make_unique<SafetensorsSet>(SafetensorsSet::open(dir.path));
  }
};

TEST(Weights, TinyBindsEveryRole) {
  Tiny t;
  const ModelWeights w = bind_weights(*t.set, t.cfg);
  ASSERT_EQ(w.layers.size(), 5u);
  ASSERT_EQ(w.mtp.size(), 1u);
  EXPECT_EQ(w.embed.fmt, WeightFormat::BF16);
  EXPECT_EQ(w.embed.rows, 300);
  EXPECT_EQ(w.embed.cols, 64);
  EXPECT_EQ(w.norm.rows, 1);
  EXPECT_EQ(w.norm.cols, 64);
  EXPECT_EQ(w.hc_head_fn.fmt, WeightFormat::F32);
  EXPECT_EQ(w.hc_head_fn.rows, 4);
  EXPECT_EQ(w.hc_head_fn.cols, 256);
  for (int l = 0; l < 5; ++l) {
    const auto& L = w.layers[l];
    const int m = std::vector<int>{0, 0, 4, 128, 4}[l];
    EXPECT_EQ(L.compress_ratio, m);
    EXPECT_EQ(L.hash, l < 3);
    EXPECT_EQ(L.ffn.tid2eid.bound(), l < 3);
    EXPECT_EQ(L.ffn.gate_bias.bound(), l >= 3);
    EXPECT_EQ(L.attn.has_compressor, m > 0);
    EXPECT_EQ(L.attn.has_indexer, m == 4);
    EXPECT_EQ(L.hc_attn_fn.rows, 24);
    EXPECT_EQ(L.attn.wq_a.fmt, WeightFormat::FP8_BLOCK128);
    EXPECT_EQ(L.attn.wq_a.rows, 40);
    EXPECT_EQ(L.attn.wq_a.cols, 64);
    EXPECT_EQ(L.attn.wq_a.scale->shape, (std::vector<int64_t>{3, 4}));  // ceil(40/16) partial edge block
    EXPECT_EQ(L.attn.wo_a.rows, 2 * 24);
    EXPECT_EQ(L.attn.wo_a.cols, 2 * 32);
    ASSERT_EQ(L.ffn.experts.size(), 8u);
    EXPECT_EQ(L.ffn.experts[7].w2.fmt, WeightFormat::FP4_BLOCK32);
    EXPECT_EQ(L.ffn.experts[7].w2.rows, 64);
    EXPECT_EQ(L.ffn.experts[7].w2.cols, 32);
    EXPECT_EQ(L.ffn.experts[7].w2.row_bytes(), 16u);
    if (m == 4) {
      EXPECT_EQ(L.attn.compressor.ape.rows, 4);
      EXPECT_EQ(L.attn.compressor.ape.cols, 64);
      EXPECT_EQ(L.attn.indexer.compressor.wkv.rows, 32);
      EXPECT_EQ(L.attn.indexer.wq_b.rows, 32);
    }
    if (m == 128) {
      EXPECT_EQ(L.attn.compressor.ape.cols, 32);
    }
  }
  EXPECT_EQ(w.mtp[0].block.layer, 5);
  EXPECT_FALSE(w.mtp[0].block.hash);
  EXPECT_TRUE(w.mtp[0].block.ffn.gate_bias.bound());
  EXPECT_EQ(w.mtp[0].e_proj.fmt, WeightFormat::FP8_BLOCK128);
  EXPECT_EQ(w.layers[0].ffn.tid2eid.fmt, WeightFormat::I64);
  int n = 0;
  for_each_weight(w, [&](const WeightRef& r) {
    EXPECT_TRUE(r.bound());
    ++n;
  });
  // every non-scale tensor is visited exactly once
  int non_scale = 0;
  for (const auto& ti : t.set->tensors()) non_scale += ti.name.size() < 6 || ti.name.substr(ti.name.size() - 6) != ".scale";
  EXPECT_EQ(n, non_scale);
}

TEST(Weights, DequantMatchesSpecFormulas) {
  Tiny t;
  const ModelWeights w = bind_weights(*t.set, t.cfg);
  // FP8: W[r,c] = e4m3(Q[r,c]) * 2^(S[r/16, c/16] - 127)
  const WeightRef& q = w.layers[1].attn.wq_a;
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) {
      const uint8_t code = q.w->data[r * 64 + c];
      const uint8_t s = q.scale->data[(r / 16) * 4 + c / 16];
      const float want = e4m3fn_to_float(code) * std::ldexp(1.0f, int(s) - 127);
      const float got = dequant(q, r, c);
      if (std::isnan(want)) EXPECT_TRUE(std::isnan(got));
      else ASSERT_EQ(got, want) << r << "," << c;
    }
  // FP4: element 2j = low nibble, 2j+1 = high nibble, scale per 32 along the row
  const WeightRef& e = w.layers[2].ffn.experts[3].w1;  // [32, 64] logical
  std::vector<float> row(64);
  for (int64_t r = 0; r < e.rows; ++r) {
    dequant_row(e, r, row);
    for (int64_t c = 0; c < 64; ++c) {
      const uint8_t byte = e.w->data[r * 32 + c / 2];
      const uint8_t nib = c % 2 == 0 ? (byte & 15) : (byte >> 4);
      const uint8_t s = e.scale->data[r * 2 + c / 32];
      ASSERT_EQ(row[c], e2m1_to_float(nib) * std::ldexp(1.0f, int(s) - 127)) << r << "," << c;
    }
  }
  // BF16 / F32 / I64
  const WeightRef& nrm = w.layers[0].attn_norm;
  uint16_t h;
  std::memcpy(&h, nrm.w->data + 2 * 5, 2);
  EXPECT_EQ(float_to_bits(dequant(nrm, 0, 5)), float_to_bits(bf16_to_float(h)));
  const auto sink = dequant_all(w.layers[0].attn.attn_sink);
  ASSERT_EQ(sink.size(), 4u);
  float f;
  std::memcpy(&f, w.layers[0].attn.attn_sink.w->data + 4 * 3, 4);
  EXPECT_EQ(sink[3], f);
  const WeightRef& tid = w.layers[1].ffn.tid2eid;
  for (int64_t r = 0; r < 300; r += 37)
    for (int64_t k = 0; k < 2; ++k) {
      const int64_t v = read_int(tid, r, k);
      EXPECT_GE(v, 0);
      EXPECT_LT(v, 8);
    }
  // dequant_row (fast loops) == dequant (element formula) for every format, incl. partial edge blocks (cols 40)
  for (const WeightRef* x : {&w.layers[0].attn.wq_b, &w.layers[2].attn.wq_a, &w.layers[4].ffn.experts[1].w2,
                             &w.embed, &w.layers[3].attn.compressor.ape, &w.mtp[0].h_proj}) {
    std::vector<float> rr(x->cols);
    for (int64_t r = 0; r < x->rows; r += 3) {
      dequant_row(*x, r, rr);
      for (int64_t c = 0; c < x->cols; ++c)
        ASSERT_EQ(float_to_bits(rr[c]), float_to_bits(dequant(*x, r, c))) << x->w->name << " " << r << "," << c;
    }
  }
  EXPECT_EQ(w.layers[0].attn.wq_b.cols, 40);
  EXPECT_THROW(read_int(nrm, 0, 0), Error);
  EXPECT_THROW(dequant(q, 40, 0), Error);
  EXPECT_THROW(dequant_row(q, 0, std::span<float>(row.data(), 10)), Error);
}

// An FP8 weight whose scale is F32 (Flash-Base style) and data placed at odd (unaligned) offsets.
TEST(Weights, F32ScalesAndUnalignedData) {
  TempDir d;
  auto cj = tiny_config(flash_json());
  auto layout = v4_layout(cj);
  // Turn every FP8 scale into F32 (Flash-Base), keeping E8M0 for the FP4 experts.
  for (auto& t : layout)
    if (t.dtype == "F8_E8M0" && t.name.find(".experts.") == std::string::npos) t.dtype = "F32";
  ReplicaOptions o;
  o.unaligned = true;
  o.n_shards = 2;
  o.fill = [](const ReplicaTensor& t, uint8_t* p) {
    if (t.dtype == "F32" && t.name.size() > 6 && t.name.substr(t.name.size() - 6) == ".scale") {
      for (uint64_t i = 0; i < t.nbytes() / 4; ++i) {
        const float v = 0.25f * float(1 + i % 5);
        std::memcpy(p + 4 * i, &v, 4);
      }
    } else {
      fill_pattern(t, p);
    }
  };
  write_replica(d.path, cj, layout, o);
  const ModelConfig cfg = load_config(d.path / "config.json");
  const SafetensorsSet set = SafetensorsSet::open(d.path);
  const ModelWeights w = bind_weights(set, cfg);
  const WeightRef& q = w.layers[0].attn.wq_b;  // [128, 40]
  EXPECT_EQ(q.scale_dtype, DType::F32);
  EXPECT_EQ(q.scale->shape, (std::vector<int64_t>{8, 3}));
  for (int64_t r = 0; r < q.rows; r += 5)
    for (int64_t c = 0; c < q.cols; ++c) {
      const float want = e4m3fn_to_float(q.w->data[r * 40 + c]) * (0.25f * float(1 + ((r / 16) * 3 + c / 16) % 5));
      const float got = dequant(q, r, c);
      if (!std::isnan(want)) {
        ASSERT_EQ(got, want);
      }
    }
  bool some_unaligned = false;
  for (const auto& t : set.tensors()) some_unaligned |= (reinterpret_cast<uintptr_t>(t.data) % 4) != 0;
  EXPECT_TRUE(some_unaligned) << "test should exercise unaligned tensor data";
}

struct Expect {
  const char* config;
  int64_t params_main;
  uint64_t bytes_total;
  size_t n_layers;
  size_t n_mtp;
};

void check_full(const Expect& x) {
  TempDir d;
  const auto cj = read_json_file(configs_dir() / x.config);
  const uint64_t written = write_replica(d.path, cj, v4_layout(cj));
  const ModelConfig cfg = load_config(d.path / "config.json");
  const SafetensorsSet set = SafetensorsSet::open(d.path);
  EXPECT_EQ(set.files().size(), 46u);
  const ModelWeights w = bind_weights(set, cfg);
  EXPECT_EQ(w.layers.size(), x.n_layers);
  EXPECT_EQ(w.mtp.size(), x.n_mtp);
  const CheckpointSummary s = summarize(set, cfg, w);
  EXPECT_EQ(s.params_main, x.params_main) << x.config;
  EXPECT_EQ(s.bytes_total, x.bytes_total) << x.config;
  EXPECT_EQ(written, x.bytes_total);
  EXPECT_EQ(set.total_bytes(), x.bytes_total);
}

TEST(Weights, FullFlashReplica) { check_full({"deepseek-v4-flash-config.json", 284334567511, 159609485896ull, 43, 1}); }
TEST(Weights, FullProReplica) { check_full({"deepseek-v4-pro-config.json", 1572999528803, 864704792696ull, 61, 1}); }

// The full 0731 layout (sparse files): the main model is V4-Flash's, and the binder takes the drafter tensors that
// reproduce the census of the official 0731 headers (docs/dspark.md): 4,705 mtp.* tensors, I8 2,304, F8_E4M3 25,
// F8_E8M0 2,329, BF16 20, F32 27; 1,568 / 1,565 / 1,572 per stage.
TEST(Weights, Full0731ReplicaDrafterCensus) {
  TempDir d;
  const auto cj = read_json_file(configs_dir() / "deepseek-v4-flash-0731-config.json");
  (void)write_replica(d.path, cj, v4_layout(cj));
  const ModelConfig cfg = load_config(d.path / "config.json");
  const SafetensorsSet set = SafetensorsSet::open(d.path);
  const ModelWeights w = bind_weights(set, cfg);
  ASSERT_TRUE(w.dspark.bound());
  EXPECT_EQ(w.dspark.stages.size(), 3u);
  EXPECT_EQ(w.dspark.main_proj.rows, 4096);
  EXPECT_EQ(w.dspark.main_proj.cols, 12288);
  EXPECT_EQ(w.dspark.main_proj.scale->shape, (std::vector<int64_t>{32, 96}));
  EXPECT_EQ(w.dspark.markov_w1.rows, 129280);
  EXPECT_EQ(w.dspark.markov_w2.cols, 256);
  EXPECT_EQ(w.dspark.confidence.cols, 4352);
  std::map<std::string, int64_t> by_dtype;
  int64_t per_stage[3] = {0, 0, 0}, n = 0;
  for (const auto& t : set.tensors()) {
    if (t.name.rfind("mtp.", 0) != 0) continue;
    ++n;
    ++by_dtype[std::string(dtype_name(t.dtype))];
    ++per_stage[t.name[4] - '0'];
  }
  EXPECT_EQ(n, 4705);
  EXPECT_EQ(by_dtype, (std::map<std::string, int64_t>{
                          {"BF16", 20}, {"F32", 27}, {"F8_E4M3", 25}, {"F8_E8M0", 2329}, {"I8", 2304}}));
  EXPECT_EQ(per_stage[0], 1568);
  EXPECT_EQ(per_stage[1], 1565);
  EXPECT_EQ(per_stage[2], 1572);
  const CheckpointSummary s = summarize(set, cfg, w);
  EXPECT_EQ(s.params_main, 284334567511);  // the backbone is V4-Flash's
}

TEST(Weights, Dspark0731DrafterBound) {
  TempDir d;
  auto cj = tiny_config(flash_json());
  cj["compress_ratios"] = {0, 0, 4, 128, 4, 0, 0, 0};
  cj["dspark_block_size"] = 5;
  cj["dspark_target_layer_ids"] = {2, 3, 4};
  cj["dspark_markov_rank"] = 16;
  cj["dspark_noise_token_id"] = 299;
  ReplicaOptions o;
  o.n_shards = 2;
  write_replica(d.path, cj, v4_layout(cj), o);
  const ModelConfig cfg = load_config(d.path / "config.json");
  EXPECT_EQ(cfg.dspark.n_stages, 3);
  const SafetensorsSet set = SafetensorsSet::open(d.path);
  const ModelWeights w = bind_weights(set, cfg);
  EXPECT_TRUE(w.mtp.empty());
  ASSERT_TRUE(w.dspark.bound());
  ASSERT_EQ(w.dspark.stages.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(w.dspark.stages[size_t(k)].layer, 5 + k);
    EXPECT_FALSE(w.dspark.stages[size_t(k)].hash);
    EXPECT_TRUE(w.dspark.stages[size_t(k)].ffn.gate_bias.bound());
  }
  EXPECT_EQ(w.dspark.main_proj.fmt, WeightFormat::FP8_BLOCK128);
  EXPECT_EQ(w.dspark.main_proj.cols, 3 * 64);
  EXPECT_EQ(w.dspark.markov_w1.rows, 300);
  EXPECT_EQ(w.dspark.markov_w1.cols, 16);
  EXPECT_EQ(w.dspark.confidence.cols, 64 + 16);
  // 0731's census: one stage = the tensors of a ratio-0 non-hash block; stage 0 + 3, the last + 7 (docs/dspark.md)
  int64_t n_mtp = 0;
  for (const auto& t : set.tensors()) n_mtp += t.name.rfind("mtp.", 0) == 0;
  int64_t per_block = 0;
  for (const auto& t : v4_layout(cj))
    if (t.name.rfind("layers.0.", 0) == 0 && t.name.find("tid2eid") == std::string::npos) ++per_block;
  EXPECT_EQ(n_mtp, 3 * (per_block + 1) + 3 + 7);  // + 1: the gate bias layer 0 (hash) does not have
}

}  // namespace
}  // namespace dsv4
