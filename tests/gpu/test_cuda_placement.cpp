// Routed experts split between the GPU and the CPU (issue 11; model/split_moe.h) with the real CUDA backend:
// * SplitMoe on CUDA (resident experts on the GPU, the others on the CPU, input rows through pinned memory) equals
//   the unsplit CUDA moe and the CPU backend's moe BITWISE in the deterministic mode, for every placement of an
//   8-expert layer and forced routings (one expert for every slot, distinct, every expert, random with duplicates),
//   reference and dense numerics, up to 300 tokens; in the fast mode within the fast moe tolerance (rms 2^-5);
// * the demo model on CUDA, deterministic: the logits of a 300-token prompt + 12 decode steps (the layers without host
//   experts replayed as CUDA graph segments) under all-GPU, --cpu-moe,
//   every --n-cpu-moe value and a hot-expert profile equal the CPU backend's BITWISE;
// * full-size V4-Flash placements that cannot fit (all experts on the GPU; all on the CPU: 140 GB > the host's
//   RAM) are one-line errors with exit 1 before any allocation.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/split_moe_fixture.h"
#include "gpu_modes.h"
#include "gpu_test_util.h"
#include "model/expert_placement.h"
#include "model/sequence.h"

namespace dsv4::test::gpu {
namespace {

std::vector<float> moe_ref(Backend& be, const SplitMoeFixture& fx, const std::vector<float>& x,
                           const std::vector<int32_t>& ids, const std::vector<float>& w, int64_t n, int64_t k,
                           Numerics num) {
  const Buffer bx = to_device(be, x), bi = to_device(be, ids), bw = to_device(be, w);
  Buffer y(be, size_t(n * SplitMoeFixture::D) * 4, "y");
  be.ops().moe(fx.all_device(), bx.as<float>(), n, bi.as<int32_t>(), bw.as<float>(), k, 10.0f,
               quantized_linear_opts(num), num == Numerics::reference, y.as<float>());
  return to_host<float>(be, y, size_t(n * SplitMoeFixture::D));
}

std::vector<float> split_run(Backend& be, SplitMoe& split, const SplitMoeFixture& fx, unsigned mask,
                             const std::vector<float>& x, const std::vector<int32_t>& ids, const std::vector<float>& w,
                             int64_t n, int64_t k, Numerics num) {
  const Buffer bx = to_device(be, x), bi = to_device(be, ids), bw = to_device(be, w);
  Buffer y = out_buffer<float>(be, size_t(n * SplitMoeFixture::D));
  SplitMoeFixture::Split s;
  fx.make_split(mask, s);
  split.run(be.ops(), s.layer, SplitMoeFixture::D, bx.as<float>(), n, bi.as<int32_t>(), bw.as<float>(), k, 10.0f,
            quantized_linear_opts(num), num == Numerics::reference, y.as<float>());
  return to_host<float>(be, y, size_t(n * SplitMoeFixture::D));
}

TEST(CudaSplitMoe, EveryPlacementAndRoutingEqualsTheCpuBitwiseInTheDeterministicMode) {
  DSV4_REQUIRE_GPU();
  Backend& g = *cuda();
  SplitMoeFixture fg(g), fc(cpu());  // the same weights on both backends
  SplitMoe split(g);
  DeterministicGemm det;
  int checked = 0;
  for (Numerics num : {Numerics::reference, Numerics::dense})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {4, 6}, {300, 6}}) {
      const auto x = randn(size_t(n * SplitMoeFixture::D), 31 + uint32_t(n), 1.0f, true);
      std::vector<float> w(size_t(n * k));
      for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f + 0.5f * float((i * 37) % 11) / 11.0f;
      const auto pats = routing_patterns(n, k, SplitMoeFixture::E, 33);
      for (size_t pi = 0; pi < pats.size(); ++pi) {
        const auto cref = moe_ref(cpu(), fc, x, pats[pi], w, n, k, num);
        const auto gref = moe_ref(g, fg, x, pats[pi], w, n, k, num);
        ASSERT_EQ(std::memcmp(cref.data(), gref.data(), cref.size() * 4), 0) << "unsplit CUDA moe vs CPU";
        for (unsigned mask = 0; mask < 256; mask += (n > 4 ? 17 : 1)) {
          const auto got = split_run(g, split, fg, mask, x, pats[pi], w, n, k, num);
          ASSERT_EQ(std::memcmp(cref.data(), got.data(), cref.size() * 4), 0)
              << numerics_name(num) << " n " << n << " k " << k << " pattern " << pi << " host mask " << mask;
          ++checked;
        }
      }
    }
  std::printf("[cuda-split] %d (placement, routing) cases bitwise equal to the CPU; %lld host pairs, %.1f KB to "
              "the host, %.1f KB back\n",
              checked, static_cast<long long>(split.stats().host_pairs), split.stats().to_host_bytes / 1e3,
              split.stats().to_device_bytes / 1e3);
  EXPECT_GT(split.stats().host_pairs, 0);
}

