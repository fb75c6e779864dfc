// Compact state row formats (format/row_format.h): sizes, byte layout, exact round trips of every e4m3 code and
// every e2m1 nibble at scale extremes, zero signs, and the rejection of values that are not representable.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "format/numeric.h"
#include "format/row_format.h"

namespace dsv4 {
namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Decode(encode(x)) == x bitwise; returns encode's exactness flag.
bool round_trip(const RowCodec& c, const std::vector<float>& x, std::vector<float>* back = nullptr,
                std::vector<uint8_t>* bytes = nullptr) {
  std::vector<uint8_t> b(size_t(c.bytes()), 0xAB);
  const bool exact = encode_row(c, x.data(), b.data());
  std::vector<float> y(size_t(c.dim), 12345.0f);
  decode_row(c, b.data(), y.data());
  if (back) *back = y;
  if (bytes) *bytes = b;
  return exact;
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(bits(a[i]), bits(b[i])) << "element " << i << ": " << a[i] << " vs " << b[i];
}

TEST(RowFormat, SizesFollowTheSpec) {
  EXPECT_EQ(RowCodec::kv_fp8(512, 64).bytes(), 584);  // V4-Flash: 448 + 128 + 7 + 1 pad (spec §6.1)
  EXPECT_EQ(RowCodec::kv_fp8(128, 64).bytes(), 196);  // demo: 64 + 128 + 1 + 3 pad
  EXPECT_EQ(RowCodec::key_fp4(128).bytes(), 68);      // 64 + 4
  EXPECT_EQ(RowCodec::f32(512).bytes(), 2048);
  EXPECT_EQ(RowCodec::kv_fp8(512, 64).words(), 146);
  EXPECT_EQ(RowCodec::key_fp4(128).words(), 17);
  EXPECT_THROW(RowCodec::kv_fp8(512, 32), Error);     // nope 480 is not a multiple of 64
  EXPECT_THROW(RowCodec::kv_fp8(64, 64), Error);      // no nope part
  EXPECT_THROW(RowCodec::key_fp4(100), Error);
}

// Every finite e4m3 code (both zeros included) appears in the nope part; every block at scale 2^k for k at both ends
// of the ue8m0 range that keeps 448 * 2^k finite.
TEST(RowFormat, EveryE4m3CodeAtEveryScaleRoundTrips) {
  const RowCodec c = RowCodec::kv_fp8(512, 64);
  const float* lut = e4m3fn_lut();
  std::vector<uint8_t> codes;
  for (int b = 0; b < 256; ++b)
    if ((b & 0x7F) != 0x7F) codes.push_back(uint8_t(b));
  ASSERT_EQ(codes.size(), 254u);
  for (int k : {-127, -126, -100, -9, -1, 0, 1, 7, 64, 119}) {
    for (size_t shift : {size_t(0), size_t(100), size_t(201)}) {
      std::vector<float> x(512);
      for (int i = 0; i < 448; ++i) x[size_t(i)] = lut[codes[(size_t(i) + shift) % codes.size()]] * std::ldexp(1.0f, k);
      for (int i = 448; i < 512; ++i) x[size_t(i)] = round_to_bf16(float(i - 480) * 0.37f);
      std::vector<float> y;
      std::vector<uint8_t> b;
      EXPECT_TRUE(round_trip(c, x, &y, &b)) << "k " << k << " shift " << shift;
      expect_bitwise(x, y);
      EXPECT_EQ(b[583], 0) << "padding";
      // a block holding +-448 * 2^k takes exactly scale byte k + 127
      for (int blk = 0; blk < 7; ++blk) {
        float amax = 0;
        for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(x[size_t(blk * 64 + i)]));
        if (amax == 448.0f * std::ldexp(1.0f, k)) {
          EXPECT_EQ(int(b[448 + 128 + size_t(blk)]), k + 127);
        }
      }
    }
  }
}

TEST(RowFormat, KvByteLayout) {
  const RowCodec c = RowCodec::kv_fp8(128, 64);  // one 64-column nope block
  std::vector<float> x(128, 0.0f);
  x[0] = 448.0f * 4;   // code 0x7E at scale 2^2
  x[1] = -1.0f;        // 1 / 4 = 0.25: 0x80 | (5 << 3) -> 0xA8
  x[64] = 1.5f;        // rope: bf16 0x3FC0
  x[127] = -0.0f;      // bf16 0x8000
  std::vector<uint8_t> b;
  std::vector<float> y;
  ASSERT_TRUE(round_trip(c, x, &y, &b));
  expect_bitwise(x, y);
  EXPECT_EQ(b[0], 0x7E);
  EXPECT_EQ(b[1], 0xA8);
  EXPECT_EQ(b[2], 0x00);
  EXPECT_EQ(b[64], 0xC0);  // bf16 little-endian
  EXPECT_EQ(b[65], 0x3F);
  EXPECT_EQ(b[64 + 2 * 63], 0x00);
  EXPECT_EQ(b[64 + 2 * 63 + 1], 0x80);
  EXPECT_EQ(b[192], 127 + 2);  // the block's scale byte
  EXPECT_EQ(b[193], 0);        // padding
  EXPECT_EQ(b[194], 0);
  EXPECT_EQ(b[195], 0);
}

TEST(RowFormat, ZerosKeepTheirSign) {
  for (const RowCodec& c : {RowCodec::kv_fp8(512, 64), RowCodec::key_fp4(128)}) {
    std::vector<float> x(size_t(c.dim), 0.0f), y;
    for (size_t i = 0; i < x.size(); i += 3) x[i] = -0.0f;
    EXPECT_TRUE(round_trip(c, x, &y));
    expect_bitwise(x, y);
  }
}

