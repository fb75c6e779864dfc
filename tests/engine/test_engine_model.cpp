// Prefix reuse on the real forward pass (tiny-a test checkpoint): a warm engine that rewinds to a shared prefix must
// produce exactly what a cold engine produces (known-failure-modes §B), for rewinds at positions of every residue
// mod 4 and around the 128-token compression windows.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "model/model.h"

using namespace dsv4;

namespace {

std::vector<int32_t> ids(int n, int salt) {
  std::vector<int32_t> v{0};
  for (int i = 1; i < n; ++i) v.push_back(3 + (i * 131 + salt * 17) % 250);
  return v;
}

GenerationRequest greedy(std::vector<int32_t> prompt, int n) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = n;
  r.sampling.temperature = 0.0f;
  return r;
}

}  // namespace

TEST(EngineOnModel, RewindToAnyPrefixEqualsColdRun) {
  std::shared_ptr<const LanguageModel> model = Model::load(std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a");
  Engine warm(model, 4096, 64);
  const auto base = ids(150, 1);
  auto first = warm.generate(greedy(base, 4), nullptr);
  ASSERT_EQ(first.ids.size(), 4u);
  for (int common : {1, 2, 3, 4, 5, 63, 64, 127, 128, 129, 140}) {
    auto prompt = std::vector<int32_t>(base.begin(), base.begin() + common);
    auto tail = ids(150 - common + 1, common);
    prompt.insert(prompt.end(), tail.begin() + 1, tail.end());
    Engine cold(model, 4096, 64);
    auto want = cold.generate(greedy(prompt, 4), nullptr);
    ASSERT_EQ(warm.generate(greedy(base, 4), nullptr).ids, first.ids);  // warm holds base + output again
    auto got = warm.generate(greedy(prompt, 4), nullptr);
    EXPECT_GE(got.timings.cached_tokens, common) << "common prefix " << common;
    EXPECT_EQ(got.ids, want.ids) << "common prefix " << common;
  }
  // Continuing a conversation: prompt = previous prompt + output + more.
  auto cont = base;
  cont.insert(cont.end(), first.ids.begin(), first.ids.end());
  auto more = ids(10, 99);
  cont.insert(cont.end(), more.begin() + 1, more.end());
  warm.generate(greedy(base, 4), nullptr);
  auto got = warm.generate(greedy(cont, 4), nullptr);
  EXPECT_EQ(got.timings.cached_tokens, static_cast<int64_t>(base.size() + 3));
  EXPECT_EQ(got.ids, Engine(model, 4096, 64).generate(greedy(cont, 4), nullptr).ids);
}
