// Exhaustive tests of the number-format decoders/encoders against the definitions of spec §3.6, §4.3, §4.4.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "format/dtype.h"
#include "format/numeric.h"

namespace dsv4 {
namespace {

// Spec definition of E4M3FN: bias 7, subnormal m*2^-9, 0x7F/0xFF NaN, no infinities.
double e4m3_spec(int b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(Numeric, E4m3AllBytes) {
  int nans = 0;
  for (int b = 0; b < 256; ++b) {
    const double want = e4m3_spec(b);
    const float got = e4m3fn_to_float(uint8_t(b));
    EXPECT_EQ(float_to_bits(e4m3fn_lut()[b]), float_to_bits(got)) << b;
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << b;
      ++nans;
      continue;
    }
    EXPECT_EQ(double(got), want) << "byte " << b;
    EXPECT_EQ(std::signbit(got), bool(b & 0x80)) << b;  // -0.0 for 0x80
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(e4m3fn_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3fn_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3fn_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3fn_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3fn_to_float(0x38), 1.0f);
}

TEST(Numeric, E8m0AllBytes) {
  for (int e = 0; e < 256; ++e) {
    const float got = e8m0_to_float(uint8_t(e));
    if (e == 255) {
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    EXPECT_EQ(double(got), std::ldexp(1.0, e - 127)) << e;
  }
  // e = 0 is the binary32 subnormal 2^-127 built bitwise (not flushed to zero).
  EXPECT_EQ(float_to_bits(e8m0_to_float(0)), 0x00400000u);
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(120), 1.0f / 128);  // the "2^-7 -> 0" pitfall of numeric casts (spec §3.6)
}

TEST(Numeric, E2m1AllNibbles) {
  const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int n = 0; n < 16; ++n) {
    const double want = (n & 8) ? -mag[n & 7] : mag[n & 7];
    EXPECT_EQ(double(e2m1_to_float(uint8_t(n))), want) << n;
    EXPECT_EQ(e2m1_lut()[n], e2m1_to_float(uint8_t(n)));
    EXPECT_EQ(e2m1_to_float(uint8_t(n | 0xF0)), e2m1_to_float(uint8_t(n))) << "only the low nibble is used";
  }
  // Packed pairs: element 2j = low nibble, 2j+1 = high nibble.
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(e2m1_pair_lut()[b][0], e2m1_to_float(uint8_t(b & 15)));
    EXPECT_EQ(e2m1_pair_lut()[b][1], e2m1_to_float(uint8_t(b >> 4)));
  }
  EXPECT_EQ(e2m1_pair_lut()[0x72][0], 1.0f);
  EXPECT_EQ(e2m1_pair_lut()[0x72][1], 6.0f);
}

TEST(Numeric, Bf16AndF16Decode) {
  for (uint32_t h = 0; h < 65536; ++h) {
    EXPECT_EQ(float_to_bits(bf16_to_float(uint16_t(h))), h << 16);
    // IEEE binary16 definition
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const float got = f16_to_float(uint16_t(h));
    if (e == 31) {
      if (m == 0) EXPECT_TRUE(std::isinf(got) && std::signbit(got) == bool(s)) << h;
      else EXPECT_TRUE(std::isnan(got)) << h;
      continue;
    }
    const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
    EXPECT_EQ(double(got), s ? -mag : mag) << h;
    EXPECT_EQ(std::signbit(got), bool(s)) << h;
  }
}

// Reference rounding: nearest representable value by exhaustive search, ties to the even code (lowest code bit 0).
template <typename Decode>
int nearest_code(double x, int n_codes, Decode dec, bool (*skip)(int)) {
  int best = -1;
  double bd = 0;
  for (int c = 0; c < n_codes; ++c) {
    if (skip(c)) continue;
    const double v = dec(c);
    const double d = std::fabs(v - x);
    if (best < 0 || d < bd || (d == bd && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      bd = d;
    }
  }
  return best;
}

bool e4m3_skip_pos(int c) { return c == 0x7F || c > 0x7F; }

TEST(Numeric, E4m3EncodeRoundTripAndTies) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;
    EXPECT_EQ(float_to_e4m3fn_rne_satfinite(e4m3fn_to_float(uint8_t(b))), b) << b;
  }
  // Every midpoint between neighbours rounds to the even code; nudged midpoints round to the nearer one.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = e4m3fn_to_float(uint8_t(c)), hi = e4m3fn_to_float(uint8_t(c + 1));
    const float mid = (lo + hi) / 2;  // exact in binary32
    const int even = (c & 1) ? c + 1 : c;
    EXPECT_EQ(float_to_e4m3fn_rne_satfinite(mid), even) << "tie between codes " << c << " and " << c + 1;
    EXPECT_EQ(float_to_e4m3fn_rne_satfinite(-mid), 0x80 | even);
    EXPECT_EQ(float_to_e4m3fn_rne_satfinite(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(float_to_e4m3fn_rne_satfinite(std::nextafter(mid, 1e9f)), c + 1);
  }
  // Saturation (satfinite) and specials.
  EXPECT_EQ(float_to_e4m3fn_rne_satfinite(464.0f), 0x7E);  // tie 448 | (480 = NaN code) -> 448
  EXPECT_EQ(float_to_e4m3fn_rne_satfinite(1e6f), 0x7E);
  EXPECT_EQ(float_to_e4m3fn_rne_satfinite(-1e6f), 0xFE);
  EXPECT_EQ(float_to_e4m3fn_rne_satfinite(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(float_to_e4m3fn_rne_satfinite(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(float_to_e4m3fn_rne_satfinite(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
  EXPECT_EQ(float_to_e4m3fn_rne_satfinite(std::ldexp(1.0f, -10)), 0x00);       // tie 0 | 2^-9 -> 0 (even)
  EXPECT_EQ(float_to_e4m3fn_rne_satfinite(std::ldexp(3.0f, -11)), 0x01);       // 0.75 * 2^-9 -> 2^-9
  EXPECT_EQ(float_to_e4m3fn_rne_satfinite(std::ldexp(3.0f, -10)), 0x02);       // tie 1|2 (x 2^-9) -> 2 (even)
  EXPECT_EQ(float_to_e4m3fn_rne_satfinite(1e-30f), 0x00);
  EXPECT_EQ(float_to_e4m3fn_rne_satfinite(-1e-30f), 0x80);
  // Random values vs the exhaustive reference.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> ex(-14.0f, 9.5f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::ldexp(1.0f + (rng() & 0xFFFFFF) / float(1 << 24), int(ex(rng)));
    const int want = nearest_code(x, 0x7F, [](int c) { return double(e4m3fn_to_float(uint8_t(c))); }, e4m3_skip_pos);
    ASSERT_EQ(float_to_e4m3fn_rne_satfinite(x), want) << x;
    ASSERT_EQ(float_to_e4m3fn_rne_satfinite(-x), 0x80 | want) << -x;
  }
}

bool e2m1_skip_pos(int c) { return c > 7; }

TEST(Numeric, E2m1EncodeTies) {
  for (int n = 0; n < 16; ++n) {
    const uint8_t got = float_to_e2m1_rne(e2m1_to_float(uint8_t(n)));
    EXPECT_EQ(got, n) << n;
  }
  struct Case { float x; int code; };
  const Case cases[] = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6},
                        {0.2500001f, 1}, {0.7499999f, 1}, {5.0000005f, 7}, {6.5f, 7}, {100.0f, 7}};
  for (const auto& k : cases) {
    EXPECT_EQ(float_to_e2m1_rne(k.x), k.code) << k.x;
    EXPECT_EQ(float_to_e2m1_rne(-k.x), 8 | k.code) << -k.x;
  }
  EXPECT_EQ(float_to_e2m1_rne(std::numeric_limits<float>::infinity()), 7);
  EXPECT_EQ(float_to_e2m1_rne(-0.1f), 8);  // -0.0
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.0f, 7.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = u(rng);
    const int want = nearest_code(x, 8, [](int c) { return double(e2m1_to_float(uint8_t(c))); }, e2m1_skip_pos);
    ASSERT_EQ(float_to_e2m1_rne(x), want) << x;
  }
}

TEST(Numeric, Bf16RoundNearestEven) {
  EXPECT_EQ(float_to_bf16_rne(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16_rne(bits_to_float(0x3F808000u)), 0x3F80);  // tie -> even
  EXPECT_EQ(float_to_bf16_rne(bits_to_float(0x3F818000u)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16_rne(bits_to_float(0x3F808001u)), 0x3F81);
  EXPECT_EQ(float_to_bf16_rne(bits_to_float(0x7F7FFFFFu)), 0x7F80);  // FLT_MAX rounds to inf
  EXPECT_EQ(float_to_bf16_rne(bits_to_float(0xFF800000u)), 0xFF80);
  EXPECT_EQ(float_to_bf16_rne(bits_to_float(0x7F800001u)) & 0x7FC0, 0x7FC0);  // NaN stays NaN
  EXPECT_EQ(float_to_bf16_rne(bits_to_float(0xFFC00001u)), 0xFFC0);
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t b = rng();
    const float x = bits_to_float(b);
    if (std::isnan(x) || std::isinf(x)) continue;
    const uint16_t lo = uint16_t(b >> 16);
    const double vlo = bf16_to_float(lo), vhi = bf16_to_float(uint16_t(lo + 1));
    const double dlo = std::fabs(double(x) - vlo), dhi = std::fabs(double(x) - vhi);
    const uint16_t want = dlo < dhi ? lo : dhi < dlo ? uint16_t(lo + 1) : ((lo & 1) ? uint16_t(lo + 1) : lo);
    if (std::isinf(vhi)) continue;  // overflow boundary: checked with FLT_MAX above
    ASSERT_EQ(float_to_bf16_rne(x), want) << std::hex << b;
  }
}

TEST(Numeric, DTypeNamesAndSizes) {
  const DType all[] = {DType::BF16, DType::F16, DType::F32, DType::I64, DType::I32,
                       DType::I8,   DType::U8,  DType::F8_E4M3, DType::F8_E8M0};
  const size_t sizes[] = {2, 2, 4, 8, 4, 1, 1, 1, 1};
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(dtype_size(all[i]), sizes[i]);
    auto back = parse_dtype(dtype_name(all[i]));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, all[i]);
  }
  EXPECT_FALSE(parse_dtype("bf16").has_value());
  EXPECT_FALSE(parse_dtype("F64").has_value());
  EXPECT_FALSE(parse_dtype("").has_value());
}

}  // namespace
}  // namespace dsv4
