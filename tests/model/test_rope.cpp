// RoPE tables (spec §4.7): θ=10000 without YaRN for ratio-0 layers; θ=160000 with YaRN (low 15, high 25) otherwise.
#include <gtest/gtest.h>

#include <cmath>

#include "model/rope.h"

namespace dsv4 {
namespace {

RopeScaling flash_yarn() {
  RopeScaling s;
  s.enabled = true;
  s.type = "yarn";
  s.factor = 16;
  s.original_max_position_embeddings = 65536;
  s.beta_fast = 32;
  s.beta_slow = 1;
  return s;
}

TEST(Rope, PlainTableHasNoYarn) {
  RopeTable t(64, 10000.0, false, flash_yarn());
  for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(t.freqs()[size_t(i)], 1.0f / std::pow(10000.0f, float(2 * i) / 64.0f));
}

TEST(Rope, YarnBlendLow15High25) {
  RopeTable plain(64, 160000.0, false, flash_yarn()), yarn(64, 160000.0, true, flash_yarn());
  for (int i = 0; i < 32; ++i) {
    const float f = plain.freqs()[size_t(i)], g = yarn.freqs()[size_t(i)];
    if (i <= 15) EXPECT_EQ(g, f) << i;                        // ramp 0: unchanged
    else if (i >= 25) EXPECT_FLOAT_EQ(g, f / 16.0f) << i;      // ramp 1: divided by the factor
    else {
      EXPECT_LT(g, f) << i;
      EXPECT_GT(g, f / 16.0f) << i;
    }
  }
}

TEST(Rope, CosSinOfPosition) {
  RopeTable t(64, 10000.0, false, {});
  std::vector<float> cs(64);
  t.cos_sin(0, cs.data());
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(cs[size_t(2 * i)], 1.0f);
    EXPECT_EQ(cs[size_t(2 * i + 1)], 0.0f);
  }
  t.cos_sin(1000, cs.data());
  for (int i = 0; i < 32; ++i) {
    const float a = 1000.0f * t.freqs()[size_t(i)];
    EXPECT_EQ(cs[size_t(2 * i)], std::cos(a));
    EXPECT_EQ(cs[size_t(2 * i + 1)], std::sin(a));
  }
}

}  // namespace
}  // namespace dsv4
