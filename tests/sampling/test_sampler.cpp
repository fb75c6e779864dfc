#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "sampling/sampler.h"

using namespace dsv4;

namespace {

SamplingParams params(float temp, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temp;
  p.seed = seed;
  return p;
}

// Draw n tokens from fixed logits and count them.
std::vector<int> histogram(Sampler& s, const std::vector<float>& logits, int n) {
  std::vector<int> h(logits.size(), 0);
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    ++h[s.sample(l)];
  }
  return h;
}

std::vector<float> softmax(const std::vector<float>& l, float t) {
  float m = *std::max_element(l.begin(), l.end());
  std::vector<float> p(l.size());
  double z = 0;
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - m) / t);
  for (auto& x : p) x = static_cast<float>(x / z);
  return p;
}

}  // namespace

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(params(0.0f), 5);
  std::vector<float> l{0.1f, 3.0f, -1.0f, 3.0f, 2.9f};
  EXPECT_EQ(s.sample(l), 1);
  EXPECT_EQ(argmax(std::vector<float>{-5.f, -5.f}), 0);
}

// What argmax() must return: the first index that no later element exceeds, by the plain scan.
static int32_t first_strict_max_scan(const std::vector<float>& l) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(l.size()); ++i)
    if (l[i] > l[best]) best = i;
  return best;
}

TEST(Sampler, ArgmaxEqualsTheFirstStrictlyGreaterScan) {
  // argmax is the first index of the maximum, as `if (l[i] > l[best]) best = i` over i ascending: ties, +-0, +-inf,
  // NaNs (never chosen, except at index 0), lengths around its 16 lanes.
  std::mt19937 rng(3);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> special{0.0f, -0.0f, inf, -inf, nan, 1.0f, -1.0f, 3.0f};
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40) + (trial % 100 == 0 ? 129280 : 0);
    std::vector<float> l(static_cast<size_t>(n));
    const int mode = trial % 3;  // few distinct values (ties), specials, wide random
    for (auto& v : l)
      v = mode == 0 ? float(int(rng() % 4)) : mode == 1 ? special[rng() % special.size()]
                                                      : std::ldexp(float(int(rng() % 2001) - 1000), int(rng() % 20) - 10);
    EXPECT_EQ(argmax(l), first_strict_max_scan(l)) << "trial " << trial << " n " << n;
  }
}

TEST(Sampler, ArgmaxEqualsTheScanAtEveryLength) {
  // argmax's 16 lanes and scalar tail against the scan: every length 1..300 and whole vocabularies, ties (the lowest
  // id wins, also across lanes and in the tail), +-0, +-inf, the maximum anywhere
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  auto check = [&](const std::vector<float>& v) {
    ASSERT_EQ(argmax(v), first_strict_max_scan(v)) << "n=" << v.size();
  };
  for (int n = 1; n <= 300; ++n)
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& f : v) f = rep % 3 == 0 ? float(int(nd(rng))) : nd(rng);  // many exact ties
      if (rep % 5 == 1)
        for (auto& f : v) f = rng() % 2 ? 0.0f : -0.0f;
      if (rep % 5 == 2) v[rng() % v.size()] = INFINITY;
      if (rep % 5 == 3)
        for (auto& f : v) f = -INFINITY;
      check(v);
    }
  for (int64_t n : {129280, 129279, 129281}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& f : v) f = nd(rng);
    for (int64_t at : {int64_t(0), int64_t(7), int64_t(15), int64_t(16), n / 2, n - 17, n - 1}) {
      std::vector<float> w = v;
      w[size_t(at)] = 50.0f;
      check(w);
      w[size_t(n - 1 - at / 2)] = 50.0f;  // a later tie
      check(w);
      w[size_t(at / 3)] = 50.0f;  // an earlier tie
      check(w);
    }
  }
}

