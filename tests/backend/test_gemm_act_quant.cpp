// Activation quantization (spec §4.3, §4.4) against the format/numeric.h encoders and the spec's scale formula.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/act_quant.h"
#include "format/numeric.h"

namespace dsv4 {
namespace {

// 2^ceil(log2 t) via frexp (independent of the kernels' bit trick).
float ceil_pow2(float t) {
  int e;
  const float m = std::frexp(t, &e);
  return std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
}

std::vector<float> sample_values(std::mt19937& rng, int n) {
  std::vector<float> v;
  std::uniform_real_distribution<float> mag(-12.0f, 10.0f);
  std::normal_distribution<float> nd;
  for (int i = 0; i < n; ++i) v.push_back(nd(rng) * std::exp2(mag(rng)));
  // exact e4m3 / e2m1 values and midpoints (ties) between neighbours
  for (int b = 0; b < 0x7F; ++b) {
    const float a = e4m3fn_to_float(static_cast<uint8_t>(b)), c = e4m3fn_to_float(static_cast<uint8_t>(b + 1));
    if (b + 1 < 0x7F) v.insert(v.end(), {a, (a + c) / 2, -(a + c) / 2, std::nextafter((a + c) / 2, 0.0f)});
  }
  for (float f : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f, 0.0f, -0.0f, 448.0f, 464.0f})
    v.insert(v.end(), {f, -f});
  return v;
}

TEST(ActQuant, ScaleFormula) {
  EXPECT_EQ(fp8_act_scale(0.0f), ceil_pow2(1e-4f * (1.0f / 448.0f)));
  EXPECT_EQ(fp8_act_scale(448.0f), 1.0f);  // t = 1 exactly: no round-up
  EXPECT_EQ(fp8_act_scale(449.0f), 2.0f);
  EXPECT_EQ(fp8_act_scale(896.0f), 2.0f);
  EXPECT_EQ(fp4_act_scale(6.0f), 1.0f);
  EXPECT_EQ(fp4_act_scale(6.5f), 2.0f);
  EXPECT_EQ(fp4_act_scale(0.0f), ceil_pow2(6.0f * 0x1p-126f * (1.0f / 6.0f)));
  std::mt19937 rng(7);
  for (float a : sample_values(rng, 2000)) {
    const float m = std::fabs(a);
    EXPECT_EQ(fp8_act_scale(m), ceil_pow2(std::max(m, 1e-4f) * (1.0f / 448.0f))) << m;
    EXPECT_EQ(fp4_act_scale(m), ceil_pow2(std::max(m, 6.0f * 0x1p-126f) * (1.0f / 6.0f))) << m;
  }
}

TEST(ActQuant, Fp8MatchesEncoder) {
  std::mt19937 rng(8);
  std::vector<float> x = sample_values(rng, 5000);
  const int64_t n = static_cast<int64_t>(x.size());
  for (int64_t block : {128, 64}) {
    std::vector<float> q(n), s((n + block - 1) / block), ip = x;
    act_quant_fp8(x.data(), n, block, q.data(), s.data());
    act_quant_fp8_inplace(ip.data(), n, block);
    for (int64_t b = 0; b * block < n; ++b) {
      float amax = 0;
      for (int64_t i = b * block; i < std::min(n, b * block + block); ++i) amax = std::max(amax, std::fabs(x[i]));
      const float sc = ceil_pow2(std::max(amax, 1e-4f) * (1.0f / 448.0f));
      ASSERT_EQ(s[b], sc);
      for (int64_t i = b * block; i < std::min(n, b * block + block); ++i) {
        const float want = e4m3fn_to_float(float_to_e4m3fn_rne_satfinite(std::clamp(x[i] / sc, -448.0f, 448.0f)));
        ASSERT_EQ(float_to_bits(q[i]), float_to_bits(want)) << x[i] << " / " << sc;
        ASSERT_EQ(float_to_bits(ip[i]), float_to_bits(round_to_bf16(want * sc))) << x[i];
      }
    }
  }
}

TEST(ActQuant, Fp8EveryValueOnUnitScale) {
  // With one element of 448 in the block the scale is 1, so q is the plain e4m3 rounding of each value.
  std::mt19937 rng(9);
  std::vector<float> v = sample_values(rng, 3000);
  for (size_t i = 0; i < v.size(); ++i) {
    float blk[2] = {448.0f, std::clamp(v[i], -448.0f, 448.0f)}, q[2], s[1];
    act_quant_fp8(blk, 2, 128, q, s);
    ASSERT_EQ(s[0], 1.0f);
    ASSERT_EQ(float_to_bits(q[1]), float_to_bits(e4m3fn_to_float(float_to_e4m3fn_rne_satfinite(blk[1])))) << blk[1];
  }
}

TEST(ActQuant, Fp4MatchesEncoder) {
  std::mt19937 rng(10);
  std::vector<float> x = sample_values(rng, 4000);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> ip = x;
  fp4_act_quant_inplace(ip.data(), n);
  for (int64_t b = 0; b * 32 < n; ++b) {
    float amax = 0;
    for (int64_t i = b * 32; i < std::min<int64_t>(n, b * 32 + 32); ++i) amax = std::max(amax, std::fabs(x[i]));
    const float sc = ceil_pow2(std::max(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
    for (int64_t i = b * 32; i < std::min<int64_t>(n, b * 32 + 32); ++i) {
      const float want = round_to_bf16(e2m1_to_float(float_to_e2m1_rne(std::clamp(x[i] / sc, -6.0f, 6.0f))) * sc);
      ASSERT_EQ(float_to_bits(ip[i]), float_to_bits(want)) << x[i] << " / " << sc;
    }
  }
  // ties of spec §4.4 on a unit scale (block max 6)
  float t[9] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f};
  fp4_act_quant_inplace(t, 9);
  const float want[9] = {6.0f, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, -0.0f};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(float_to_bits(t[i]), float_to_bits(want[i])) << i;
}

TEST(ActQuant, NonFiniteInputsClampLikeFminFmax) {
  // The clamp of spec §4.3 / §4.4 is fmin(fmax(x / s, -M), M): a NaN element becomes -M, +-inf the bound (the block
  // scale ignores NaN; an inf element makes the scale inf). Checked against the libm formula.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> x{1.5f, nan, -2.0f, 100.0f, -nan, 0.0f, -0.0f, 3.0f};
  for (int i = 0; i < 24; ++i) x.push_back(0.37f * float(i - 11));
  const int64_t n = static_cast<int64_t>(x.size());  // 32: one fp4 block, one fp8 block
  std::vector<float> q(n), s(1), ip = x;
  act_quant_fp8(x.data(), n, 128, q.data(), s.data());
  act_quant_fp8_inplace(ip.data(), n, 128);
  ASSERT_EQ(s[0], ceil_pow2(100.0f / 448.0f));
  for (int64_t i = 0; i < n; ++i) {
    const float c = std::fmin(std::fmax(x[i] * (1.0f / s[0]), -448.0f), 448.0f);
    const float want = e4m3fn_to_float(float_to_e4m3fn_rne_satfinite(c));
    ASSERT_EQ(float_to_bits(q[i]), float_to_bits(want)) << i;
    ASSERT_EQ(float_to_bits(ip[i]), float_to_bits(round_to_bf16(want * s[0]))) << i;
  }
  std::vector<float> f4 = x;
  fp4_act_quant_inplace(f4.data(), n);
  const float s4 = ceil_pow2(100.0f / 6.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float c = std::fmin(std::fmax(x[i] * (1.0f / s4), -6.0f), 6.0f);
    ASSERT_EQ(float_to_bits(f4[i]), float_to_bits(round_to_bf16(e2m1_to_float(float_to_e2m1_rne(c)) * s4))) << i;
  }
  // an inf element: scale inf, every element x * 0 (inf * 0 = NaN -> -448)
  std::vector<float> y{inf, 1.0f, -inf, -1.0f};
  std::vector<float> qy(4), sy(1);
  act_quant_fp8(y.data(), 4, 128, qy.data(), sy.data());
  ASSERT_EQ(sy[0], inf);
  for (int i = 0; i < 4; ++i) {
    const float c = std::fmin(std::fmax(y[size_t(i)] * (1.0f / sy[0]), -448.0f), 448.0f);
    ASSERT_EQ(float_to_bits(qy[size_t(i)]), float_to_bits(e4m3fn_to_float(float_to_e4m3fn_rne_satfinite(c)))) << i;
  }
}

TEST(ActQuant, RoundBf16) {
  float v[4] = {1.0f, 1.00390625f /*tie 1 + 2^-8: to even*/, 1.01171875f /*1+3*2^-8: up*/, -3.0e-39f};
  round_bf16_inplace(v, 4);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 1.0f);
  EXPECT_EQ(v[2], 1.015625f);
  EXPECT_EQ(float_to_bits(v[3]), float_to_bits(round_to_bf16(-3.0e-39f)));
}

}  // namespace
}  // namespace dsv4
