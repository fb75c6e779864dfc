// Greedy decoding of the trained demo model (models/dsv4-demo) against task F/D's fixtures:
// tests/data/demo/greedy_dense.json (HF transformers fp32, exported weights dequantized) for Numerics::dense, and
// tests/data/demo/greedy_reference.json (official inference/model.py, prefill + one token per call) for reference.
// Decoding runs through ModelSequence::append (prefill, then one token per step), i.e. the engine's path.
#include <fstream>

#include <nlohmann/json.hpp>

#include "model_test_util.h"

namespace dsv4::test {
namespace {

const std::string kDemo = std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo";

const Model& demo(Numerics num) {
  static std::map<int, std::unique_ptr<Model>> cache;
  auto& m = cache[int(num)];
  if (!m) {
    (void)tiny("tiny-a", num);  // same single-thread policy as the tiny models
    ModelOptions o;
    o.numerics = num;
    m = Model::load(kDemo, o);
  }
  return *m;
}

nlohmann::json load_json(const std::string& rel) {
  std::ifstream f(std::string(DSV4_SOURCE_DIR) + "/" + rel);
  if (!f) {
    ADD_FAILURE() << "missing fixture " << rel;
    return {};
  }
  return nlohmann::json::parse(f);
}

std::vector<int32_t> greedy(const Model& m, const std::vector<int32_t>& prompt, int n_new) {
  ModelSequence seq(m);
  std::vector<float> lg(static_cast<size_t>(m.n_vocab()));
  seq.append(prompt, lg);
  std::vector<int32_t> out;
  for (int i = 0; i < n_new; ++i) {
    out.push_back(argmax(lg));
    if (i + 1 < n_new) seq.append(std::span<const int32_t>(&out.back(), 1), lg);
  }
  return out;
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

TEST(DemoModel, CpuHeadHasItsPanelCopy) {
  // the CPU backend keeps a panel copy of the BF16 head for the decode GEMVs (Backend::add_head_layout)
  const WeightView& h = demo(Numerics::reference).head_weight();
  EXPECT_EQ(h.fmt, GemmFormat::bf16);
  EXPECT_NE(h.panels, nullptr);
}

TEST(DemoModel, DenseGreedyMatchesHfUntilANearTie) {
  const auto j = load_json("tests/data/demo/greedy_dense.json");
  ASSERT_TRUE(j.contains("prompts"));
  const Model& m = demo(Numerics::dense);
  size_t total = 0, matched = 0;
  for (const auto& p : j["prompts"]) {
    const auto prompt = p.at("prompt_ids").get<std::vector<int32_t>>();
    const auto want = p.at("greedy_ids").get<std::vector<int32_t>>();
    const auto margin = p.at("top2_margin").get<std::vector<double>>();
    const auto got = greedy(m, prompt, int(want.size()));
    // every step up to (and including) the first HF near-tie must match exactly
    size_t must = want.size();
    for (size_t i = 0; i < margin.size(); ++i)
      if (margin[i] < 1e-3) {
        must = i;
        break;
      }
    const size_t cp = common_prefix(got, want);
    EXPECT_GE(cp, must) << p.value("text", "");
    total += want.size();
    matched += cp;
  }
  std::printf("[demo] dense greedy: %zu / %zu tokens in common prefixes\n", matched, total);
}

TEST(DemoModel, ReferenceGreedyFollowsTheOfficialCode) {
  const auto j = load_json("tests/data/demo/greedy_reference.json");
  ASSERT_TRUE(j.contains("prompts"));
  const Model& m = demo(Numerics::reference);
  size_t total = 0, matched = 0, full = 0, n = 0;
  for (const auto& p : j["prompts"]) {
    const auto prompt = p.at("prompt_ids").get<std::vector<int32_t>>();
    const auto want = p.at("greedy_ids").get<std::vector<int32_t>>();
    const auto got = greedy(m, prompt, int(want.size()));
    const size_t cp = common_prefix(got, want);
    if (cp < want.size()) {
      // our top-2 margin at the first divergent step: a genuine disagreement would show a clear margin
      std::vector<int32_t> ctx = prompt;
      ctx.insert(ctx.end(), want.begin(), want.begin() + int64_t(cp));
      ModelSequence seq(m);
      std::vector<float> lg(static_cast<size_t>(m.n_vocab()));
      seq.append(ctx, lg);
      const float ours = lg[size_t(argmax(lg))], theirs = lg[size_t(want[cp])];
      std::printf("[demo] reference diverges at step %zu: our logit gap to the reference token %.4f\n", cp,
                  double(ours - theirs));
      EXPECT_LT(ours - theirs, 0.02f) << "clear disagreement with the reference at step " << cp;
    }
    total += want.size();
    matched += cp;
    full += cp == want.size();
    ++n;
  }
  std::printf("[demo] reference greedy: %zu / %zu tokens in common prefixes, %zu / %zu prompts identical\n", matched,
              total, full, n);
  // bf16 near-ties can legitimately flip a greedy step (accumulation order); require most of the text to agree
  EXPECT_GE(double(matched), 0.75 * double(total));
  EXPECT_GE(double(full), 0.5 * double(n));
}

}  // namespace
}  // namespace dsv4::test
