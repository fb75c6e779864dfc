// Golden tests against task D's fixtures (tests/data/golden/README.md): `<model>.dense.json` (HF transformers, fp32,
// no quantization simulation) for Numerics::dense and `<model>.reference.json` (official inference/model.py with
// pure-PyTorch kernels) for Numerics::reference. Prompt lengths 1–9, 127–130, 255–258, 511–513, 2047–2050: each golden
// prompt is one long prefill; by causality a prefill of its first L tokens must reproduce its positions < L.
#include <fstream>

#include <nlohmann/json.hpp>

#include "model_test_util.h"

namespace dsv4::test {
namespace {

struct GoldenPrompt {
  std::vector<int32_t> ids;
  std::vector<std::vector<int32_t>> top_ids;
  std::vector<std::vector<double>> top_lp;
};
struct Golden {
  std::vector<GoldenPrompt> prompts;
  nlohmann::json meta;
};

Golden load_golden(const std::string& model, const std::string& numerics) {
  const std::string path = std::string(DSV4_SOURCE_DIR) + "/tests/data/golden/" + model + "." + numerics + ".json";
  std::ifstream f(path);
  if (!f) ADD_FAILURE() << "missing golden file " << path;
  Golden g;
  if (!f) return g;
  nlohmann::json j = nlohmann::json::parse(f);
  for (const auto& p : j.at("prompts")) {
    GoldenPrompt gp;
    gp.ids = p.at("ids").get<std::vector<int32_t>>();
    gp.top_ids = p.at("top_ids").get<std::vector<std::vector<int32_t>>>();
    gp.top_lp = p.at("top_logprobs").get<std::vector<std::vector<double>>>();
    g.prompts.push_back(std::move(gp));
  }
  j.erase("prompts");
  g.meta = std::move(j);
  return g;
}

// Lengths tested per golden prompt length (the prompt's own group, see the file comment).
std::vector<int64_t> lengths_for(int64_t L) {
  std::vector<int64_t> out;
  auto add = [&](int64_t a, int64_t b) {
    for (int64_t x = a; x <= b && x <= L; ++x) out.push_back(x);
  };
  if (L <= 9) add(1, 9);
  else if (L <= 130) add(127, 130);
  else if (L <= 258) add(255, 258);
  else if (L <= 513) add(511, 513);
  else add(2047, 2050);
  return out;
}

struct Stats {
  std::vector<double> diffs;     // |Δ logprob| over the golden's top-20 ids, all positions
  int64_t positions = 0, top1_agree = 0, top1_checked = 0;
  double quantile(double q) const {
    if (diffs.empty()) return 0;
    std::vector<double> d = diffs;
    std::sort(d.begin(), d.end());
    return d[std::min(d.size() - 1, size_t(q * double(d.size())))];
  }
};

// Compare our logits row (position p) against the golden entry; record stats. Dense mode also asserts the strict
// per-position rule (tokens in both top-20 lists within 2e-3; same argmax where the golden top-2 gap > 1e-3).
void compare_row(std::span<const float> lg, const GoldenPrompt& g, size_t p, bool strict, Stats& st,
                 const std::string& where) {
  const auto lp = log_softmax(lg);
  const auto& gi = g.top_ids[p];
  const auto& gl = g.top_lp[p];
  std::vector<int32_t> ours(lp.size());
  std::iota(ours.begin(), ours.end(), 0);
  const size_t k = std::min<size_t>(gi.size(), ours.size());
  std::partial_sort(ours.begin(), ours.begin() + k, ours.end(), [&](int32_t a, int32_t b) { return lp[a] > lp[b]; });
  std::vector<char> in_ours(lp.size(), 0);
  for (size_t i = 0; i < k; ++i) in_ours[size_t(ours[i])] = 1;
  for (size_t i = 0; i < gi.size(); ++i) {
    const double d = std::abs(lp[size_t(gi[i])] - gl[i]);
    st.diffs.push_back(d);
    if (strict && in_ours[size_t(gi[i])]) {
      EXPECT_LE(d, 2e-3) << where << " token " << gi[i];
    }
  }
  ++st.positions;
  const bool clear_top1 = gl.size() < 2 || gl[0] - gl[1] > 1e-3;
  if (clear_top1) {
    ++st.top1_checked;
    if (ours[0] == gi[0]) ++st.top1_agree;
    if (strict) {
      EXPECT_EQ(ours[0], gi[0]) << where << " argmax (golden gap " << (gl[0] - gl[1]) << ")";
    }
  }
}

class GoldenTest : public ::testing::TestWithParam<std::tuple<std::string, Numerics>> {};

TEST_P(GoldenTest, MatchesFixture) {
  const auto& [name, num] = GetParam();
  const bool dense = num == Numerics::dense;
  const Golden g = load_golden(name, std::string(numerics_name(num)));
  ASSERT_FALSE(g.prompts.empty());
  const Model& m = tiny(name, num);
  const int64_t V = m.n_vocab();
  Stats st;
  for (const auto& gp : g.prompts) {
    const int64_t L = int64_t(gp.ids.size());
    ASSERT_EQ(int64_t(gp.top_ids.size()), L);
    // one full prefill: every position
    const auto full = m.logits_all(gp.ids);
    for (int64_t p = 0; p < L; ++p)
      compare_row(std::span<const float>(&full[size_t(p * V)], size_t(V)), gp, size_t(p), dense, st,
                  name + " L=" + std::to_string(L) + " p=" + std::to_string(p));
    // separate prefills of the group's lengths, last position against the golden
    for (int64_t len : lengths_for(L)) {
      if (len == L) continue;
      ModelSequence seq(m);
      std::vector<float> lg(static_cast<size_t>(V));
      seq.append(std::span<const int32_t>(gp.ids.data(), size_t(len)), lg);
      Stats dummy;
      compare_row(lg, gp, size_t(len - 1), dense, dense ? st : dummy,
                  name + " prefill length " + std::to_string(len));
      EXPECT_TRUE(std::equal(lg.begin(), lg.end(), full.begin() + (len - 1) * V)) << "prefill length " << len;
    }
  }
  const double med = st.quantile(0.5), p99 = st.quantile(0.99);
  const double agree = st.top1_checked ? double(st.top1_agree) / double(st.top1_checked) : 1.0;
  std::printf("[golden] %s %s: positions %ld, |dlogprob| median %.2e p99 %.2e max %.2e, top1 agree %.4f\n",
              name.c_str(), std::string(numerics_name(num)).c_str(), long(st.positions), med, p99, st.quantile(1.0),
              agree);
  if (!dense) {
    // The engine must land within the oracle's own noise floor (the same reference code on CPU vs CUDA: accumulation
    // order + indexer top-k tie handling). On these random, non-QAT tiny models a rounding-level difference can flip
    // an FP8 block scale / an indexer selection and move later logprobs by O(0.1-1), hence quantile checks.
    ASSERT_TRUE(g.meta.contains("noise_floor")) << "reference golden without noise_floor";
    const auto& nf = g.meta["noise_floor"];
    EXPECT_LE(med, std::max(nf.value("median", 0.0), 1e-4)) << "median |dlogprob| above the oracle noise floor";
    EXPECT_LE(p99, std::max(nf.value("p99", 0.0), 1e-3)) << "p99 |dlogprob| above the oracle noise floor";
    EXPECT_GE(agree, std::min(nf.value("top1_agree", 1.0), 1.0)) << "top-1 agreement below the oracle noise floor";
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, GoldenTest,
                         ::testing::Combine(::testing::Values("tiny-a", "tiny-b"),
                                            ::testing::Values(Numerics::reference, Numerics::dense)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n + "_" + std::string(numerics_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace dsv4::test