TEST(Sampler, TemperatureMatchesSoftmaxDistribution) {
  const std::vector<float> logits{1.0f, 2.0f, 0.0f, 2.5f, -1.0f, 1.5f};
  for (float t : {0.5f, 1.0f, 2.0f}) {
    Sampler s(params(t, 42), 6);
    const int n = 20000;
    auto h = histogram(s, logits, n);
    auto p = softmax(logits, t);
    for (size_t i = 0; i < p.size(); ++i) {
      double sd = std::sqrt(n * p[i] * (1 - p[i]));
      EXPECT_NEAR(h[i], n * p[i], 5 * sd + 2) << "t=" << t << " token " << i;
    }
  }
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDiffers) {
  std::vector<float> logits(1000);
  for (int i = 0; i < 1000; ++i) logits[i] = std::sin(i * 0.37f) * 3;
  auto run = [&](uint64_t seed) {
    Sampler s(params(1.0f, seed), 1000);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      auto l = logits;
      out.push_back(s.sample(l));
    }
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(Sampler, TopKKeepsOnlyKMostLikely) {
  const std::vector<float> logits{0.0f, 3.0f, 1.0f, 2.0f, 2.0f, -1.0f};
  SamplingParams p = params(1.0f, 3);
  p.top_k = 2;
  Sampler s(p, 6);
  auto h = histogram(s, logits, 5000);
  // top-2 is {1 (3.0), 3 (2.0)}: among the tied 3 and 4 the lower id wins.
  EXPECT_GT(h[1], 0);
  EXPECT_GT(h[3], 0);
  EXPECT_EQ(h[1] + h[3], 5000);
  double expected_1 = 5000 / (1 + std::exp(-1.0));
  EXPECT_NEAR(h[1], expected_1, 150);
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  // probabilities 0.5, 0.3, 0.15, 0.05 -> top_p 0.75 keeps {0, 1}; 0.81 keeps {0, 1, 2}.
  const std::vector<float> logits{std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  {
    SamplingParams p = params(1.0f, 5);
    p.top_p = 0.75f;
    Sampler s(p, 4);
    auto h = histogram(s, logits, 8000);
    EXPECT_EQ(h[2] + h[3], 0);
    EXPECT_NEAR(h[0], 8000 * 0.5 / 0.8, 200);
  }
  {
    SamplingParams p = params(1.0f, 5);
    p.top_p = 0.81f;
    Sampler s(p, 4);
    auto h = histogram(s, logits, 8000);
    EXPECT_GT(h[2], 0);
    EXPECT_EQ(h[3], 0);
  }
}

TEST(Sampler, TopPOnLargeVocabGrowsTheSortedHead) {
  // A flat distribution over 5000 tokens: the nucleus needs far more than the first 256 candidates.
  std::vector<float> logits(5000, 0.0f);
  SamplingParams p = params(1.0f, 9);
  p.top_p = 0.9f;
  Sampler s(p, 5000);
  auto h = histogram(s, logits, 4000);
  int used = 0, beyond = 0;
  for (int i = 0; i < 5000; ++i) {
    used += h[i] > 0;
    if (i >= 4500) beyond += h[i];
  }
  EXPECT_GT(used, 1000);  // way more than the first 256 candidates can be chosen
  EXPECT_EQ(beyond, 0);   // ties sort by id: the top 4500 ids form the nucleus
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  // p ~ 0.6, 0.3, 0.1: min_p 0.2 -> threshold 0.12 drops token 2.
  const std::vector<float> logits{std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  SamplingParams p = params(1.0f, 11);
  p.min_p = 0.2f;
  Sampler s(p, 3);
  auto h = histogram(s, logits, 6000);
  EXPECT_EQ(h[2], 0);
  EXPECT_NEAR(h[0], 4000, 180);
}

TEST(Sampler, RepetitionPenaltyAppliesToPromptAndOutput) {
  SamplingParams p = params(0.0f);
  p.repetition_penalty = 2.0f;
  Sampler s(p, 4);
  std::vector<int32_t> prompt{0};
  s.set_prompt(prompt);
  std::vector<float> l{3.0f, 2.0f, -1.0f, 1.0f};
  EXPECT_EQ(s.sample(l), 1);  // 3.0 / 2 = 1.5 < 2.0
  EXPECT_FLOAT_EQ(l[0], 1.5f);
  s.accept(1);
  std::vector<float> l2{2.0f, 2.0f, -1.0f, 1.2f};
  EXPECT_EQ(s.sample(l2), 3);  // 1.0, 1.0, -1, 1.2
  std::vector<float> l3{-1.0f, -2.0f, -1.5f, -3.0f};
  EXPECT_EQ(s.sample(l3), 2);  // -2, -4, -1.5, -3
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountOutputOnly) {
  SamplingParams p = params(0.0f);
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p, 3);
  std::vector<int32_t> prompt{2, 2, 2};
  s.set_prompt(prompt);  // not penalised by presence/frequency
  s.accept(0);
  s.accept(0);
  std::vector<float> l{2.0f, 1.5f, 1.0f};
  EXPECT_EQ(s.sample(l), 1);
  EXPECT_FLOAT_EQ(l[0], 2.0f - 0.5f - 0.5f);
  EXPECT_FLOAT_EQ(l[2], 1.0f);
}

TEST(Sampler, RejectsBadParametersAndSizes) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.temperature = -1.0f;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.presence_penalty = 3.0f;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.min_p = NAN;
  EXPECT_THROW(Sampler(p, 10), Error);
  Sampler s(SamplingParams{}, 4);
  std::vector<float> l(3);
  EXPECT_THROW(s.sample(l), Error);
  EXPECT_THROW(s.accept(4), Error);
}

// The range of every float field, its edges and its messages: validate() names the field and the value; range_error
// checks a value as given (a double beyond a float's range, shown as typed).
TEST(SamplingParams, RangesEdgesAndMessages) {
  struct Field {
    float SamplingParams::*field;
    double below, lo_edge, hi_edge, above;  // lo_edge / hi_edge: accepted (NAN: the edge itself is excluded)
    std::string message;                   // for `above`
  };
  const Field fields[] = {
      {&SamplingParams::temperature, -0.5, 0, 100, 101, "temperature must be in [0, 100], got 101"},
      {&SamplingParams::top_p, -1, NAN, 1, 1.5, "top_p must be in (0, 1], got 1.5"},
      {&SamplingParams::min_p, -0.1, 0, 1, 2, "min_p must be in [0, 1], got 2"},
      {&SamplingParams::repetition_penalty, -1, NAN, 10, 11, "repetition_penalty must be in (0, 10], got 11"},
      {&SamplingParams::presence_penalty, -3, -2, 2, 3, "presence_penalty must be in [-2, 2], got 3"},
      {&SamplingParams::frequency_penalty, -2.5, -2, 2, 2.5, "frequency_penalty must be in [-2, 2], got 2.5"}};
  for (const Field& f : fields) {
    auto validate_with = [&](double v) {
      SamplingParams p;
      p.*f.field = float(v);
      try {
        p.validate();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    EXPECT_EQ(validate_with(f.above), f.message);
    EXPECT_NE(validate_with(f.below), "");
    EXPECT_NE(validate_with(NAN), "");
    if (!std::isnan(f.lo_edge)) {
      EXPECT_EQ(validate_with(f.lo_edge), "");
    }
    EXPECT_EQ(validate_with(f.hi_edge), "");
    EXPECT_EQ(SamplingParams::range_error(f.field, f.hi_edge, "x"), "");
    EXPECT_EQ(SamplingParams::range_error(f.field, f.above, "as typed"),
              f.message.substr(0, f.message.rfind("got ") + 4) + "as typed");
    EXPECT_NE(SamplingParams::range_error(f.field, 1e308, "1e308"), "");  // inf as a float; shown as typed
  }
  EXPECT_EQ(SamplingParams::range_error(&SamplingParams::presence_penalty, 1e308, "1e308"),
            "presence_penalty must be in [-2, 2], got 1e308");
  EXPECT_EQ(SamplingParams::range_error(&SamplingParams::top_p, 0, "0"), "top_p must be in (0, 1], got 0");
}
