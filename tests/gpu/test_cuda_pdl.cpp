// Programmatic Dependent Launch (backend/cuda/device_pdl.cuh): the decode-path kernels may be scheduled while the
// kernel before them still runs, each waiting (griddepcontrol.wait) before it touches what an earlier kernel wrote.
// Scheduling only, so with the switch on and off (backend.h set_cuda_pdl) every logit must be bitwise the same:
// * a prompt and 48 decode steps of 4 dummy V4-Flash layers (window-only, CSA with the indexer, HCA; hash and
//   biased routing: the FP8 tensor-core GEMVs, the f16 wo_a kernel, the FP4 expert kernel, split attention, the
//   shared expert on the second stream), of tiny-a and of the demo model: eager steps and steps replayed from CUDA
//   graphs (recorded with programmatic edges), against eager steps without PDL;
// * `dsv4 bench model --no-pdl` reports "pdl": false, the default reports whether the GPU launches that way.
// A missing wait shows up as a race: differing logits in some step (run it repeatedly when touching the kernels).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/kernels.h"
#include "common/replica.h"
#include "gpu_modes.h"
#include "gpu_cli.h"
#include "gpu_test_util.h"
#include "model/dummy_weights.h"
#include "model/model.h"
#include "model/sequence.h"

namespace dsv4::test::gpu {
namespace {

// The PDL switch for a scope (process-wide; restored after).
struct PdlScope {
  explicit PdlScope(bool on) : was(dsv4::cuda::pdl()) { dsv4::cuda::set_pdl(on); }
  ~PdlScope() { dsv4::cuda::set_pdl(was); }
  bool was;
};

// The last prompt position's logits and those of `steps` decode steps, feeding `tokens` (empty: greedy, and the
// greedy tokens are stored there so that later runs feed the same ones).
std::vector<float> decode_logits(const Model& m, const std::vector<int32_t>& prompt, int steps,
                                 std::vector<int32_t>& tokens) {
  ModelSequence seq(m);
  std::vector<float> lg(static_cast<size_t>(m.n_vocab())), out;
  seq.append(prompt, lg);
  const bool forced = !tokens.empty();
  for (int i = 0; i < steps; ++i) {
    out.insert(out.end(), lg.begin(), lg.end());
    const int32_t t = forced ? tokens[size_t(i)] : int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin());
    if (!forced) tokens.push_back(t);
    seq.append(std::span<const int32_t>(&t, 1), lg);
  }
  out.insert(out.end(), lg.begin(), lg.end());
  return out;
}

size_t count_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], 4) != 0;
  return d;
}

// Eager steps without PDL (the reference), eager steps with PDL, and replayed steps without and with PDL, all on
// `m` (recorded steps on: the default). Eager steps: the model's ops through an op hook that is the backend's own
// ops (steps with a hook never replay a recording; the same kernels run).
void check_pdl_on_off(Model& m, const std::string& name, int64_t prompt_len, int steps) {
  ASSERT_NE(m.step_graphs(), nullptr) << name;
  const auto prompt = random_ids(prompt_len, m.n_vocab(), 41);
  std::vector<int32_t> toks;
  m.set_op_hook(&m.backend().ops());
  std::vector<float> ref, eager_pdl;
  {
    PdlScope off(false);
    ref = decode_logits(m, prompt, steps, toks);
  }
  {
    PdlScope on(true);
    eager_pdl = decode_logits(m, prompt, steps, toks);
  }
  m.set_op_hook(nullptr);
  std::vector<float> graph_nopdl, graph_pdl;
  int64_t rep_nopdl = 0, rep_pdl = 0;
  {
    PdlScope off(false);
    const int64_t r0 = m.step_graphs()->replays();
    graph_nopdl = decode_logits(m, prompt, steps, toks);
    rep_nopdl = m.step_graphs()->replays() - r0;
  }
  bool active = false;
  {
    PdlScope on(true);
    active = cuda_pdl_active(m.backend());
    const int64_t r0 = m.step_graphs()->replays();
    graph_pdl = decode_logits(m, prompt, steps, toks);
    rep_pdl = m.step_graphs()->replays() - r0;
  }
  const size_t d_eager = count_diff(ref, eager_pdl), d_gn = count_diff(ref, graph_nopdl),
               d_gp = count_diff(ref, graph_pdl);
  std::printf("[cuda-pdl] %s: prompt %lld + %d decode steps, PDL %s on this GPU; differing logits vs eager without "
              "PDL: eager with PDL %zu, replayed without %zu (%lld replays), replayed with PDL %zu (%lld replays)\n",
              name.c_str(), (long long)prompt_len, steps, active ? "active" : "inactive", d_eager, d_gn,
              (long long)rep_nopdl, d_gp, (long long)rep_pdl);
  std::fflush(stdout);
  EXPECT_EQ(d_eager, 0u) << name << ": eager steps with PDL";
  EXPECT_EQ(d_gn, 0u) << name << ": replayed steps without PDL";
  EXPECT_EQ(d_gp, 0u) << name << ": replayed steps with PDL";
  EXPECT_GE(rep_nopdl, steps / 4) << name << ": most decode steps should replay a recording";
  EXPECT_GE(rep_pdl, steps / 4) << name << ": most decode steps should replay a recording (recorded with PDL)";
  EXPECT_TRUE(dsv4::cuda::pdl()) << "the switch is restored (default on)";
}