TEST(CudaSplitMoe, FastModeIsWithinTheMoeTolerance) {
  DSV4_REQUIRE_GPU();
  Backend& g = *cuda();
  SplitMoeFixture fg(g), fc(cpu());
  SplitMoe split(g);
  const int64_t n = 7, k = 6;
  const auto x = randn(size_t(n * SplitMoeFixture::D), 41, 1.0f, true);
  const std::vector<float> w(size_t(n * k), 0.3f);
  const auto pats = routing_patterns(n, k, SplitMoeFixture::E, 43);
  for (unsigned mask : {0x00u, 0xFFu, 0x3Cu})
    for (const auto& pat : pats) {
      const auto ref = moe_ref(cpu(), fc, x, pat, w, n, k, Numerics::reference);
      const auto got = split_run(g, split, fg, mask, x, pat, w, n, k, Numerics::reference);
      for (int64_t t = 0; t < n; ++t) {
        double e2 = 0, r2 = 0;
        for (int64_t d = 0; d < SplitMoeFixture::D; ++d) {
          const double a = ref[size_t(t * SplitMoeFixture::D + d)], b = got[size_t(t * SplitMoeFixture::D + d)];
          ASSERT_TRUE(std::isfinite(b));
          e2 += (a - b) * (a - b);
          r2 += a * a;
        }
        EXPECT_LE(std::sqrt(e2), std::ldexp(std::sqrt(r2), -5)) << "token " << t << " mask " << mask;
      }
    }
}

std::vector<float> demo_logits(const Model& m, std::span<const int32_t> ids, int decode) {
  ModelSequence seq(m);
  const int64_t V = m.n_vocab();
  std::vector<float> out;
  seq.append_all(ids, [&](int64_t, std::span<const float> lg) { out.insert(out.end(), lg.begin(), lg.end()); });
  for (int i = 0; i < decode; ++i) {
    const float* last = out.data() + out.size() - size_t(V);
    const int32_t t = int32_t(std::max_element(last, last + V) - last);
    seq.append_all(std::span<const int32_t>(&t, 1),
                   [&](int64_t, std::span<const float> lg) { out.insert(out.end(), lg.begin(), lg.end()); });
  }
  return out;
}

