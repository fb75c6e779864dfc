// SafetensorsSet: layouts (sharded, single file), and every corrupt-input class producing a one-line dsv4::Error
// that names the file and the tensor.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>

#include "common/replica.h"
#include "core/error.h"
#include "loader/config.h"
#include "loader/safetensors.h"
#include "loader/weights.h"

namespace dsv4 {
namespace {
using namespace dsv4::testing;
namespace fs = std::filesystem;

nlohmann::json tiny_json() { return tiny_config(read_json_file(configs_dir() / "deepseek-v4-flash-config.json")); }

// Opens the folder and binds it; returns the error message ("" if it loaded).
std::string load_error(const fs::path& dir) {
  try {
    const ModelConfig cfg = load_config(dir / "config.json");
    const SafetensorsSet set = SafetensorsSet::open(dir);
    bind_weights(set, cfg);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_one_line(const std::string& msg, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(msg.empty()) << "expected an error";
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

struct Corrupt {
  TempDir dir;
  ReplicaOptions opt;
  std::vector<ReplicaTensor> layout = v4_layout(tiny_json());
  Corrupt() {
    opt.n_shards = 3;
    opt.fill = [](const ReplicaTensor& t, uint8_t* d) { fill_pattern(t, d); };
  }
  void write() { write_replica(dir.path, tiny_json(), layout, opt); }
  fs::path shard(int i) const { return dir.path / shard_name(i, 3); }
};

TEST(Safetensors, ShardedAndSingleFile) {
  Corrupt c;
  c.write();
  const SafetensorsSet set = SafetensorsSet::open(c.dir.path);
  EXPECT_EQ(set.files().size(), 3u);
  EXPECT_EQ(set.tensors().size(), c.layout.size());
  uint64_t total = 0;
  for (const auto& t : c.layout) total += t.nbytes();
  EXPECT_EQ(set.total_bytes(), total);
  const TensorInfo* t = set.find("layers.2.attn.wq_a.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::F8_E4M3);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{40, 64}));
  EXPECT_EQ(t->nbytes, 40u * 64);
  // data pointer holds exactly the filled bytes
  std::vector<uint8_t> want(t->nbytes);
  fill_pattern({t->name, "F8_E4M3", t->shape}, want.data());
  EXPECT_EQ(std::memcmp(want.data(), t->data, t->nbytes), 0);
  EXPECT_EQ(set.find("nope"), nullptr);
  try {
    set.get("layers.9.nope");
    FAIL();
  } catch (const Error& e) {
    expect_one_line(e.what(), {"missing tensor 'layers.9.nope'"});
  }
  // Move keeps the lookups valid.
  SafetensorsSet moved = SafetensorsSet::open(c.dir.path);
  SafetensorsSet other = std::move(moved);
  ASSERT_NE(other.find("embed.weight"), nullptr);
  EXPECT_EQ(other.find("embed.weight")->shape[0], 300);

  // Single model.safetensors: one shard, no index.
  TempDir single;
  ReplicaOptions o = c.opt;
  o.n_shards = 1;
  write_replica(single.path, tiny_json(), c.layout, o);
  fs::remove(single.path / "model.safetensors.index.json");
  fs::rename(single.path / shard_name(0, 1), single.path / "model.safetensors");
  const SafetensorsSet s1 = SafetensorsSet::open(single.path);
  EXPECT_EQ(s1.tensors().size(), c.layout.size());
  EXPECT_EQ(load_error(single.path), "");
  // ...and the file itself
  EXPECT_EQ(SafetensorsSet::open(single.path / "model.safetensors").tensors().size(), c.layout.size());
  // An empty folder
  TempDir empty;
  expect_one_line([&] {
    try { SafetensorsSet::open(empty.path); } catch (const Error& e) { return std::string(e.what()); }
    return std::string();
  }(), {empty.path.string(), "no model.safetensors"});
}

TEST(Safetensors, TruncatedShard) {
  Corrupt c;
  c.write();
  const auto size = fs::file_size(c.shard(1));
  fs::resize_file(c.shard(1), size - 10);
  expect_one_line(load_error(c.dir.path), {shard_name(1, 3), "tensor '", "out of range"});
  fs::resize_file(c.shard(1), 5);
  expect_one_line(load_error(c.dir.path), {shard_name(1, 3), "truncated"});
}

TEST(Safetensors, HeaderLengthPastEof) {
  Corrupt c;
  c.write();
  const uint64_t size = fs::file_size(c.shard(2));
  int fd = ::open(c.shard(2).c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(size >> (8 * i));
  ASSERT_EQ(::pwrite(fd, len, 8, 0), 8);
  ::close(fd);
  expect_one_line(load_error(c.dir.path), {shard_name(2, 3), "header length", "past the end"});
}

// Edit one tensor's header entry in whichever shard holds it.
void edit_tensor(Corrupt& c, const std::string& name, std::function<void(nlohmann::json&, nlohmann::json&)> f) {
  c.opt.edit_header = [name, f](int, nlohmann::json& h) {
    if (h.contains(name)) f(h[name], h);
  };
}

TEST(Safetensors, OffsetsOutOfRange) {
  Corrupt c;
  edit_tensor(c, "layers.1.attn.wkv.weight", [](nlohmann::json& t, nlohmann::json&) {
    const uint64_t n = t["data_offsets"][1].get<uint64_t>() - t["data_offsets"][0].get<uint64_t>();
    t["data_offsets"] = {uint64_t(1) << 40, (uint64_t(1) << 40) + n};
  });
  c.write();
  expect_one_line(load_error(c.dir.path), {"model-0000", "tensor 'layers.1.attn.wkv.weight'", "out of range"});
}

TEST(Safetensors, Overlapping) {
  Corrupt c;
  c.opt.edit_header = [](int, nlohmann::json& h) {
    const std::string a = "layers.1.ffn.experts.2.w1.weight", b = "layers.1.ffn.experts.2.w3.weight";
    if (h.contains(a) && h.contains(b)) h[b]["data_offsets"] = h[a]["data_offsets"];
  };
  c.write();
  expect_one_line(load_error(c.dir.path), {"model-0000", "experts.2.w", "overlaps"});
}

TEST(Safetensors, WrongDtype) {
  Corrupt c;
  edit_tensor(c, "layers.0.attn_norm.weight", [](nlohmann::json& t, nlohmann::json&) { t["dtype"] = "F16"; });
  c.write();
  expect_one_line(load_error(c.dir.path),
                  {"layers.0.attn_norm.weight (model-0000", "is F16 [64], expected BF16|F32 [64]", "config.json"});
  Corrupt d;
  edit_tensor(d, "layers.0.attn_norm.weight", [](nlohmann::json& t, nlohmann::json&) { t["dtype"] = "Q4_K"; });
  d.write();
  expect_one_line(load_error(d.dir.path), {"model-0000", "tensor 'layers.0.attn_norm.weight'", "unsupported dtype 'Q4_K'"});
  // dtype whose size does not match the byte span
  Corrupt e;
  edit_tensor(e, "layers.0.attn_norm.weight", [](nlohmann::json& t, nlohmann::json&) { t["dtype"] = "F32"; });
  e.write();
  expect_one_line(load_error(e.dir.path), {"tensor 'layers.0.attn_norm.weight'", "needs 256 bytes but data_offsets span 128"});
}

TEST(Safetensors, WrongShape) {
  Corrupt c;
  edit_tensor(c, "layers.3.attn.wq_a.weight", [](nlohmann::json& t, nlohmann::json&) { t["shape"] = {64, 40}; });
  c.write();
  expect_one_line(load_error(c.dir.path), {"layers.3.attn.wq_a.weight", "is F8_E4M3 [64, 40]", "expected", "[40, 64]"});
  Corrupt s;  // scale grid not matching the 16x16 blocks (ceil division)
  edit_tensor(s, "layers.3.attn.wq_a.scale", [](nlohmann::json& t, nlohmann::json&) { t["shape"] = {4, 3}; });
  s.write();
  expect_one_line(load_error(s.dir.path), {"layers.3.attn.wq_a.scale", "[4, 3]", "expected F8_E8M0|F32 [3, 4]"});
  Corrupt n;  // negative / fractional dims
  edit_tensor(n, "norm.weight", [](nlohmann::json& t, nlohmann::json&) { t["shape"] = {-64}; });
  n.write();
  expect_one_line(load_error(n.dir.path), {"tensor 'norm.weight'", "invalid shape"});
}

TEST(Safetensors, MissingAndUnexpectedTensors) {
  Corrupt c;
  c.layout.erase(std::remove_if(c.layout.begin(), c.layout.end(),
                                [](const ReplicaTensor& t) { return t.name == "layers.4.attn.indexer.weights_proj.weight"; }),
                 c.layout.end());
  c.write();
  expect_one_line(load_error(c.dir.path), {"1 missing tensor(s): layers.4.attn.indexer.weights_proj.weight"});

  Corrupt u;
  u.layout.push_back({"layers.0.attn.bogus", "F32", {4}});
  u.layout.push_back({"layers.0.attn.wq_a.scale_inv", "F32", {4}});  // e.g. a DeepSeek-V3-style name
  u.write();
  expect_one_line(load_error(u.dir.path), {"2 unexpected tensor(s)", "layers.0.attn.bogus (model-0000"});

  Corrupt m;  // scale of an FP8 weight missing
  m.layout.erase(std::remove_if(m.layout.begin(), m.layout.end(),
                                [](const ReplicaTensor& t) { return t.name == "mtp.0.e_proj.scale"; }),
                 m.layout.end());
  m.write();
  expect_one_line(load_error(m.dir.path), {"missing tensor(s): mtp.0.e_proj.scale"});
}

TEST(Safetensors, Tid2eidOutOfRange) {
  Corrupt c;
  c.opt.fill = [](const ReplicaTensor& t, uint8_t* d) {
    fill_pattern(t, d);
    if (t.name == "layers.1.ffn.gate.tid2eid") {
      const int64_t bad = 8;  // == n_routed_experts
      std::memcpy(d + 8 * (2 * 77 + 1), &bad, 8);
    }
  };
  c.write();
  expect_one_line(load_error(c.dir.path), {"model-0000", "tensor 'layers.1.ffn.gate.tid2eid'", "token 77 maps to expert 8"});
}

TEST(Safetensors, MalformedIndex) {
  Corrupt c;
  c.write();
  std::ofstream(c.dir.path / "model.safetensors.index.json") << "{\"weight_map\": {\"a\": ";
  expect_one_line(load_error(c.dir.path), {"model.safetensors.index.json", "malformed index JSON"});
  std::ofstream(c.dir.path / "model.safetensors.index.json") << "{\"metadata\": {}}";
  expect_one_line(load_error(c.dir.path), {"model.safetensors.index.json", "weight_map"});
  std::ofstream(c.dir.path / "model.safetensors.index.json") << "{\"weight_map\": {\"norm.weight\": 3}}";
  expect_one_line(load_error(c.dir.path), {"model.safetensors.index.json", "tensor 'norm.weight'"});
  std::ofstream(c.dir.path / "model.safetensors.index.json") << "{\"weight_map\": {\"norm.weight\": \"../etc/x\"}}";
  expect_one_line(load_error(c.dir.path), {"model.safetensors.index.json", "invalid shard name"});
}

TEST(Safetensors, IndexPointsAtMissingShard) {
  Corrupt c;
  c.opt.edit_index = [](nlohmann::json& idx) { idx["weight_map"]["layers.2.ffn.gate.weight"] = "model-00007-of-00003.safetensors"; };
  c.write();
  expect_one_line(load_error(c.dir.path), {"model.safetensors.index.json", "tensor 'layers.2.ffn.gate.weight'",
                                           "model-00007-of-00003.safetensors", "does not exist"});
}

TEST(Safetensors, IndexInconsistentWithShards) {
  Corrupt a;  // listed in the index, absent from its shard
  a.opt.edit_index = [](nlohmann::json& idx) { idx["weight_map"]["layers.0.extra"] = shard_name(0, 3); };
  a.write();
  expect_one_line(load_error(a.dir.path), {shard_name(0, 3), "tensor 'layers.0.extra'", "absent from the shard"});
  Corrupt b;  // in a shard, not in the index
  b.opt.edit_index = [](nlohmann::json& idx) { idx["weight_map"].erase("head.weight"); };
  b.write();
  expect_one_line(load_error(b.dir.path), {"model-0000", "tensor 'head.weight'", "not listed"});
  Corrupt d;  // index names the wrong shard
  d.opt.edit_index = [](nlohmann::json& idx) {
    idx["weight_map"]["embed.weight"] = idx["weight_map"]["embed.weight"] == shard_name(0, 3) ? shard_name(1, 3) : shard_name(0, 3);
  };
  d.write();
  expect_one_line(load_error(d.dir.path), {"tensor 'embed.weight'", "index says"});
  Corrupt e;  // the same tensor in two shards
  e.opt.edit_header = [](int s, nlohmann::json& h) {
    if (s == 2) h["embed.weight"] = {{"dtype", "U8"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
  };
  e.write();
  expect_one_line(load_error(e.dir.path), {"tensor 'embed.weight'", "defined twice"});
}

TEST(Safetensors, HeaderStructureErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1,2]", "not a JSON object"},
      {"{\"a\": 5}", "tensor 'a': entry is not an object"},
      {"{\"a\": {\"shape\": [1], \"data_offsets\": [0, 2]}}", "tensor 'a': missing dtype"},
      {"{\"a\": {\"dtype\": \"BF16\", \"data_offsets\": [0, 2]}}", "tensor 'a': missing shape"},
      {"{\"a\": {\"dtype\": \"BF16\", \"shape\": [1]}}", "tensor 'a': data_offsets"},
      {"{\"a\": {\"dtype\": \"BF16\", \"shape\": [1], \"data_offsets\": [2, 0]}}", "tensor 'a': data_offsets [2, 0] are reversed"},
      {"{\"a\": {\"dtype\": \"BF16\", \"shape\": [1.5], \"data_offsets\": [0, 2]}}", "tensor 'a': invalid shape"},
      {"{\"a\": {\"dtype\": \"BF16\", \"shape\": [4611686018427387904, 4], \"data_offsets\": [0, 2]}}", "tensor 'a': shape too large"},
      {"{\"__metadata__\": 3}", "__metadata__"},
      {"{\"a\": ", "malformed safetensors header JSON"},
  };
  for (const auto& [h, want] : cases) {
    std::vector<TensorInfo> out;
    try {
      SafetensorsSet::parse_header(h, 8 + h.size() + 16, "f.safetensors", out);
      ADD_FAILURE() << "accepted: " << h;
    } catch (const Error& e) {
      expect_one_line(e.what(), {"f.safetensors: ", want});
    }
  }
  // A valid header with __metadata__ and a zero-size tensor.
  std::vector<TensorInfo> out;
  const std::string ok = R"({"__metadata__": {"format": "pt"}, "z": {"dtype": "F32", "shape": [0, 3], "data_offsets": [4, 4]},
    "a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})";
  SafetensorsSet::parse_header(ok, 8 + ok.size() + 4, "f", out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].name, "a");
  EXPECT_EQ(out[0].file_offset, 8 + ok.size());
}

}  // namespace
}  // namespace dsv4