// Every e2m1 nibble in both positions of a byte, every block at scales from 2^-127 to 2^125.
TEST(RowFormat, EveryE2m1NibbleAtEveryScaleRoundTrips) {
  const RowCodec c = RowCodec::key_fp4(128);
  const float* lut = e2m1_lut();
  for (int k : {-127, -126, -60, -1, 0, 1, 60, 124, 125}) {  // 6 * 2^125 is the largest finite
    for (int shift = 0; shift < 16; ++shift) {
      std::vector<float> x(128);
      for (int i = 0; i < 128; ++i) x[size_t(i)] = lut[(i + shift + i / 32) % 16] * std::ldexp(1.0f, k);
      std::vector<float> y;
      std::vector<uint8_t> b;
      EXPECT_TRUE(round_trip(c, x, &y, &b)) << "k " << k;
      expect_bitwise(x, y);
      // element 2j in the low nibble of byte j (when the block's scale is 2^k: it holds a 6)
      for (int blk = 0; blk < 4; ++blk) {
        bool has6 = false;
        for (int i = 0; i < 32; ++i) has6 = has6 || std::fabs(x[size_t(blk * 32 + i)]) == 6.0f * std::ldexp(1.0f, k);
        if (!has6) continue;
        EXPECT_EQ(int(b[64 + size_t(blk)]), k + 127);
        for (int j = 0; j < 16; ++j) {
          const int e = blk * 32 + 2 * j;
          EXPECT_EQ(b[size_t(e / 2)] & 0xF, (e + shift + e / 32) % 16);
          EXPECT_EQ(b[size_t(e / 2)] >> 4, (e + 1 + shift + e / 32) % 16);
        }
      }
    }
  }
}

// Rows of values on a coarser grid than the one the encoder picks (the simulation's own scale may be larger than
// the smallest that fits) still encode exactly.
TEST(RowFormat, AnyPowerOfTwoGridIsExact) {
  std::mt19937 rng(7);
  const RowCodec kv = RowCodec::kv_fp8(512, 64), key = RowCodec::key_fp4(128);
  const float* l8 = e4m3fn_lut();
  const float* l4 = e2m1_lut();
  for (int it = 0; it < 200; ++it) {
    std::uniform_int_distribution<int> code(0, 255), nib(0, 15), ks(-30, 30), small(0, 3);
    std::vector<float> x(512), k4(128), y;
    for (int blk = 0; blk < 7; ++blk) {
      const int k = ks(rng), cap = 1 << small(rng);  // codes of at most ~448 / cap: smaller amax than the grid's
      for (int i = 0; i < 64; ++i) {
        int b;
        do b = code(rng);
        while ((b & 0x7F) == 0x7F || std::fabs(l8[b]) > 448.0f / float(cap));
        x[size_t(blk * 64 + i)] = l8[b] * std::ldexp(1.0f, k);
      }
    }
    for (int i = 448; i < 512; ++i) x[size_t(i)] = round_to_bf16(std::ldexp(float(code(rng) - 128), ks(rng)));
    EXPECT_TRUE(round_trip(kv, x, &y));
    expect_bitwise(x, y);
    for (int blk = 0; blk < 4; ++blk) {
      const int k = ks(rng), cap = small(rng);
      for (int i = 0; i < 32; ++i) {
        int n;
        do n = nib(rng);
        while (std::fabs(l4[n]) > 6.0f / float(1 << cap));
        k4[size_t(blk * 32 + i)] = l4[n] * std::ldexp(1.0f, k);
      }
    }
    EXPECT_TRUE(round_trip(key, k4, &y));
    expect_bitwise(k4, y);
  }
}

TEST(RowFormat, UnrepresentableValuesAreReported) {
  const RowCodec kv = RowCodec::kv_fp8(512, 64), key = RowCodec::key_fp4(128);
  std::vector<float> x(512, 1.0f);
  EXPECT_TRUE(round_trip(kv, x));
  x[5] = 1.0f + std::ldexp(1.0f, -10);  // 4 significant bits of e4m3 cannot hold it
  EXPECT_FALSE(round_trip(kv, x));
  x[5] = 1.0f;
  x[500] = 1.0f + std::ldexp(1.0f, -10);  // rope part: not bf16
  EXPECT_FALSE(round_trip(kv, x));
  x[500] = 1.0f;
  x[7] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(round_trip(kv, x));
  x[7] = 448.0f;
  x[8] = 1.0f / 8;  // 448 and 2^-3 in one block: scale 1, 0.125 is a code (2^-3 = 1.000 * 2^-3): exact
  EXPECT_TRUE(round_trip(kv, x));
  x[8] = std::ldexp(1.0f, -10);  // below the subnormal step 2^-9 at scale 1
  EXPECT_FALSE(round_trip(kv, x));

  std::vector<float> k(128, 0.5f);
  EXPECT_TRUE(round_trip(key, k));
  k[3] = 0.75f;  // 0.5 * 1.5 fine at scale 2^-1 -> codes 1 and 1.5
  EXPECT_TRUE(round_trip(key, k));
  k[4] = 6.0f;   // scale 1 now: 0.75 is not an e2m1 value
  EXPECT_FALSE(round_trip(key, k));
  k[4] = 2.5f;   // smallest scale 2^-1: 2.5 / 0.5 = 5 is no e2m1 value
  k[3] = 0.5f;
  EXPECT_FALSE(round_trip(key, k));
}

}  // namespace
}  // namespace dsv4
