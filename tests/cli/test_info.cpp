// `dsv4 info` end to end: full-size sparse replicas of V4-Flash / V4-Pro (every official tensor, data as holes),
// exact parameter / byte totals (spec §2.4, §10.1), bounded peak RSS of the child, and one-line errors with exit 1
// on corrupt folders.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "common/replica.h"

namespace dsv4 {
namespace {
using namespace dsv4::testing;

struct RunResult {
  int exit_code = -1;
  std::string out, err;
  long max_rss_kib = 0;
};

// Run the dsv4 binary with `args`; stdout/stderr captured through files; rusage of exactly this child (wait4).
RunResult run_dsv4(const std::vector<std::string>& args, const std::filesystem::path& tmp) {
  const auto out_p = tmp / "stdout.txt", err_p = tmp / "stderr.txt";
  std::vector<std::string> argv_s{DSV4_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    int o = ::open(out_p.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    int e = ::open(err_p.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (o < 0 || e < 0) _exit(126);
    dup2(o, 1);
    dup2(e, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  RunResult r;
  int status = 0;
  struct rusage ru {};
  if (wait4(pid, &status, 0, &ru) != pid) return r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.max_rss_kib = ru.ru_maxrss;
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  r.out = slurp(out_p);
  r.err = slurp(err_p);
  return r;
}

void check_full_replica(const char* config, int64_t params_main, uint64_t bytes_total, int layers, int n_csa, int n_hca) {
  TempDir d;
  const auto cj = read_json_file(configs_dir() / config);
  const auto model = d.path / "model";
  write_replica(model, cj, v4_layout(cj));
  const RunResult r = run_dsv4({"info", "-m", model.string(), "--json"}, d.path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model_type"], "deepseek_v4");
  EXPECT_EQ(j["num_hidden_layers"], layers);
  EXPECT_EQ(j["compress_ratios"], cj["compress_ratios"]);
  EXPECT_EQ(j["params_main"].get<int64_t>(), params_main);
  EXPECT_EQ(j["bytes_total"].get<uint64_t>(), bytes_total);
  EXPECT_GT(j["params_total"].get<int64_t>(), params_main);  // + MTP
  EXPECT_EQ(j["layer_kinds"]["csa_ratio4"], n_csa);
  EXPECT_EQ(j["layer_kinds"]["hca_ratio128"], n_hca);
  EXPECT_EQ(j["quantization"]["expert_format"], "fp4_block32");
  EXPECT_EQ(j["quantization"]["dense_linear_format"], "fp8_block128");
  EXPECT_EQ(j["quantization"]["weight_block_size"], nlohmann::json({128, 128}));
  EXPECT_GT(j["state_bytes_per_token"].get<double>(), 0);
  EXPECT_GT(j["state_bytes_fixed_per_sequence"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["n_files"], 46);
  // The weights are mapped, never read: peak RSS of the child stays far below 1 GiB.
#ifdef __SANITIZE_ADDRESS__
  const long limit_kib = 1024 * 1024;  // ASan shadow memory + quarantine inflate RSS (Pro measured ~600 MiB)
#else
  const long limit_kib = 512 * 1024;   // Release: Flash ~75 MiB, Pro ~125 MiB (header JSON of 145k tensors)
#endif
  EXPECT_LT(r.max_rss_kib, limit_kib) << "peak RSS " << r.max_rss_kib << " KiB";
  ::testing::Test::RecordProperty("peak_rss_kib", std::to_string(r.max_rss_kib));
  std::printf("[ info     ] %s: dsv4 info peak RSS %ld KiB\n", config, r.max_rss_kib);
  // Human-readable form works on the same folder.
  const RunResult h = run_dsv4({"info", "-m", model.string()}, d.path);
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find("params"), std::string::npos);
  EXPECT_NE(h.out.find("B/token"), std::string::npos);
}

TEST(CliInfo, FlashReplica) {
  check_full_replica("deepseek-v4-flash-config.json", 284334567511, 159609485896ull, 43, 21, 20);
}

TEST(CliInfo, ProReplica) {
  check_full_replica("deepseek-v4-pro-config.json", 1572999528803, 864704792696ull, 61, 30, 31);
}

// Stored state sizes recomputed from the config (spec §6.1 row formats): KV row = nope e4m3 + nope/64 ue8m0 +
// rope bf16, padded to 4 B; indexer key row = idx/2 (e2m1) + idx/32 (ue8m0), padded to 4 B; the paged layout's
// page = per compressed layer 128/ratio rows (+ keys on ratio 4), slot = rings + fp32 frontiers.
void expect_state_sizes(const nlohmann::json& j, const nlohmann::json& cj) {
  const int64_t hd = cj["head_dim"], rope = cj["qk_rope_head_dim"], idx = cj["index_head_dim"];
  const int64_t window = cj["sliding_window"], n_layers = cj["num_hidden_layers"], n_ctx = cj["max_position_embeddings"];
  auto round4 = [](int64_t b) { return (b + 3) / 4 * 4; };
  const int64_t kv = round4((hd - rope) + (hd - rope) / 64 + 2 * rope), key = round4(idx / 2 + idx / 32);
  double per_tok = 0;
  uint64_t fixed = 0, page = 0, growing = 0;
  for (int64_t l = 0; l < n_layers; ++l) {
    const int64_t m = cj["compress_ratios"][size_t(l)];
    fixed += uint64_t(window * kv);
    if (m == 4) {
      per_tok += double(kv + key) / 4;
      fixed += uint64_t(2 * 8 * 2 * hd * 4 + 2 * 8 * 2 * idx * 4);
      page += uint64_t(32 * (kv + key));
      growing += uint64_t(n_ctx / 4 * (kv + key));
    } else if (m > 0) {
      per_tok += double(kv) / double(m);
      fixed += uint64_t(2 * m * hd * 4);
      page += uint64_t(128 / m * kv);
      growing += uint64_t(n_ctx / m * kv);
    }
  }
  EXPECT_EQ(j["state_formats"][0]["row_format"], "compact");
  EXPECT_EQ(j["state_formats"][0]["kv_row_bytes"].get<int64_t>(), kv);
  EXPECT_EQ(j["state_formats"][0]["key_row_bytes"].get<int64_t>(), key);
  EXPECT_DOUBLE_EQ(j["state_bytes_per_token"].get<double>(), per_tok);
  EXPECT_EQ(j["state_bytes_fixed_per_sequence"].get<uint64_t>(), fixed);
  EXPECT_EQ(j["state_bytes_per_sequence"].get<uint64_t>(), fixed + growing);
  EXPECT_EQ(j["paged_state"]["row_format"], "compact");
  EXPECT_EQ(j["paged_state"]["page_bytes"].get<uint64_t>(), page);
  EXPECT_DOUBLE_EQ(j["paged_state"]["bytes_per_token"].get<double>(), per_tok);
  EXPECT_EQ(j["paged_state"]["slot_bytes_per_sequence"].get<uint64_t>(), fixed);
  // fp32 rows take more
  EXPECT_GT(j["state_formats"][1]["bytes_per_token"].get<double>(), 3.5 * per_tok);
}

TEST(CliInfo, DemoStateSizesAsStored) {
  TempDir d;
  const auto demo = std::filesystem::path(DSV4_SOURCE_DIR) / "models/dsv4-demo";
  const auto cj = read_json_file(demo / "config.json");
  const RunResult r = run_dsv4({"info", "-m", demo.string(), "--json"}, d.path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  expect_state_sizes(j, cj);
  // demo: 2 CSA + 2 HCA layers, head_dim 128 (rope 64), index_head_dim 128: KV row 64 + 1 + 128 + 3 pad = 196 B
  EXPECT_EQ(j["state_formats"][0]["kv_row_bytes"], 196);
  EXPECT_EQ(j["state_bytes_per_token"].get<double>(), 2 * (196 + 68) / 4.0 + 2 * 196 / 128.0);
  EXPECT_EQ(j["state_formats"][1]["bytes_per_token"].get<double>(), 2 * (512 + 512) / 4.0 + 2 * 512 / 128.0);
  const RunResult h = run_dsv4({"info", "-m", demo.string()}, d.path);
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find("compact rows"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("135.06 B/token"), std::string::npos) << h.out;
}

TEST(CliInfo, FlashJsonDetails) {
  TempDir d;
  const auto cj = read_json_file(configs_dir() / "deepseek-v4-flash-config.json");
  write_replica(d.path / "m", cj, v4_layout(cj));
  const RunResult r = run_dsv4({"info", "-m", (d.path / "m").string(), "--json"}, d.path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  // compact rows (the CPU backend in reference numerics): spec §6.1 / §6.2 with the FP4 indexer cache
  expect_state_sizes(j, cj);
  EXPECT_EQ(j["state_row_format"], "compact");
  EXPECT_EQ(j["state_formats"][0]["kv_row_bytes"], 584);
  EXPECT_EQ(j["state_formats"][0]["key_row_bytes"], 68);
  EXPECT_EQ(j["state_bytes_per_token"].get<double>(), 3514.25);  // 21 * (584/4 + 68/4) + 20 * 584/128
  // fp32 rows (dense numerics, the CUDA backend): the first layout's numbers
  EXPECT_EQ(j["state_formats"][1]["row_format"], "f32");
  EXPECT_EQ(j["state_formats"][1]["bytes_per_token"].get<double>(), 13760.0);
  EXPECT_EQ(j["state_formats"][1]["bytes_fixed_per_sequence"].get<uint64_t>(), 23478272u);
  // the engine loop's paged layout (fp32 rows): 21 CSA x 32 x (512 + 128) x 4 + 20 HCA x 512 x 4 per 128 tokens;
  // slot = rings + frontiers (= the fixed state above); snapshot = rings + CSA frontier rows [0, 4)
  const auto& ps = j["paged_state_f32"];
  EXPECT_EQ(ps["row_format"], "f32");
  EXPECT_EQ(ps["page_tokens"], 128);
  EXPECT_EQ(ps["page_bytes"].get<uint64_t>(), 1761280u);
  EXPECT_EQ(ps["bytes_per_token"].get<double>(), 13760.0);
  EXPECT_EQ(ps["slot_bytes_per_sequence"].get<uint64_t>(), 23478272u);
  EXPECT_EQ(ps["snapshot_bytes"].get<uint64_t>(), 12132352u);
  EXPECT_EQ(j["num_mtp_layers"], 1);
  EXPECT_EQ(j["mtp_bound"], true);
  // spec §2.4: 290.94 B with MTP, 13.80 B active (incl. the input embedding)
  EXPECT_NEAR(j["params_total"].get<double>() / 1e9, 290.94, 0.005);
  EXPECT_NEAR(j["params_active"].get<double>() / 1e9, 13.80, 0.005);
  EXPECT_EQ(j["bytes_by_dtype"].size(), 6u);  // BF16, F32, F8_E4M3, F8_E8M0, I8, I64
  EXPECT_EQ(j["bytes_by_dtype"]["I64"].get<uint64_t>(), 3u * 129280 * 6 * 8);  // tid2eid of the 3 hash layers
}

void expect_cli_error(const std::filesystem::path& model, const std::filesystem::path& tmp,
                      std::initializer_list<std::string> parts) {
  const RunResult r = run_dsv4({"info", "-m", model.string()}, tmp);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.out, "");
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.rfind("dsv4: error: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "exactly one line: " << r.err;
  for (const auto& p : parts) EXPECT_NE(r.err.find(p), std::string::npos) << "'" << p << "' not in: " << r.err;
}

TEST(CliInfo, CorruptFoldersGiveOneLineErrors) {
  TempDir d;
  const auto cj = tiny_config(read_json_file(configs_dir() / "deepseek-v4-flash-config.json"));
  ReplicaOptions o;
  o.n_shards = 3;
  const auto m = d.path / "m";
  write_replica(m, cj, v4_layout(cj), o);
  ASSERT_EQ(run_dsv4({"info", "-m", m.string()}, d.path).exit_code, 0);

  // truncated shard
  const auto shard = m / shard_name(2, 3);
  const auto size = std::filesystem::file_size(shard);
  std::filesystem::resize_file(shard, size - 1);
  expect_cli_error(m, d.path, {shard_name(2, 3), "tensor '", "out of range"});
  std::filesystem::resize_file(shard, size);
  // malformed config
  std::ofstream(m / "config.json") << "{\"model_type\": ";
  expect_cli_error(m, d.path, {"config.json", "malformed config JSON"});
  std::ofstream(m / "config.json") << cj.dump();
  // missing tensor: drop it from the index and its shard header by rewriting with a smaller layout
  auto layout = v4_layout(cj);
  layout.erase(std::remove_if(layout.begin(), layout.end(), [](const auto& t) { return t.name == "layers.3.ffn.gate.bias"; }),
               layout.end());
  const auto m2 = d.path / "m2";
  write_replica(m2, cj, layout, o);
  expect_cli_error(m2, d.path, {"missing tensor(s): layers.3.ffn.gate.bias"});
  // malformed index
  std::ofstream(m / "model.safetensors.index.json") << "{\"weight_map\": [";
  expect_cli_error(m, d.path, {"model.safetensors.index.json", "malformed index JSON"});
  // not a folder at all
  expect_cli_error(d.path / "absent", d.path, {"absent", "config"});
}

TEST(CliInfo, DsparkDrafterIsReported) {
  TempDir d;
  auto cj = tiny_config(read_json_file(configs_dir() / "deepseek-v4-flash-config.json"));
  cj["compress_ratios"] = {0, 0, 4, 128, 4, 0, 0, 0};
  cj["dspark_block_size"] = 5;
  cj["dspark_target_layer_ids"] = {3, 4};
  cj["dspark_markov_rank"] = 16;
  cj["dspark_noise_token_id"] = 299;
  ReplicaOptions o;
  o.n_shards = 2;
  write_replica(d.path / "m", cj, v4_layout(cj), o);
  const RunResult r = run_dsv4({"info", "-m", (d.path / "m").string(), "--json"}, d.path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dspark_drafter"], true);
  EXPECT_EQ(j["drafter"], "dspark");
  EXPECT_EQ(j["max_spec_draft"], 5);
  EXPECT_EQ(j["dspark"]["stages"], 3);
  EXPECT_EQ(j["dspark"]["target_layer_ids"], nlohmann::json({3, 4}));
  EXPECT_EQ(j["num_mtp_layers"], 0);
  EXPECT_EQ(j["mtp_bound"], false);
  EXPECT_GT(j["params_mtp"].get<int64_t>(), 0);
  const RunResult t = run_dsv4({"info", "-m", (d.path / "m").string()}, d.path);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("drafter      DSpark (mtp.*): 3 stages, block 5, target layers 3,4, Markov rank 16"),
            std::string::npos)
      << t.out;
  EXPECT_NE(t.out.find("dspark0:0 dspark1:0 dspark2:0"), std::string::npos) << t.out;
  // a drafter tensor missing: named
  auto layout = v4_layout(cj);
  layout.erase(std::remove_if(layout.begin(), layout.end(),
                              [](const auto& x) { return x.name == "mtp.2.markov_head.markov_w1.weight"; }),
               layout.end());
  write_replica(d.path / "m2", cj, layout, o);
  expect_cli_error(d.path / "m2", d.path, {"missing tensor(s): mtp.2.markov_head.markov_w1.weight"});
}

}  // namespace
}  // namespace dsv4