TEST(CudaPlacement, DemoModelEveryPlacementEqualsTheCpuBitwise) {
  DSV4_REQUIRE_GPU();
  DeterministicScope det;
  const auto cpu_model = cached_model("dsv4-demo", Numerics::reference, false);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> d(2, cpu_model->n_vocab() - 1);
  std::vector<int32_t> ids(300);
  for (auto& t : ids) t = d(rng);
  const auto ref = demo_logits(*cpu_model, ids, 12);
  const int L = cpu_model->config().num_hidden_layers, E = cpu_model->config().n_routed_experts;
  ExpertProfile prof;
  prof.counts.assign(size_t(L), std::vector<uint64_t>(size_t(E), 0));
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e) prof.counts[size_t(l)][size_t(e)] = uint64_t((e * 5 + l) % E);
  const auto pf = std::filesystem::temp_directory_path() / ("dsv4_gpu_hot_" + std::to_string(getpid()) + ".json");
  write_expert_profile(prof, pf);
  std::vector<std::pair<std::string, PlacementOptions>> cases;
  cases.push_back({"all on the GPU", {}});
  {
    PlacementOptions p;
    p.cpu_moe = true;
    cases.push_back({"--cpu-moe", p});
  }
  for (int n = 0; n <= L; ++n) {
    PlacementOptions p;
    p.n_cpu_moe = n;
    cases.push_back({"--n-cpu-moe " + std::to_string(n), p});
  }
  {
    PlacementOptions p;
    p.gpu_experts = "3";
    p.hot_experts = pf.string();
    cases.push_back({"--gpu-experts 3 --hot-experts", p});
  }
  for (const auto& [name, p] : cases) {
    ModelOptions o;
    o.numerics = Numerics::reference;
    o.backend = cuda();
    o.ubatch = 128;
    o.placement = p;
    auto m = Model::load(model_dir("dsv4-demo"), o);
    const int64_t r0 = m->step_graphs() ? m->step_graphs()->replays() : 0;
    const auto got = demo_logits(*m, ids, 12);
    const int64_t replays = m->step_graphs() ? m->step_graphs()->replays() - r0 : 0;
    ASSERT_EQ(got.size(), ref.size()) << name;
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) bad += ref[i] != got[i] ? 1 : 0;
    const SplitMoeStats st = m->split_stats();
    std::printf("[cuda-placement] demo %-32s %lld experts on the CPU, %lld split calls, %zu of %zu logits differ\n",
                name.c_str(), static_cast<long long>(m->placement().n_host()), static_cast<long long>(st.calls), bad,
                ref.size());
    EXPECT_EQ(bad, 0u) << name;
    if (m->placement().n_host() > 0) EXPECT_GT(st.host_pairs, 0) << name;
    // the layers without host experts run as recorded CUDA graph segments between the split ones
    int split_layers = 0;
    for (int l = 0; l < L; ++l) split_layers += m->placement().n_host(l) > 0;
    if (split_layers < L) EXPECT_GT(replays, 0) << name << ": decode segments of unsplit layers should replay";
    std::printf("[cuda-placement]   %d split layers, %lld graph replays in 12 decode steps\n", split_layers,
                static_cast<long long>(replays));
  }
  std::filesystem::remove(pf);
}

struct CliResult {
  int rc = -1;
  std::string out;
};
CliResult cli(const std::string& args) {
  const std::string cmd = std::string(DSV4_BINARY) + " " + args + " 2>&1";
  CliResult r;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  const int st = pclose(f);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(CudaPlacement, FullFlashPlacementsThatCannotFitAreOneLineErrors) {
  DSV4_REQUIRE_GPU();
  const std::string base = "bench model --config " + std::string(DSV4_SOURCE_DIR) +
                           "/tests/data/configs/deepseek-v4-flash-config.json --load-format dummy --device cuda "
                           "--prefill 0 --steps 1 --no-profile";
  const CliResult gpu = cli(base + " --n-cpu-moe 0");
  EXPECT_EQ(gpu.rc, 1) << gpu.out;
  EXPECT_NE(gpu.out.find("dsv4: error:"), std::string::npos) << gpu.out;
  EXPECT_NE(gpu.out.find("--gpu-experts auto"), std::string::npos) << gpu.out;
  const CliResult host = cli(base + " --cpu-moe");
  EXPECT_EQ(host.rc, 1) << host.out;
  EXPECT_NE(host.out.find("host memory"), std::string::npos) << host.out;
  for (const CliResult* r : {&gpu, &host}) {
    const size_t at = r->out.rfind("dsv4: error:");
    if (at != std::string::npos) std::printf("[cuda-placement] %s", r->out.substr(at).c_str());
  }
}

}  // namespace
}  // namespace dsv4::test::gpu
