// The element generators of Backend::fill_random (dummy weights), shared by the CPU and CUDA backends: a counter-
// based hash of (seed, index), then one code of the requested format. Host and device (__host__ __device__ when
// compiled by nvcc).
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DSV4_HD __host__ __device__ __forceinline__
#else
#define DSV4_HD inline
#endif

namespace dsv4 {

DSV4_HD uint64_t random_bits(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + (i + 1) * 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// e4m3 code with exponent field 4..7 (magnitude in [1/8, 2)), random sign and mantissa (never NaN).
DSV4_HD uint8_t random_e4m3(uint64_t r) { return uint8_t((r & 0x80) | ((4 + ((r >> 8) & 3)) << 3) | ((r >> 16) & 7)); }
// E8M0 byte 127 + e (+-1), e = round(param).
DSV4_HD uint8_t random_e8m0(uint64_t r, float param) {
  const int e = int(param < 0 ? param - 0.5f : param + 0.5f) + int(r % 3) - 1;
  const int b = 127 + e;
  return uint8_t(b < 1 ? 1 : b > 254 ? 254 : b);
}
// bf16 bits of a value uniform in [-param, param] (truncated to bf16).
DSV4_HD uint16_t random_bf16(uint64_t r, float param) {
  const float u = float(r >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
  const float v = u * param;
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return uint16_t(b >> 16);
}

}  // namespace dsv4
