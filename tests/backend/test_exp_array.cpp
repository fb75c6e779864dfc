// exp_array (backend/exp_array.h): bitwise std::exp on every input, in place or not, any length.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu_features.h"
#include "backend/exp_array.h"

namespace dsv4 {
namespace {

TEST(ExpArray, BitwiseStdExpOverAStrideOfAllFloats) {
  // every 61st bit pattern (70M inputs: all exponents, both signs, NaN payloads, subnormals), 8 lanes at a time
  // plus tails; the whole 2^32 range was checked once when the vector path was written
  constexpr int64_t kChunk = 1 << 16, kStride = 61;
  std::vector<float> x(kChunk), y(kChunk);
  int64_t bad = 0;
  for (uint64_t u0 = 0; u0 < (uint64_t(1) << 32); u0 += uint64_t(kChunk) * kStride) {
    int64_t n = 0;
    for (uint64_t u = u0; u < (uint64_t(1) << 32) && n < kChunk; u += kStride) x[size_t(n++)] = std::bit_cast<float>(uint32_t(u));
    exp_array(x.data(), n, y.data());
    for (int64_t i = 0; i < n; ++i)
      if (std::bit_cast<uint32_t>(y[size_t(i)]) != std::bit_cast<uint32_t>(std::exp(x[size_t(i)])) && ++bad <= 5)
        ADD_FAILURE() << std::hexfloat << x[size_t(i)] << ": " << y[size_t(i)] << " vs " << std::exp(x[size_t(i)]);
  }
  EXPECT_EQ(bad, 0);
#if defined(__x86_64__) && defined(__GLIBC__)
  // glibc on an AVX2 + FMA CPU: the self-check must have accepted the vector path (else it silently runs scalar)
  if (cpu_features().avx2 && cpu_features().fma) {
    EXPECT_TRUE(exp_array_vectorized());
  }
#endif
}

TEST(ExpArray, InPlaceAndEveryTailLength) {
  for (int64_t n = 0; n <= 19; ++n) {
    std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = -3.7f + 0.61f * float(i) + (i == 5 ? 100.0f : 0.0f);  // one inf
    std::vector<float> in = x;
    exp_array(x.data(), n, y.data());
    exp_array(x.data(), n, x.data());
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(y[size_t(i)]), std::bit_cast<uint32_t>(std::exp(in[size_t(i)]))) << n << " " << i;
      EXPECT_EQ(std::bit_cast<uint32_t>(x[size_t(i)]), std::bit_cast<uint32_t>(y[size_t(i)])) << n << " " << i;
    }
  }
}

}  // namespace
}  // namespace dsv4
