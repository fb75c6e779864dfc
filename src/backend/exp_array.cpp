// exp_array: std::exp per element, 8 lanes at a time where provably bitwise equal (see exp_array.h).
#include "backend/exp_array.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu_features.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DSV4_EXP_X86 1
#endif

namespace dsv4 {
namespace {

void exp_scalar(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

#ifdef DSV4_EXP_X86
// The constants of glibc's expf (sysdeps/ieee754/flt-32, from Arm's optimized-routines): with N = 32,
// exp(x) = 2^(k/N) * 2^(r/N), k = round(x * N / ln 2), 2^(k/N) from the table of 2^(i/N) (k = 32 m + i: m added to
// the exponent field), 2^(r/N) ~= 1 + C2 r + C1 r^2 + C0 r^3.
constexpr double kPow2[32] = {  // 2^(i/32), i < 32
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0,
};
constexpr double kInvLn2N = 0x1.71547652b82fep+5;  // N / ln 2
constexpr double kShift = 0x1.8p+52;               // x + kShift rounds x to an integer (in the low mantissa bits)
constexpr double kC0 = 0x1.c6af84b912394p-20, kC1 = 0x1.ebfce50fac4f3p-13, kC2 = 0x1.62e42ff0c52d6p-6;

// Table words: bits(2^(i/32)) - (i << 47), so that word[k % 32] + (k << 47) (64-bit wrap) is bits(2^(k/32)).
struct TableWords {
  alignas(64) int64_t w[32];
  constexpr TableWords() : w{} {
    for (int i = 0; i < 32; ++i) w[i] = int64_t(std::bit_cast<uint64_t>(kPow2[i]) - (uint64_t(i) << 47));
  }
};
constexpr TableWords kTab{};

// Four lanes of __expf_fma's main path (|x| < 88), each operation as glibc's: kds = fma(InvLn2N, x, Shift) (the
// rounded k in its low bits), kd = kds - Shift, r = fma(InvLn2N, x, -kd), s = 2^(k/32) from the table,
// z = fma(C0, r, C1), y = fma(C2, r, 1), y = fma(z, r*r, y), y * s rounded to float.
__attribute__((target("avx2,fma"))) inline __m128 exp4_main(__m128 x) {
  const __m256d invln2n = _mm256_set1_pd(kInvLn2N), shift = _mm256_set1_pd(kShift);
  const __m256d xd = _mm256_cvtps_pd(x);
  const __m256d kds = _mm256_fmadd_pd(invln2n, xd, shift);
  const __m256i ki = _mm256_castpd_si256(kds);
  const __m256d kd = _mm256_sub_pd(kds, shift);
  const __m256d r = _mm256_fmsub_pd(invln2n, xd, kd);
  const __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
  __m256i t = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kTab.w), idx, 8);
  t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
  const __m256d s = _mm256_castsi256_pd(t);
  const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(kC0), r, _mm256_set1_pd(kC1));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(kC2), r, _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(z, r2, y);
  y = _mm256_mul_pd(y, s);
  return _mm256_cvtpd_ps(y);
}

// Lanes outside the main path: top 12 bits of |x| >= those of 88.0f (|x| >= 88, inf, NaN): std::exp itself.
inline bool exp_special(float x) { return ((std::bit_cast<uint32_t>(x) >> 20) & 0x7FFu) >= 0x42Bu; }

__attribute__((target("avx2,fma"))) void exp_avx2(const float* x, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(xv), 20), _mm256_set1_epi32(0x7FF));
    const __m256i special = _mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42A));
    const __m128 lo = exp4_main(_mm256_castps256_ps128(xv)), hi = exp4_main(_mm256_extractf128_ps(xv, 1));
    _mm256_storeu_ps(y + i, _mm256_set_m128(hi, lo));
    if (!_mm256_testz_si256(special, special)) {
      alignas(32) float xs[8];
      _mm256_store_ps(xs, xv);  // (y may be x: the inputs from the register)
      for (int l = 0; l < 8; ++l)
        if (exp_special(xs[l])) y[i + l] = std::exp(xs[l]);
    }
  }
  exp_scalar(x + i, n - i, y + i);
}

// The vector path against std::exp: a dense sweep of [-104, 89] (where exp is neither 0 nor inf), random bit
// patterns, special values, and inputs on which __expf_fma's result is not the correctly rounded one (a C library
// with another expf, e.g. a correctly rounded one, differs there).
bool exp_avx2_agrees() {
  std::vector<float> x;
  for (int k = 0; k <= 1 << 17; ++k) x.push_back(-104.0f + 193.0f * float(k) / float(1 << 17));
  std::mt19937 rng(20261207);
  for (int k = 0; k < 1 << 16; ++k) x.push_back(std::bit_cast<float>(uint32_t(rng())));
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 88.0f, -88.0f, 0x1.62e42ep6f,
                  0x1.62e430p6f, -0x1.9fe368p6f, -0x1.9fe36ap6f, -0x1.9d1d9ep6f, 0x1p-149f, -0x1p-149f, 0x1p-126f,
                  0x1.3c12fp-1f, 0x1.a1c432p-1f, 0x1.11450ep+0f, 0x1.60eb62p+0f, 0x1.d061d8p+0f, 0x1.2ff8e6p+1f,
                  0x1.8e62fep+1f, 0x1.4efcd6p+2f})
    x.push_back(v);
  std::vector<float> y(x.size());
  exp_avx2(x.data(), int64_t(x.size()), y.data());
  for (size_t i = 0; i < x.size(); ++i)
    if (std::bit_cast<uint32_t>(y[i]) != std::bit_cast<uint32_t>(std::exp(x[i]))) return false;
  return true;
}
#endif

}  // namespace

bool exp_array_vectorized() {
#ifdef DSV4_EXP_X86
  static const bool on = cpu_features().avx2 && cpu_features().fma && exp_avx2_agrees();
  return on;
#else
  return false;
#endif
}

void exp_array(const float* x, int64_t n, float* y) {
#ifdef DSV4_EXP_X86
  if (exp_array_vectorized()) return exp_avx2(x, n, y);
#endif
  exp_scalar(x, n, y);
}

}  // namespace dsv4
