// The whole forward pass on CUDA, end to end (issue: CUDA backend acceptance):
// * logits of tests/data/tiny-a, tiny-b (and the demo model when its dense golden exists) at every position of
//   prompts of 1-9, 127-130, 511-513, 2047-2050 tokens: `dense` within 2e-3 |dlogprob| of the HF goldens,
//   `reference` within the official code's own CPU-vs-CUDA noise floor of the official goldens;
// * CUDA vs the CPU reference at every position of a 2050-token prompt: bitwise in the deterministic mode
//   (gemm_path.h set_deterministic, the CLI's --deterministic), within stated logprob tolerances in the default fast
//   mode (fast_tol); greedy decoding of the demo model's 20 golden prompts in both modes (a split only where the
//   CPU's top-2 logit gap is below 1e-3 deterministic / 2e-2 fast);
// * chunked prefill (chunks 1, 5, 128, 129, 512) == one prefill, decode == re-prefill, snapshot / rewind: bitwise in
//   the deterministic mode (one kernel for every token count), within a stated tolerance with the default paths;
// * decode with recorded steps (CUDA graphs) == eager decode (fast mode) and == the CPU (deterministic), bitwise;
// * `dsv4 bench model --batch B` end to end on a small dummy model;
// * errors: a model too large for the GPU, no visible GPU.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "backend/cuda/gemm_path.h"
#include "common/golden.h"
#include "core/error.h"
#include "common/replica.h"
#include "gpu_modes.h"
#include "gpu_cli.h"
#include "gpu_test_util.h"
#include "model/model.h"
#include "model/sequence.h"

