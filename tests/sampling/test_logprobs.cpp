// Log-probabilities of a position: log_softmax of the raw logits, top-n with ties towards the lower id.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "sampling/logprobs.h"

using namespace dsv4;

TEST(Logprobs, LogSoftmaxAndTopN) {
  const std::vector<float> l = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  double z = 0;
  for (float x : l) z += std::exp(x);
  const auto r = token_logprobs(l, 4, 3);
  EXPECT_EQ(r.id, 4);
  EXPECT_NEAR(r.logprob, 0.5 - std::log(z), 1e-6);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].id, 1);  // tie 1 / 2: lower id first
  EXPECT_EQ(r.top[1].id, 2);
  EXPECT_EQ(r.top[2].id, 0);
  EXPECT_NEAR(r.top[0].logprob, 3.0 - std::log(z), 1e-6);
  double total = 0;
  for (float x : l) total += std::exp(x - std::log(z));
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_EQ(token_logprobs(l, 0, 0).top.size(), 0u);
  EXPECT_EQ(token_logprobs(l, 0, 50).top.size(), 5u);  // clamped to the vocabulary
  EXPECT_THROW(token_logprobs(l, 5, 1), Error);
  EXPECT_THROW(token_logprobs(l, 0, -1), Error);
}

TEST(Logprobs, LargeVocabularyTopMatchesSort) {
  std::vector<float> l(129280);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>((i * 7919) % 1000) * 0.01f;
  const auto r = token_logprobs(l, 17, 20);
  ASSERT_EQ(r.top.size(), 20u);
  for (size_t k = 1; k < r.top.size(); ++k) {
    EXPECT_TRUE(r.top[k - 1].logprob > r.top[k].logprob ||
                (r.top[k - 1].logprob == r.top[k].logprob && r.top[k - 1].id < r.top[k].id));
  }
  EXPECT_EQ(l[r.top[0].id], *std::max_element(l.begin(), l.end()));
}