TEST(CudaPdl, FlashLayersDecodeBitwiseEqualWithAndWithoutPdl) {
  DSV4_REQUIRE_GPU();
  // the first 4 layers of V4-Flash: compress ratios 0, 0, 4, 128; hash routing in layers 0-2, biased top-k in 3
  const ModelConfig cfg = keep_first_layers(load_config(testing::configs_dir() / "deepseek-v4-flash-config.json"), 4);
  // a backend of its own: its workspace (V4-Flash sized) goes with it
  std::unique_ptr<Backend> be = make_backend(Device{DeviceKind::cuda, 0});
  ModelOptions o;
  o.backend = be.get();
  std::unique_ptr<Model> m = Model::load_dummy(cfg, o);
  // decode from position 230 across 256 (the ratio-128 compressor emits a row, the ratio-4 one every 4 positions)
  check_pdl_on_off(*m, "V4-Flash 4 layers (dummy)", 230, 48);
}

TEST(CudaPdl, SmallModelsDecodeBitwiseEqualWithAndWithoutPdl) {
  DSV4_REQUIRE_GPU();
  for (const char* name : {"tiny-a", "dsv4-demo"}) {
    ModelOptions o;
    o.backend = cuda();
    std::unique_ptr<Model> m = Model::load(model_dir(name), o);
    check_pdl_on_off(*m, name, 100, 48);
  }
}

TEST(CudaPdl, BenchModelReportsPdlAndNoPdl) {
  DSV4_REQUIRE_GPU();
  const std::string base = "bench model --config " + std::string(DSV4_SOURCE_DIR) +
                           "/tests/data/tiny-a/config.json --load-format dummy --device cuda --ctx 128 --prefill 0 "
                           "--steps 3 --batch 2 --no-profile --json";  // (batch > 1: nonfinite_logit_rows reported)
  const CliResult on = cli(base), off = cli(base + " --no-pdl");
  ASSERT_EQ(on.rc, 0) << on.out;
  ASSERT_EQ(off.rc, 0) << off.out;
  const bool active = cuda_pdl_active(*cuda());
  const auto jon = cli_json(on), joff = cli_json(off);
  EXPECT_EQ(jon.at("pdl").get<bool>(), active);
  EXPECT_FALSE(joff.at("pdl").get<bool>());
  EXPECT_EQ(jon.at("nonfinite_logit_rows").get<int>(), 0);
  EXPECT_EQ(joff.at("nonfinite_logit_rows").get<int>(), 0);
  std::printf("[cuda-pdl] bench model tiny-a dummy ctx 128 batch 2: %.3f ms/step with PDL (%s), %.3f without\n",
              jon.at("decode_ms_per_step").get<double>(), active ? "active" : "inactive",
              joff.at("decode_ms_per_step").get<double>());
}

}  // namespace
}  // namespace dsv4::test::gpu