namespace dsv4::test {
namespace {

using gpu::cuda;

using gpu::cli;
using gpu::cli_json;
using gpu::CliResult;
using gpu::DeterministicGemm;
using gpu::model_dir;
using DeterministicMode = gpu::DeterministicScope;

// One loaded model per (name, numerics, device) for the whole program.
const Model& model(const std::string& name, Numerics num, bool on_cuda) {
  return *gpu::cached_model(name, num, on_cuda);
}

// Logits of every position of `ids`, fed in chunks of `chunk` tokens (0: one prefill).
std::vector<float> run(const Model& m, std::span<const int32_t> ids, int64_t chunk = 0) {
  ModelSequence seq(m);
  const int64_t V = m.n_vocab();
  std::vector<float> out(ids.size() * size_t(V));
  const size_t step = chunk > 0 ? size_t(chunk) : ids.size();
  for (size_t i = 0; i < ids.size(); i += step) {
    const size_t n = std::min(ids.size() - i, step);
    seq.append_all(ids.subspan(i, n), [&](int64_t p, std::span<const float> lg) {
      std::copy(lg.begin(), lg.end(), out.begin() + p * V);
    });
  }
  return out;
}

struct LogprobDiff {
  double max = 0, median = 0, p99 = 0;
  double top1_agree = 1;  // over positions where the first run's top-2 gap > 1e-3
  int64_t positions = 0;
};

// |dlogprob| over the top-20 ids of `a` at every position, and argmax agreement where `a` is not near a tie.
LogprobDiff diff_logprobs(const std::vector<float>& a, const std::vector<float>& b, int64_t V) {
  std::vector<double> d;
  int64_t checked = 0, agree = 0;
  const int64_t P = int64_t(a.size()) / V;
  for (int64_t p = 0; p < P; ++p) {
    const auto la = golden_log_softmax(std::span<const float>(&a[size_t(p * V)], size_t(V)));
    const auto lb = golden_log_softmax(std::span<const float>(&b[size_t(p * V)], size_t(V)));
    std::vector<int32_t> ord(static_cast<size_t>(V));
    std::iota(ord.begin(), ord.end(), 0);
    const size_t k = std::min<size_t>(20, size_t(V));
    std::partial_sort(ord.begin(), ord.begin() + k, ord.end(), [&](int32_t x, int32_t y) { return la[x] > la[y]; });
    for (size_t i = 0; i < k; ++i) d.push_back(std::abs(la[size_t(ord[i])] - lb[size_t(ord[i])]));
    if (la[size_t(ord[0])] - la[size_t(ord[1])] > 1e-3) {
      ++checked;
      const int32_t bmax = int32_t(std::max_element(lb.begin(), lb.end()) - lb.begin());
      agree += bmax == ord[0];
    }
  }
  LogprobDiff r;
  r.positions = P;
  if (!d.empty()) {
    std::sort(d.begin(), d.end());
    r.max = d.back();
    r.median = d[d.size() / 2];
    r.p99 = d[std::min(d.size() - 1, size_t(0.99 * double(d.size())))];
  }
  r.top1_agree = checked ? double(agree) / double(checked) : 1.0;
  return r;
}

void print_diff(const std::string& what, const LogprobDiff& d) {
  std::printf("[cuda-model] %s: positions %lld, |dlogprob| median %.2e p99 %.2e max %.2e, top1 agree %.4f\n",
              what.c_str(), (long long)d.positions, d.median, d.p99, d.max, d.top1_agree);
  std::fflush(stdout);
}

bool golden_exists(const std::string& name, Numerics num) {
  return std::ifstream(std::string(DSV4_SOURCE_DIR) + "/tests/data/golden/" + name + "." +
                       std::string(numerics_name(num)) + ".json")
      .good();
}

// ---- goldens --------------------------------------------------------------------------------------------------

class CudaGolden : public ::testing::TestWithParam<std::tuple<std::string, Numerics>> {};

TEST_P(CudaGolden, EveryPositionOfEveryPromptLength) {
  DSV4_REQUIRE_GPU();
  const auto& [name, num] = GetParam();
  if (!golden_exists(name, num)) GTEST_SKIP() << "no golden file for " << name << " " << numerics_name(num);
  const bool dense = num == Numerics::dense;
  const Golden g = load_golden(name, std::string(numerics_name(num)));
  ASSERT_FALSE(g.prompts.empty());
  const Model& m = model(name, num, true);
  const int64_t V = m.n_vocab();
  Stats st;
  for (const auto& gp : g.prompts) {
    const int64_t L = int64_t(gp.ids.size());
    if (L == 258) continue;  // the groups: 1-9, 127-130, 511-513, 2047-2050
    const auto full = run(m, gp.ids);
    for (int64_t p = 0; p < L; ++p)
      compare_row(std::span<const float>(&full[size_t(p * V)], size_t(V)), gp, size_t(p), dense, st,
                  name + " cuda L=" + std::to_string(L) + " p=" + std::to_string(p));
    // every other length of the group: its own prefill, every position against the golden (causality)
    for (int64_t len : lengths_for(L)) {
      if (len == L) continue;
      const auto part = run(m, std::span<const int32_t>(gp.ids.data(), size_t(len)));
      for (int64_t p = 0; p < len; ++p)
        compare_row(std::span<const float>(&part[size_t(p * V)], size_t(V)), gp, size_t(p), dense, st,
                    name + " cuda prefill " + std::to_string(len) + " p=" + std::to_string(p));
    }
  }
  const double med = st.quantile(0.5), p99 = st.quantile(0.99);
  const double agree = st.top1_checked ? double(st.top1_agree) / double(st.top1_checked) : 1.0;
  std::printf("[cuda-golden] %s %s: positions %ld, |dlogprob| median %.2e p99 %.2e max %.2e, top1 agree %.4f\n",
              name.c_str(), std::string(numerics_name(num)).c_str(), long(st.positions), med, p99, st.quantile(1.0),
              agree);
  std::fflush(stdout);
  if (!dense) {
    ASSERT_TRUE(g.meta.contains("noise_floor")) << "reference golden without noise_floor";
    const auto& nf = g.meta["noise_floor"];
    EXPECT_LE(med, std::max(nf.value("median", 0.0), 1e-4)) << "median |dlogprob| above the oracle noise floor";
    EXPECT_LE(p99, std::max(nf.value("p99", 0.0), 1e-3)) << "p99 |dlogprob| above the oracle noise floor";
    EXPECT_GE(agree, std::min(nf.value("top1_agree", 1.0), 1.0)) << "top-1 agreement below the oracle noise floor";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaGolden,
                         ::testing::Combine(::testing::Values("tiny-a", "tiny-b", "dsv4-demo"),
                                            ::testing::Values(Numerics::reference, Numerics::dense)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n + "_" + std::string(numerics_name(std::get<1>(info.param)));
                         });

// ---- CUDA vs the CPU reference -----------------------------------------------------------------------------------

std::vector<int32_t> random_prompt(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(2, vocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Median |dlogprob| bound of the fast mode against the CPU / another token split (see the CudaVsCpu fast test).
double fast_tol(Numerics num) { return num == Numerics::dense ? 1e-4 : 2e-2; }

class CudaVsCpu : public ::testing::TestWithParam<std::tuple<std::string, Numerics>> {};

// The CUDA kernels repeat the CPU's arithmetic in the CPU's order wherever the CPU reference fixes one (every
// reduction, glibc's expf/log1pf transcribed), so on these models — whose GEMMs are too small for the cuBLASLt path
// (K >= 512) — the logits must be bitwise equal. The log-probability statistics are printed as well.
TEST_P(CudaVsCpu, EveryPositionOfA2050TokenPromptIsBitwiseEqual) {
  DSV4_REQUIRE_GPU();
  const auto& [name, num] = GetParam();
  const Model& mg = model(name, num, true);
  const Model& mc = model(name, num, false);
  const auto ids = random_prompt(2050, mg.n_vocab(), 77);
  DeterministicMode det;
  const auto a = run(mc, ids), b = run(mg, ids);
  size_t bad = 0, first = a.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      ++bad;
      first = std::min(first, i);
    }
  const LogprobDiff d = diff_logprobs(a, b, mg.n_vocab());
  print_diff(name + " " + std::string(numerics_name(num)) + " cuda vs cpu (" + std::to_string(bad) + " of " +
                 std::to_string(a.size()) + " logits differ)",
             d);
  EXPECT_EQ(bad, 0u) << "first difference at position " << (first / size_t(mg.n_vocab()));
  EXPECT_GE(d.top1_agree, 0.98);
}

// The default (fast) mode: the decode kernels (gemv, hc_pre's dots, sparse attention for <= 256 tokens per step:
// their own fp32 summation order) run in the prefill's ubatches too, so the logits differ from the CPU by
// accumulation-order noise only. Tolerances (kFastTol): dense median |dlogprob| <= 1e-4 (measured ~5e-7 on the H200);
// reference numerics median <= 2e-2: they are chaotic under rounding-level changes -- bf16 roundings, act_quant's
// e4m3 codes and the exact top-k of bf16-rounded indexer scores and of the expert routing turn one flipped ulp into
// a discrete change -- so the bound is the order of the oracle's own noise (the official PyTorch code on a GPU vs
// this CPU reference: median 1.8e-2 on tiny-b, README); measured at e3d8bb1: 7.0e-3 (demo), 2.2e-4 (tiny-b).
// Top-1 agreement >= 0.98 (measured >= 0.9917) in both.
TEST_P(CudaVsCpu, EveryPositionOfA2050TokenPromptWithinNoiseInTheFastMode) {
  DSV4_REQUIRE_GPU();
  const auto& [name, num] = GetParam();
  const Model& mg = model(name, num, true);
  const Model& mc = model(name, num, false);
  const auto ids = random_prompt(2050, mg.n_vocab(), 77);
  const auto a = run(mc, ids), b = run(mg, ids);
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += a[i] != b[i] ? 1 : 0;
  const LogprobDiff d = diff_logprobs(a, b, mg.n_vocab());
  print_diff(name + " " + std::string(numerics_name(num)) + " cuda (fast mode) vs cpu (" + std::to_string(bad) +
                 " of " + std::to_string(a.size()) + " logits differ)",
             d);
  EXPECT_LE(d.median, fast_tol(num));
  EXPECT_GE(d.top1_agree, 0.98);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaVsCpu,
                         ::testing::Combine(::testing::Values("tiny-a", "tiny-b", "dsv4-demo"),
                                            ::testing::Values(Numerics::reference, Numerics::dense)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n + "_" + std::string(numerics_name(std::get<1>(info.param)));
                         });

struct Greedy {
  std::vector<int32_t> ids;
  std::vector<double> gap;  // top-2 logit gap at every step
};

Greedy greedy(const Model& m, const std::vector<int32_t>& prompt, int n_new) {
  ModelSequence seq(m);
  std::vector<float> lg(static_cast<size_t>(m.n_vocab()));
  seq.append(prompt, lg);
  Greedy g;
  for (int i = 0; i < n_new; ++i) {
    std::vector<float> s = lg;
    std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
    g.gap.push_back(double(s[0]) - double(s[1]));
    g.ids.push_back(int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin()));
    if (i + 1 < n_new) seq.append(std::span<const int32_t>(&g.ids.back(), 1), lg);
  }
  return g;
}

class CudaDemoGreedy : public ::testing::TestWithParam<std::tuple<Numerics, bool>> {};

// Deterministic mode: bitwise equal logits, so the greedy tokens equal the CPU's (a split is allowed only at an exact
// tie, gap < 1e-3). Fast mode (default): greedy-identical except where the CPU's top-2 gap is below 2e-2 logits
// (accumulation-order noise of the decode kernels, stated tolerance).
TEST_P(CudaDemoGreedy, TwentyPromptsMatchTheCpu) {
  DSV4_REQUIRE_GPU();
  const auto [num, det] = GetParam();
  std::unique_ptr<DeterministicMode> dm;
  if (det) dm = std::make_unique<DeterministicMode>();
  const double gap_tol = det ? 1e-3 : 2e-2;
  std::ifstream f(std::string(DSV4_SOURCE_DIR) + "/tests/data/demo/prompts.json");
  ASSERT_TRUE(f.good());
  const auto j = nlohmann::json::parse(f);
  const Model& mg = model("dsv4-demo", num, true);
  const Model& mc = model("dsv4-demo", num, false);
  size_t total = 0, same = 0, prompts = 0;
  for (const auto& p : j.at("prompts")) {
    const auto ids = p.at("ids").get<std::vector<int32_t>>();
    const Greedy c = greedy(mc, ids, 64), g = greedy(mg, ids, 64);
    size_t i = 0;
    while (i < c.ids.size() && c.ids[i] == g.ids[i]) ++i;
    if (i < c.ids.size()) {
      EXPECT_LT(c.gap[i], gap_tol) << p.value("text", "") << ": split at step " << i
                                   << " where the CPU's top-2 gap is " << c.gap[i];
    }
    total += c.ids.size();
    same += i;
    ++prompts;
  }
  std::printf("[cuda-model] demo %s %s greedy: %zu prompts, %zu / %zu tokens in common prefixes with the CPU\n",
              std::string(numerics_name(num)).c_str(), det ? "deterministic" : "fast", prompts, same, total);
  EXPECT_EQ(prompts, 20u);
}

INSTANTIATE_TEST_SUITE_P(Numerics, CudaDemoGreedy,
                         ::testing::Combine(::testing::Values(Numerics::reference, Numerics::dense),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(numerics_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_deterministic" : "_fast");
                         });

// ---- invariance on CUDA ------------------------------------------------------------------------------------------

class CudaInvariance : public ::testing::TestWithParam<std::tuple<std::string, Numerics>> {};

TEST_P(CudaInvariance, ChunkedPrefillEqualsOnePrefill) {
  DSV4_REQUIRE_GPU();
  const auto& [name, num] = GetParam();
  const Model& m = model(name, num, true);
  const int64_t V = m.n_vocab();
  const auto ids = random_prompt(600, m.n_vocab(), 5);
  {
    DeterministicGemm det;
    const auto one = run(m, ids);
    for (int64_t chunk : {1, 5, 128, 129, 512}) {
      const auto ch = run(m, ids, chunk);
      size_t bad = 0;
      for (size_t i = 0; i < one.size(); ++i) bad += one[i] != ch[i];
      std::printf("[cuda-model] %s %s deterministic chunk %lld: %zu of %zu logits differ\n", name.c_str(),
                  std::string(numerics_name(num)).c_str(), (long long)chunk, bad, one.size());
      EXPECT_EQ(bad, 0u) << "chunk " << chunk;
    }
  }
  // default (fast) paths: the kernels depend on the token count -> accumulation-order noise only (fast_tol: see
  // CudaVsCpu; measured at e3d8bb1, reference: median 3.0e-3 tiny-b / 3.3e-3 demo for chunks of 1 and 5)
  const auto one = run(m, ids);
  for (int64_t chunk : {1, 5, 128, 129, 512}) {
    const LogprobDiff d = diff_logprobs(one, run(m, ids, chunk), V);
    print_diff(name + " " + std::string(numerics_name(num)) + " chunk " + std::to_string(chunk) + " vs one prefill",
               d);
    EXPECT_LE(d.median, fast_tol(num));
    EXPECT_GE(d.top1_agree, 0.98);
  }
}

TEST_P(CudaInvariance, DecodeEqualsReprefillAndSnapshotRewindContinue) {
  DSV4_REQUIRE_GPU();
  const auto& [name, num] = GetParam();
  const Model& m = model(name, num, true);
  const int64_t V = m.n_vocab();
  DeterministicGemm det;
  const auto prompt = random_prompt(200, m.n_vocab(), 9);
  // straight run: prefill, then 100 greedy decode steps, keeping every step's logits
  ModelSequence seq(m);
  std::vector<float> lg(static_cast<size_t>(V));
  std::vector<float> dec;
  seq.append(prompt, lg);
  std::vector<int32_t> all = prompt;
  for (int i = 0; i < 100; ++i) {
    dec.insert(dec.end(), lg.begin(), lg.end());
    const int32_t t = int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin());
    all.push_back(t);
    seq.append(std::span<const int32_t>(&t, 1), lg);
  }
  // decode == re-prefill: one prefill of the whole sequence gives the same logits at the decoded positions
  const auto re = run(m, all);
  size_t bad = 0;
  for (int i = 0; i < 100; ++i)
    for (int64_t v = 0; v < V; ++v) bad += dec[size_t(i * V + v)] != re[size_t((199 + i) * V + v)];
  EXPECT_EQ(bad, 0u) << "decode vs re-prefill (deterministic GEMM mode)";
  std::printf("[cuda-model] %s %s decode vs re-prefill: %zu differing logits\n", name.c_str(),
              std::string(numerics_name(num)).c_str(), bad);
  // snapshot after 240 tokens; restore and continue; rewind to several points and continue: same greedy tokens
  auto continue_greedy = [&](ModelSequence& sq, std::vector<float> l, int n) {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      const int32_t t = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
      out.push_back(t);
      sq.append(std::span<const int32_t>(&t, 1), l);
    }
    return out;
  };
  const std::vector<int32_t> tail(all.begin() + 240, all.end());  // tokens 240..299 of the straight run
  ModelSequence s2(m);
  s2.append(std::span<const int32_t>(all.data(), 240), lg);
  const ModelSequence::Snapshot snap = s2.snapshot();
  const std::vector<float> lg_snap = lg;
  EXPECT_EQ(continue_greedy(s2, lg_snap, 60), tail) << "one prefill of 240, then decode";
  s2.restore(snap);
  EXPECT_EQ(continue_greedy(s2, lg_snap, 60), tail) << "restored snapshot at 240";
  for (int64_t p : {239, 200, 129, 128, 127, 77}) {
    ModelSequence s3(m);
    s3.append(std::span<const int32_t>(all.data(), 280), lg);
    s3.rewind(p);
    s3.append(std::span<const int32_t>(all.data() + p, size_t(240 - p)), lg);
    EXPECT_EQ(continue_greedy(s3, lg, 60), tail) << "rewind to " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaInvariance,
                         ::testing::Combine(::testing::Values("tiny-a", "tiny-b", "dsv4-demo"),
                                            ::testing::Values(Numerics::reference, Numerics::dense)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n + "_" + std::string(numerics_name(std::get<1>(info.param)));
                         });

// ---- recorded decode steps (CUDA graphs, backend/step_graphs.h) --------------------------------------------------

// Greedy decode of `steps` tokens after `prompt`, every step's logits; `forced` (if not empty) gives the tokens to
// feed instead of the greedy ones (so two models see the same inputs).
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
  return out;
}

TEST(CudaGraphs, ReplayedDecodeStepsEqualEagerStepsAndTheCpuBitwise) {
  DSV4_REQUIRE_GPU();
  for (const char* name : {"tiny-a", "dsv4-demo"}) {
    const Model& g = model(name, Numerics::reference, true);  // graphs on (the default)
    ASSERT_NE(g.step_graphs(), nullptr);
    ModelOptions o;
    o.backend = cuda();
    o.cuda_graphs = false;
    const auto eager = Model::load(model_dir(name), o);
    ASSERT_EQ(eager->step_graphs(), nullptr);
    // decode across compressed-row emissions and a 128-position boundary (ratio-4 and ratio-128 shapes change)
    const auto prompt = random_prompt(100, g.n_vocab(), 31);
    const int steps = 48;
    // fast mode: replays == eager launches of the same kernels
    std::vector<int32_t> toks;
    const int64_t r0 = g.step_graphs()->replays();
    const auto lg_g = decode_logits(g, prompt, steps, toks);
    const int64_t replays = g.step_graphs()->replays() - r0;
    const auto lg_e = decode_logits(*eager, prompt, steps, toks);
    ASSERT_EQ(lg_g.size(), lg_e.size());
    size_t bad = 0;
    for (size_t i = 0; i < lg_g.size(); ++i) bad += lg_g[i] != lg_e[i];
    EXPECT_EQ(bad, 0u) << name << ": replayed vs eager decode logits (fast mode)";
    EXPECT_GE(replays, steps / 4) << name << ": most decode steps should replay a recording";
    // deterministic mode: replays equal the CPU reference bitwise
    DeterministicMode det;
    std::vector<int32_t> toks_d;
    const int64_t r1 = g.step_graphs()->replays();
    const auto lg_d = decode_logits(g, prompt, steps, toks_d);
    const int64_t replays_d = g.step_graphs()->replays() - r1;
    const auto lg_c = decode_logits(model(name, Numerics::reference, false), prompt, steps, toks_d);
    size_t bad_d = 0;
    for (size_t i = 0; i < lg_d.size(); ++i) bad_d += lg_d[i] != lg_c[i];
    EXPECT_EQ(bad_d, 0u) << name << ": replayed decode (deterministic) vs the CPU";
    EXPECT_GE(replays_d, steps / 4) << name;
    std::printf("[cuda-graphs] %s: %lld / %lld replays (fast / deterministic), %zu / %zu differing logits\n", name,
                (long long)replays, (long long)replays_d, bad, bad_d);
  }
}

// ---- errors ------------------------------------------------------------------------------------------------------

// `dsv4 bench model --batch B` (batched decode over one state pool) end to end on a small dummy model: it runs, every
// logit row is finite, the JSON reports the batch, B / step time as tok/s and more weight bytes than batch 1 (more
// distinct experts); --deterministic and --no-cuda-graph are reported; a --ctx that is not a multiple of 128 is a one-line error.
TEST(CudaBench, BatchedDecodeRunsAndReports) {
  DSV4_REQUIRE_GPU();
  const std::string cfg = "bench model --config " + std::string(DSV4_SOURCE_DIR) +
                          "/tests/data/tiny-a/config.json --load-format dummy --device cuda --prefill 0 --steps 3 "
                          "--no-profile --json";
  const std::string base = cfg + " --ctx 128";
  const CliResult one = cli(base + " --batch 1"), four = cli(base + " --batch 4"),
                  det = cli(base + " --batch 4 --deterministic"), nog = cli(base + " --batch 4 --no-cuda-graph");
  ASSERT_EQ(nog.rc, 0) << nog.out;
  EXPECT_FALSE(cli_json(nog).at("cuda_graph").get<bool>());
  EXPECT_EQ(cli_json(nog).at("nonfinite_logit_rows").get<int>(), 0);
  ASSERT_EQ(one.rc, 0) << one.out;
  ASSERT_EQ(four.rc, 0) << four.out;
  ASSERT_EQ(det.rc, 0) << det.out;
  const auto j1 = cli_json(one), j4 = cli_json(four), jd = cli_json(det);
  std::printf("[cuda-bench] tiny-a dummy ctx 128: batch 1 %.3f ms/step, batch 4 %.3f ms/step (%.1f tok/s), "
              "deterministic batch 4 %.3f ms/step\n",
              j1.at("decode_ms_per_step").get<double>(), j4.at("decode_ms_per_step").get<double>(),
              j4.at("decode_tok_s").get<double>(), jd.at("decode_ms_per_step").get<double>());
  EXPECT_EQ(j4.at("batch").get<int>(), 4);
  EXPECT_EQ(j4.at("nonfinite_logit_rows").get<int>(), 0);
  EXPECT_EQ(jd.at("nonfinite_logit_rows").get<int>(), 0);
  EXPECT_GT(j4.at("decode_tok_s").get<double>(), 0.0);
  EXPECT_NEAR(j4.at("decode_tok_s").get<double>() * j4.at("decode_ms_per_step").get<double>(), 4000.0, 1.0);
  EXPECT_GT(j4.at("weight_bytes_per_step").get<double>(), j1.at("weight_bytes_per_step").get<double>());
  EXPECT_FALSE(j4.at("deterministic").get<bool>());
  EXPECT_TRUE(j4.at("cuda_graph").get<bool>());
  EXPECT_GT(j4.at("cuda_graph_replays").get<int>(), 0);  // 8 warm-up + 3 timed steps: replays from the 9th
  EXPECT_TRUE(jd.at("deterministic").get<bool>());
  const CliResult bad = cli(cfg + " --batch 2 --ctx 100");
  EXPECT_EQ(bad.rc, 2) << bad.out;  // a usage error: the command line alone is wrong
  EXPECT_NE(bad.out.find("multiple of 128"), std::string::npos) << bad.out;
}

TEST(CudaErrors, AModelTooLargeForTheGpuIsOneLineBeforeAnyAllocation) {
  DSV4_REQUIRE_GPU();
  testing::TempDir d;
  const auto cj = testing::read_json_file(testing::configs_dir() / "deepseek-v4-flash-config.json");
  const auto dir = d.path / "flash";
  testing::write_replica(dir, cj, testing::v4_layout(cj));  // 160 GB of holes: more than one H200 holds
  const size_t free_before = cuda()->memory().free;
  ModelOptions o;
  o.backend = cuda();
  try {
    auto m = Model::load(dir, o);
    ADD_FAILURE() << "a 160 GB model loaded on one GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    std::printf("[cuda-model] too large: %s\n", msg.c_str());
    EXPECT_NE(msg.find("needs"), std::string::npos) << msg;
    EXPECT_NE(msg.find("free"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_GE(cuda()->memory().free + (size_t(64) << 20), free_before) << "memory was allocated before the check";
  const CliResult r = cli("logprobs -m " + dir.string() + " --prompt-ids 1 --device cuda");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("dsv4: error:"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST(CudaErrors, NoVisibleGpuAndBadDeviceAreOneLine) {
  DSV4_REQUIRE_GPU();
  const std::string m = model_dir("tiny-a");
  const CliResult none = cli("logprobs -m " + m + " --prompt-ids 1,2 --device cuda", "CUDA_VISIBLE_DEVICES=");
  EXPECT_EQ(none.rc, 1) << none.out;
  EXPECT_NE(none.out.find("no CUDA device"), std::string::npos) << none.out;
  EXPECT_EQ(std::count(none.out.begin(), none.out.end(), '\n'), 1) << none.out;
  const CliResult bad = cli("logprobs -m " + m + " --prompt-ids 1,2 --device cuda:7");
  EXPECT_EQ(bad.rc, 1) << bad.out;
  EXPECT_EQ(std::count(bad.out.begin(), bad.out.end(), '\n'), 1) << bad.out;
  // the default device of a CUDA build with a GPU is cuda:0, and it is named on stderr
  const CliResult ok = cli("logprobs -m " + m + " --prompt-ids 1,2");
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_NE(ok.out.find("device: cuda:0"), std::string::npos) << ok.out;
}

}  // namespace
}  // namespace dsv4::test
