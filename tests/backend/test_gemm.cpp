// GEMM exactness: every kernel (scalar / AVX2 / AVX-512) and thread count must reproduce, bit for bit, a slow scalar
// formula written from spec §3.6 / §4.3 / §4.5 (and the summation order documented in backend/gemm.h).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/act_quant.h"
#include "backend/cpu_backend.h"
#include "backend/cpu_features.h"
#include "backend/cpu_ops.h"
#include "backend/gemm.h"
#include "backend/gemm_kernels.h"
#include "core/error.h"
#include "format/numeric.h"

namespace dsv4 {
namespace {

// ---- test weights in the official storage formats ----------------------------------------------------------------
struct TestWeight {
  GemmFormat fmt;
  int64_t rows, cols, br = 128, bc = 128;
  bool scale_f32 = false;
  std::vector<uint8_t> w, scale;
  GemmWeight view() const {
    GemmWeight g;
    g.fmt = fmt;
    g.w = w.data();
    g.scale = scale.empty() ? nullptr : scale.data();
    g.scale_f32 = scale_f32;
    g.rows = rows;
    g.cols = cols;
    g.block_rows = br;
    g.block_cols = bc;
    return g;
  }
  // Exact dequantized value (spec §3.6), from format/numeric.h decoders.
  float code(int64_t r, int64_t c) const {
    switch (fmt) {
      case GemmFormat::fp8:
        return e4m3fn_to_float(w[r * cols + c]);
      case GemmFormat::fp4: {
        const uint8_t b = w[r * (cols / 2) + c / 2];
        return e2m1_to_float(c % 2 == 0 ? (b & 0xF) : (b >> 4));
      }
      case GemmFormat::bf16: {
        uint16_t h;
        std::memcpy(&h, &w[2 * (r * cols + c)], 2);
        return bf16_to_float(h);
      }
      case GemmFormat::f32: {
        float f;
        std::memcpy(&f, &w[4 * (r * cols + c)], 4);
        return f;
      }
    }
    return 0;
  }
  float wscale(int64_t r, int64_t c) const {
    if (fmt == GemmFormat::fp4) return e8m0_to_float(scale[r * ((cols + 31) / 32) + c / 32]);
    const int64_t i = (r / br) * ((cols + bc - 1) / bc) + c / bc;
    if (scale_f32) {
      float f;
      std::memcpy(&f, &scale[4 * i], 4);
      return f;
    }
    return e8m0_to_float(scale[i]);
  }
  float dequant(int64_t r, int64_t c) const {
    return (fmt == GemmFormat::fp8 || fmt == GemmFormat::fp4) ? code(r, c) * wscale(r, c) : code(r, c);
  }
};

TestWeight make_weight(GemmFormat fmt, int64_t rows, int64_t cols, std::mt19937& rng, bool scale_f32 = false,
                       int64_t br = 128) {
  TestWeight t;
  t.fmt = fmt;
  t.rows = rows;
  t.cols = cols;
  t.br = br;
  t.scale_f32 = scale_f32;
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  switch (fmt) {
    case GemmFormat::fp8: {
      t.w.resize(rows * cols);
      for (auto& b : t.w) {
        do b = static_cast<uint8_t>(byte(rng));
        while ((b & 0x7F) == 0x7F);  // no NaN codes
      }
      const int64_t n = ((rows + br - 1) / br) * ((cols + 127) / 128);
      if (scale_f32) {
        t.scale.resize(4 * n);
        std::uniform_real_distribution<float> u(1e-4f, 3e-3f);
        for (int64_t i = 0; i < n; ++i) {
          const float f = u(rng);
          std::memcpy(&t.scale[4 * i], &f, 4);
        }
      } else {
        t.scale.resize(n);
        for (auto& s : t.scale) s = static_cast<uint8_t>(112 + byte(rng) % 12);
      }
      break;
    }
    case GemmFormat::fp4: {
      t.br = 1;
      t.bc = 32;
      t.w.resize(rows * cols / 2);
      for (auto& b : t.w) b = static_cast<uint8_t>(byte(rng));
      t.scale.resize(rows * ((cols + 31) / 32));
      for (auto& s : t.scale) s = static_cast<uint8_t>(115 + byte(rng) % 10);
      break;
    }
    case GemmFormat::bf16: {
      t.w.resize(2 * rows * cols);
      for (int64_t i = 0; i < rows * cols; ++i) {
        const uint16_t h = float_to_bf16_rne(nd(rng));
        std::memcpy(&t.w[2 * i], &h, 2);
      }
      break;
    }
    case GemmFormat::f32: {
      t.w.resize(4 * rows * cols);
      for (int64_t i = 0; i < rows * cols; ++i) {
        const float f = nd(rng);
        std::memcpy(&t.w[4 * i], &f, 4);
      }
      break;
    }
  }
  return t;
}

std::vector<float> make_x(int64_t n, std::mt19937& rng, bool bf16) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-6.0f, 3.0f);
  std::vector<float> x(n);
  for (auto& v : x) {
    v = nd(rng) * std::exp2(mag(rng));
    if (bf16) v = round_to_bf16(v);
  }
  if (n > 3) x[n / 3] = 0.0f;
  return x;
}

// ---- the slow formula, written from the spec --------------------------------------------------------------------
// §4.3: s = 2^ceil(log2(max(amax,1e-4) * fp32(1/448))), q = e4m3_rne_satfinite(clamp(x/s, ±448)).
void slow_act_quant(const float* x, int64_t n, std::vector<float>& q, std::vector<float>& s) {
  q.assign(n, 0.0f);
  s.assign((n + 127) / 128, 0.0f);
  for (int64_t b = 0; b * 128 < n; ++b) {
    const int64_t e = std::min<int64_t>(n, b * 128 + 128);
    float amax = 0;
    for (int64_t i = b * 128; i < e; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float t = std::max(amax, 1e-4f) * (1.0f / 448.0f);
    int ex;
    const float m = std::frexp(t, &ex);  // t = m 2^ex, m in [0.5, 1): ceil(log2 t) = ex-1 if m == 0.5 else ex
    const float sc = std::ldexp(1.0f, m == 0.5f ? ex - 1 : ex);
    s[b] = sc;
    for (int64_t i = b * 128; i < e; ++i)
      q[i] = e4m3fn_to_float(float_to_e4m3fn_rne_satfinite(std::clamp(x[i] / sc, -448.0f, 448.0f)));
  }
}

std::vector<float> slow_linear(const TestWeight& W, const std::vector<float>& x, int64_t n_tok, const LinearOpts& o) {
  const int64_t K = W.cols, r0 = o.row_begin, r1 = o.row_end < 0 ? W.rows : o.row_end;
  std::vector<float> y(n_tok * (r1 - r0));
  std::vector<float> q, s;
  for (int64_t m = 0; m < n_tok; ++m) {
    if (o.act_quant_fp8) slow_act_quant(&x[m * K], K, q, s);
    for (int64_t n = r0; n < r1; ++n) {
      float acc = 0.0f;
      if (o.act_quant_fp8) {
        const int64_t bk = W.fmt == GemmFormat::fp4 ? 32 : 128;
        for (int64_t kb = 0; kb < K; kb += bk) {
          float part = 0.0f;
          for (int64_t k = kb; k < std::min(K, kb + bk); ++k) part = std::fma(q[k], W.code(n, k), part);
          const float sc = s[kb / 128] * W.wscale(n, kb);
          acc = acc + part * sc;
        }
      } else {
        for (int64_t k = 0; k < K; ++k) {
          const float wd = o.weight_as_bf16 ? round_to_bf16(W.dequant(n, k)) : W.dequant(n, k);
          acc = std::fma(x[m * K + k], wd, acc);
        }
      }
      y[m * (r1 - r0) + (n - r0)] = o.out_bf16 ? round_to_bf16(acc) : acc;
    }
  }
  return y;
}

std::vector<SimdLevel> levels() {
  std::vector<SimdLevel> v{SimdLevel::scalar};
  if (static_cast<int>(best_simd_level()) >= static_cast<int>(SimdLevel::avx2)) v.push_back(SimdLevel::avx2);
  if (static_cast<int>(best_simd_level()) >= static_cast<int>(SimdLevel::avx512)) v.push_back(SimdLevel::avx512);
  if (best_simd_level() == SimdLevel::avx512vbmi) v.push_back(SimdLevel::avx512vbmi);
  return v;
}

struct LevelGuard {
  ~LevelGuard() {
    set_simd_level(best_simd_level());
    omp_set_num_threads(omp_get_num_procs());
  }
};

void expect_bitwise(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&want[i], &got[i], 4) != 0) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  EXPECT_EQ(bad, 0) << what << ": first mismatch at " << first << " want " << (first >= 0 ? want[first] : 0) << " got "
                    << (first >= 0 ? got[first] : 0);
}

struct Case {
  GemmFormat fmt;
  int64_t rows, cols, n_tok;
  LinearOpts opts;
  bool scale_f32 = false;
  int64_t br = 128;
};

std::string fmt_name(GemmFormat f) {
  switch (f) {
    case GemmFormat::fp8:
      return "fp8";
    case GemmFormat::fp4:
      return "fp4";
    case GemmFormat::bf16:
      return "bf16";
    case GemmFormat::f32:
      return "f32";
  }
  return "?";
}

void run_case_on(const Case& c, const TestWeight& W, std::mt19937& rng) {
  LevelGuard guard;
  const std::vector<float> x = make_x(c.n_tok * c.cols, rng, c.opts.act_quant_fp8 || c.opts.weight_as_bf16);
  const std::vector<float> want = slow_linear(W, x, c.n_tok, c.opts);
  const int64_t nout = (c.opts.row_end < 0 ? c.rows : c.opts.row_end) - c.opts.row_begin;
  for (SimdLevel l : levels()) {
    ASSERT_EQ(set_simd_level(l), l);
    for (int th : {1, 2, 3}) {
      omp_set_num_threads(th);
      std::vector<float> y(c.n_tok * nout, -1.0f);
      linear(W.view(), x.data(), c.n_tok, y.data(), c.opts);
      expect_bitwise(want, y,
                     fmt::format("{} [{}x{}] n_tok={} q={} bf16out={} wbf16={} rows[{},{}) level={} threads={}",
                                 fmt_name(c.fmt), c.rows, c.cols, c.n_tok, c.opts.act_quant_fp8, c.opts.out_bf16,
                                 c.opts.weight_as_bf16, c.opts.row_begin, c.opts.row_end, simd_level_name(l), th));
    }
  }
}

void run_case(const Case& c, std::mt19937& rng) {
  const TestWeight W = make_weight(c.fmt, c.rows, c.cols, rng, c.scale_f32, c.br);
  run_case_on(c, W, rng);
}

LinearOpts Q(bool bf16_out = true) {
  LinearOpts o;
  o.act_quant_fp8 = true;
  o.out_bf16 = bf16_out;
  return o;
}
LinearOpts D(bool bf16_out = false, bool wbf16 = false, int64_t rb = 0, int64_t re = -1) {
  LinearOpts o;
  o.out_bf16 = bf16_out;
  o.weight_as_bf16 = wbf16;
  o.row_begin = rb;
  o.row_end = re;
  return o;
}

TEST(Gemm, Fp8QuantizedMatchesSpecFormula) {
  std::mt19937 rng(1);
  for (const Case& c :
       {Case{GemmFormat::fp8, 64, 256, 1, Q()}, Case{GemmFormat::fp8, 130, 300, 3, Q()},
        Case{GemmFormat::fp8, 17, 1100, 7, Q(false)}, Case{GemmFormat::fp8, 256, 128, 13, Q()},
        Case{GemmFormat::fp8, 70, 200, 2, Q(), true}, Case{GemmFormat::fp8, 90, 640, 5, Q(), false, 64}})
    run_case(c, rng);
}

TEST(Gemm, Fp4QuantizedMatchesSpecFormula) {
  std::mt19937 rng(2);
  for (const Case& c : {Case{GemmFormat::fp4, 64, 256, 1, Q()}, Case{GemmFormat::fp4, 33, 1090, 4, Q()},
                        Case{GemmFormat::fp4, 200, 96, 9, Q(false)}, Case{GemmFormat::fp4, 16, 650, 1, Q()},
                        Case{GemmFormat::fp4, 64, 128, 300, Q()}})
    run_case(c, rng);
}

TEST(Gemm, DenseMatchesSpecFormula) {
  std::mt19937 rng(3);
  for (const Case& c : {Case{GemmFormat::fp8, 100, 300, 3, D()}, Case{GemmFormat::fp8, 64, 1030, 1, D(true)},
                        Case{GemmFormat::fp8, 70, 256, 2, D(false), true}, Case{GemmFormat::fp4, 48, 544, 5, D()},
                        Case{GemmFormat::bf16, 129, 77, 6, D()}, Case{GemmFormat::bf16, 64, 1024, 1, D(true)},
                        Case{GemmFormat::f32, 31, 515, 4, D()}, Case{GemmFormat::f32, 5, 3, 2, D()}})
    run_case(c, rng);
}

TEST(Gemm, WeightAsBf16AndRowRange) {
  std::mt19937 rng(4);
  for (const Case& c : {Case{GemmFormat::fp8, 256, 384, 3, D(true, true, 128, 256)},
                        Case{GemmFormat::fp8, 200, 256, 1, D(true, true, 0, 100)},
                        Case{GemmFormat::fp8, 200, 256, 2, D(false, false, 37, 171)},
                        Case{GemmFormat::fp4, 96, 128, 2, D(false, false, 50, 51)}})
    run_case(c, rng);
  Case c{GemmFormat::fp8, 256, 384, 4, Q()};
  c.opts.row_begin = 100;
  c.opts.row_end = 230;
  run_case(c, rng);
}

TEST(Gemm, DecodeShapes) {
  // One token against full 64-row groups: the fused GEMV kernels (FP4/FP8 quantized, BF16 dense), incl. FP8 scale
  // grids whose row blocks do not align with 16-row panels.
  std::mt19937 rng(7);
  for (const Case& c :
       {Case{GemmFormat::fp4, 128, 1024, 1, Q()}, Case{GemmFormat::fp8, 192, 512, 1, Q(), true, 8},
        Case{GemmFormat::fp8, 128, 384, 1, Q(), false, 24}, Case{GemmFormat::bf16, 128, 512, 1, D()},
        Case{GemmFormat::fp8, 256, 256, 1, D(true, true)}, Case{GemmFormat::fp4, 64, 512, 1, D()},
        Case{GemmFormat::fp8, 128, 512, 1, D(false, false), true, 64},
        Case{GemmFormat::fp4, 128, 256, 1, D(false, true)}, Case{GemmFormat::bf16, 64, 96, 1, D(true, true)},
        // short rows (prefetched one group ahead, past the weight's end for the last groups), a partial last group
        Case{GemmFormat::bf16, 1000, 96, 1, D()}, Case{GemmFormat::fp4, 640, 128, 1, Q()},
        Case{GemmFormat::fp8, 576, 128, 1, Q()}})
    run_case(c, rng);
}

TEST(Gemm, DecodeEdgeShapes) {
  // One token against partial groups (fewer than 64 rows: a small weight, the last group, a row range) and K that is
  // not a multiple of a k-step (FP4 128, FP8 64, BF16 32 columns) but of a 32-bit word's codes: the AVX-512 fused
  // GEMVs load only the rows and bytes that exist and stop their chains at K (the demo model's decode shapes).
  std::mt19937 rng(13);
  for (const Case& c :
       {Case{GemmFormat::fp4, 160, 96, 1, Q()}, Case{GemmFormat::fp4, 96, 160, 1, Q()},
        Case{GemmFormat::fp4, 40, 200, 1, Q(false)}, Case{GemmFormat::fp4, 70, 2120, 1, Q()},
        Case{GemmFormat::fp4, 40, 200, 1, D()}, Case{GemmFormat::fp4, 70, 264, 1, D(true, true)},
        Case{GemmFormat::fp8, 160, 96, 1, Q()}, Case{GemmFormat::fp8, 8, 96, 1, Q()},
        Case{GemmFormat::fp8, 100, 300, 1, Q(false)}, Case{GemmFormat::fp8, 130, 1100, 1, Q(), false, 24},
        Case{GemmFormat::fp8, 48, 256, 1, D(true, true)}, Case{GemmFormat::fp8, 90, 196, 1, D(false, false), true},
        Case{GemmFormat::fp8, 200, 256, 1, D(true, true, 37, 171)}, Case{GemmFormat::fp4, 200, 96, 1, D(false, false, 3, 45)},
        Case{GemmFormat::bf16, 8, 96, 1, D()}, Case{GemmFormat::bf16, 129, 98, 1, D(true)},
        Case{GemmFormat::bf16, 300, 34, 1, D(false, false, 10, 290)}})
    run_case(c, rng);
  // no activation past K is read: dense products of a token followed by NaNs (a zero-padded weight word times a NaN
  // would give NaN)
  LevelGuard guard;
  for (const Case& c : {Case{GemmFormat::fp4, 40, 200, 1, D()}, Case{GemmFormat::fp8, 90, 196, 1, D()},
                        Case{GemmFormat::bf16, 129, 98, 1, D()}}) {
    const TestWeight W = make_weight(c.fmt, c.rows, c.cols, rng);
    std::vector<float> x = make_x(c.cols, rng, false);
    const std::vector<float> want = slow_linear(W, x, 1, c.opts);
    x.resize(static_cast<size_t>(c.cols + 256), std::numeric_limits<float>::quiet_NaN());
    for (SimdLevel l : levels()) {
      ASSERT_EQ(set_simd_level(l), l);
      std::vector<float> y(static_cast<size_t>(c.rows), -1.0f);
      linear(W.view(), x.data(), 1, y.data(), c.opts);
      expect_bitwise(want, y, fmt::format("{} [{}x{}] NaN past K, level={}", fmt_name(c.fmt), c.rows, c.cols,
                                          simd_level_name(l)));
    }
  }
}

TEST(Gemm, Fp8SubnormalCodeMixes) {
  // E4M3 subnormal codes (exponent field 0: +-m * 2^-9) take a separate exact decode in the SIMD kernels (no fp32
  // subnormal intermediates), chosen per 64-code word: weights without any, with a few (most words on the plain path,
  // some on the exact one), and with nothing but subnormal codes and +-0, for the fused GEMV (1 token, full groups),
  // the panel path (several tokens, a partial group) and every mode.
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> byte(0, 255);
  auto normal_code = [&] {
    uint8_t b;
    do b = static_cast<uint8_t>(byte(rng));
    while ((b & 0x78) == 0 || (b & 0x7F) == 0x7F);
    return b;
  };
  auto sub_code = [&] { return static_cast<uint8_t>(byte(rng) & 0x87); };  // e = 0 (incl. +-0)
  for (int mix = 0; mix < 3; ++mix) {
    for (const Case& c : {Case{GemmFormat::fp8, 128, 512, 1, Q()}, Case{GemmFormat::fp8, 100, 384, 3, Q(false)},
                          Case{GemmFormat::fp8, 64, 256, 1, D()}, Case{GemmFormat::fp8, 128, 256, 1, D(true, true)},
                          Case{GemmFormat::fp8, 80, 640, 5, D(false, true)}}) {
      TestWeight W = make_weight(c.fmt, c.rows, c.cols, rng, c.scale_f32, c.br);
      int64_t n_sub = 0;
      for (auto& b : W.w) {
        const bool sub = mix == 2 ? byte(rng) < 240 : mix == 1 && byte(rng) == 0 && byte(rng) < 64;
        b = sub ? sub_code() : normal_code();
        n_sub += (b & 0x78) == 0 && (b & 0x07) != 0;
      }
      if (mix > 0) {
        ASSERT_GT(n_sub, 0) << mix;
      }
      SCOPED_TRACE(fmt::format("mix {} ({} subnormal codes of {})", mix, n_sub, W.w.size()));
      run_case_on(c, W, rng);
    }
  }
}

TEST(Gemm, Fp8EveryCodeInEveryWordPosition) {
  // Every E4M3 code but the NaNs (the VBMI kernels decode them through 128-entry byte tables, the others by shifts /
  // the f16 route) at each of the 4 byte positions of a 32-bit word and in every row of a panel, in the quantized
  // GEMVs of 1 token and of 2-8 tokens (each decode path has its own tables or shifts per position).
  std::mt19937 rng(17);
  for (const Case& c : {Case{GemmFormat::fp8, 64, 1024, 1, Q()}, Case{GemmFormat::fp8, 64, 1024, 2, Q()},
                        Case{GemmFormat::fp8, 128, 512, 5, Q(false)}, Case{GemmFormat::fp8, 64, 1024, 8, Q()}}) {
    TestWeight W = make_weight(c.fmt, c.rows, c.cols, rng);
    std::vector<int> seen(256 * 4, 0);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t k = 0; k < c.cols; ++k) {
        uint8_t b = static_cast<uint8_t>((r * 37 + k * 5 + (k / 256) * 3) & 0xFF);
        if ((b & 0x7F) == 0x7F) b ^= 1;
        W.w[r * c.cols + k] = b;
        seen[b * 4 + k % 4] = 1;
      }
    int64_t n = 0;
    for (int v : seen) n += v;
    ASSERT_EQ(n, 254 * 4);
    run_case_on(c, W, rng);
  }
}

TEST(Gemm, Fp4ScaleSpansAndSpecialScales) {
  // The fused FP4 GEMVs read the E8M0 scales 2048 columns (64 blocks) at a time per 16-row panel: K of one span, of
  // more than one, and with a partial last span (masked scale loads); scale bytes 0 (2^-127, a subnormal) and 255
  // (NaN) take a separate decode, chosen per span. Also long rows with a partial last group (the next-group prefetch
  // stops at the weight's end), and 2-8 tokens with a partial last k-step after a span (K = 2048 + 96: the
  // multi-token GEMV's masked last step reads blocks 64..66 from the second span's scale words).
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int special = 0; special < 2; ++special) {
    for (const Case& c : {Case{GemmFormat::fp4, 64, 2048, 1, Q()}, Case{GemmFormat::fp4, 128, 2176, 1, Q()},
                          Case{GemmFormat::fp4, 64, 4224, 1, Q(false)}, Case{GemmFormat::fp4, 64, 2176, 1, D()},
                          Case{GemmFormat::fp4, 128, 2176, 3, Q()}, Case{GemmFormat::fp4, 130, 2048, 1, Q()},
                          Case{GemmFormat::fp4, 128, 2144, 5, Q()}, Case{GemmFormat::fp4, 64, 2144, 2, Q(false)}}) {
      TestWeight W = make_weight(c.fmt, c.rows, c.cols, rng, c.scale_f32, c.br);
      if (special == 1)
        for (auto& s : W.scale) {
          const int r = byte(rng);
          s = r < 8 ? 0 : r < 12 ? 255 : r < 16 ? 1 : s;
        }
      SCOPED_TRACE(fmt::format("special scale bytes: {}", special));
      run_case_on(c, W, rng);
    }
  }
  // Fp8 long rows, partial last group
  run_case(Case{GemmFormat::fp8, 130, 2048, 1, Q()}, rng);
}

TEST(Gemm, SmallBatchShapes) {
  // 2-8 tokens against full 64-row groups: the fused multi-token GEMV (AVX-512, BF16 dense: the lm head and the
  // compressor projections of a batch of decodes), plus partial groups and K not a multiple of 32 (panel path).
  std::mt19937 rng(8);
  for (int64_t n : {2, 3, 4, 5, 7, 8, 9})
    for (const Case& c : {Case{GemmFormat::bf16, 192, 96, n, D()}, Case{GemmFormat::bf16, 128, 512, n, D(true)},
                          Case{GemmFormat::bf16, 100, 64, n, D()}, Case{GemmFormat::bf16, 64, 80, n, D(true, true)}})
      run_case(c, rng);
}

TEST(Gemm, SmallBatchQuantizedShapes) {
  // 2-8 tokens, reference (Q) numerics: the fused multi-token FP4 / FP8 GEMV (AVX-512) on full groups — FP8 with
  // row blocks of 128 / 24 (scales per row inside a panel) and F32 scales — and the panel path for a partial group.
  std::mt19937 rng(10);
  for (int64_t n : {2, 3, 5, 8})
    for (const Case& c : {Case{GemmFormat::fp4, 128, 512, n, Q()}, Case{GemmFormat::fp4, 100, 256, n, Q(false)},
                          Case{GemmFormat::fp8, 192, 384, n, Q(false)}, Case{GemmFormat::fp8, 128, 256, n, Q(), false, 24},
                          Case{GemmFormat::fp8, 64, 512, n, Q(), true}, Case{GemmFormat::fp8, 64, 256, n, D()}})
      run_case(c, rng);
}

// A BF16 weight with its panel copy (WeightView::panels; the CPU backend's lm head): the copy holds the documented
// words, linear() stays the spec formula bit for bit (every level and thread count, 1-9 tokens, full and partial
// groups, row ranges on and off panel boundaries, bf16 outputs), and the AVX-512 decode GEMVs really read the copy.
TEST(Gemm, Bf16PanelCopy) {
  std::mt19937 rng(12);
  {  // layout: lane j of word c of panel p = W[16p + j, 2c] | W[16p + j, 2c + 1] << 16, rows past the end 0
    const TestWeight W = make_weight(GemmFormat::bf16, 37, 64, rng);
    ASSERT_EQ(bf16_panel_words(W.view()), 3 * 32 * 16);
    std::vector<uint32_t> pan(size_t(bf16_panel_words(W.view())), 0xDEADBEEFu);
    pack_bf16_panels(W.view(), pan.data());
    for (int64_t p = 0; p < 3; ++p)
      for (int64_t c = 0; c < 32; ++c)
        for (int64_t j = 0; j < 16; ++j) {
          const int64_t r = 16 * p + j;
          uint16_t lo = 0, hi = 0;
          if (r < W.rows) {
            std::memcpy(&lo, &W.w[2 * (r * 64 + 2 * c)], 2);
            std::memcpy(&hi, &W.w[2 * (r * 64 + 2 * c + 1)], 2);
          }
          ASSERT_EQ(pan[size_t((p * 32 + c) * 16 + j)], uint32_t(lo) | uint32_t(hi) << 16) << p << " " << c << " " << j;
        }
  }
  // no copy for other formats or K % 32 != 0; packing them is an error
  EXPECT_EQ(bf16_panel_words(make_weight(GemmFormat::bf16, 64, 80, rng).view()), 0);
  EXPECT_EQ(bf16_panel_words(make_weight(GemmFormat::fp8, 64, 128, rng).view()), 0);
  std::vector<uint32_t> none(16);
  EXPECT_THROW(pack_bf16_panels(make_weight(GemmFormat::fp8, 64, 128, rng).view(), none.data()), Error);

  struct Shape {
    int64_t rows, cols;
    LinearOpts o;
  };
  for (const Shape& sh : {Shape{192, 96, D()}, Shape{1000, 96, D()}, Shape{128, 512, D(true)},
                          Shape{100, 64, D()}, Shape{320, 96, D(false, true, 64, 320)},
                          Shape{320, 96, D(true, false, 100, 300)}}) {
    const TestWeight W = make_weight(GemmFormat::bf16, sh.rows, sh.cols, rng);
    std::vector<uint32_t> pan(size_t(bf16_panel_words(W.view())));
    pack_bf16_panels(W.view(), pan.data());
    GemmWeight wp = W.view();
    wp.panels = pan.data();
    const int64_t nout = (sh.o.row_end < 0 ? sh.rows : sh.o.row_end) - sh.o.row_begin;
    for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9}) {
      LevelGuard guard;
      const std::vector<float> x = make_x(n * sh.cols, rng, false);
      const std::vector<float> want = slow_linear(W, x, n, sh.o);
      for (SimdLevel l : levels()) {
        ASSERT_EQ(set_simd_level(l), l);
        for (int th : {1, 2, 3}) {
          omp_set_num_threads(th);
          std::vector<float> y(size_t(n * nout), -1.0f);
          linear(wp, x.data(), n, y.data(), sh.o);
          expect_bitwise(want, y, fmt::format("panels [{}x{}] rows [{},{}) n_tok={} level={} threads={}", sh.rows,
                                              sh.cols, sh.o.row_begin, sh.o.row_end, n, simd_level_name(l), th));
        }
      }
    }
  }
  // The copy is what the AVX-512 decode GEMVs read: with the copy of another weight they compute that weight's
  // product (other kernels read the rows).
  LevelGuard guard;
  const TestWeight W = make_weight(GemmFormat::bf16, 128, 96, rng), V = make_weight(GemmFormat::bf16, 128, 96, rng);
  std::vector<uint32_t> pan(size_t(bf16_panel_words(V.view())));
  pack_bf16_panels(V.view(), pan.data());
  GemmWeight wp = W.view();
  wp.panels = pan.data();
  for (int64_t n : {1, 8}) {
    const std::vector<float> x = make_x(n * 96, rng, false);
    for (SimdLevel l : levels()) {
      ASSERT_EQ(set_simd_level(l), l);
      std::vector<float> y(size_t(n * 128));
      linear(wp, x.data(), n, y.data(), D());
      expect_bitwise(slow_linear(l >= SimdLevel::avx512 ? V : W, x, n, D()), y,
                     fmt::format("read the copy, n_tok={} level={}", n, simd_level_name(l)));
    }
  }
}

// Ops::linear_check_finite on the CPU (the head's logits, checked by the threads that computed them): y bitwise
// linear()'s, and the flags those of check_finite on y — also when one token's only non-finite output lies in one
// row group (a weight row with a huge value that only that token's input overflows), for tokens with a NaN or inf
// input, every kernel and thread count, with and without the BF16 panel copy, and over flags that held garbage.
TEST(Gemm, LinearCheckFiniteFlagsTheRowsThatHoldNanOrInf) {
  std::mt19937 rng(91);
  const CpuOps ops;
  for (const bool panels : {false, true}) {
    TestWeight W = make_weight(GemmFormat::bf16, 1000, 96, rng);
    const float huge = 3.0e38f;
    uint32_t hb;
    std::memcpy(&hb, &huge, 4);
    const uint16_t h = uint16_t(hb >> 16);
    std::memcpy(&W.w[2 * (700 * 96 + 5)], &h, 2);  // W[700, 5] ~ 3e38: an input of 10 there overflows row 700 alone
    std::vector<uint32_t> pan(size_t(bf16_panel_words(W.view())));
    pack_bf16_panels(W.view(), pan.data());
    GemmWeight wv = W.view();
    if (panels) wv.panels = pan.data();
    for (int64_t n : {1, 2, 5, 8, 9, 20}) {
      LevelGuard guard;
      std::vector<float> x = make_x(n * 96, rng, false);
      for (int64_t t = 0; t < n; ++t) x[size_t(t * 96 + 5)] = 1e-3f;  // W[700, 5] x[5] stays finite
      const int64_t over = n / 2;                                       // ... but for this token
      x[size_t(over * 96 + 5)] = 10.0f;
      if (n >= 5) {
        x[size_t(1 * 96 + 40)] = std::numeric_limits<float>::quiet_NaN();
        x[size_t(3 * 96 + 7)] = std::numeric_limits<float>::infinity();
      }
      std::vector<float> want(size_t(n * 1000));
      linear(wv, x.data(), n, want.data(), D());
      std::vector<int32_t> want_bad(static_cast<size_t>(n));
      ops.check_finite(want.data(), n, 1000, want_bad.data());
      ASSERT_EQ(want_bad[size_t(over)], 1);
      for (SimdLevel l : levels()) {
        ASSERT_EQ(set_simd_level(l), l);
        for (int th : {1, 2, 3}) {
          omp_set_num_threads(th);
          std::vector<float> y(size_t(n * 1000), -1.0f);
          std::vector<int32_t> bad(size_t(n), 7);
          ops.linear_check_finite(wv, x.data(), n, y.data(), D(), bad.data());
          const std::string what =
              fmt::format("panels {} n_tok={} level={} threads={}", panels, n, simd_level_name(l), th);
          expect_bitwise(want, y, what);
          EXPECT_EQ(bad, want_bad) << what;
        }
      }
    }
  }
}

TEST(Gemm, BatchEqualsSeparateProducts) {
  // linear_batch runs several products' row groups in one parallel region (each thread one run of groups across the
  // products, prefetching the next group) and quantizes a shared input once: every output equals its own linear()
  // bitwise — mixed formats and modes, shared x with fewer / more tokens, a partial group, a zero-token job, row
  // ranges — for 1..3 threads.
  std::mt19937 rng(12);
  LevelGuard guard;
  const TestWeight w1 = make_weight(GemmFormat::fp4, 192, 512, rng), w3 = make_weight(GemmFormat::fp4, 192, 512, rng);
  const TestWeight w8 = make_weight(GemmFormat::fp8, 130, 512, rng), wb = make_weight(GemmFormat::bf16, 100, 96, rng);
  const TestWeight w4 = make_weight(GemmFormat::fp4, 64, 256, rng), w2 = make_weight(GemmFormat::fp8, 256, 384, rng);
  const std::vector<float> x1 = make_x(7 * 512, rng, true), xb = make_x(3 * 96, rng, false);
  const std::vector<float> x2 = make_x(5 * 384, rng, true);
  struct J {
    const TestWeight* W;
    const float* x;
    int64_t n_tok;
    LinearOpts o;
  };
  LinearOpts rr = Q();
  rr.row_begin = 70;
  rr.row_end = 200;
  const std::vector<J> js = {{&w1, x1.data(), 1, Q()},  {&w3, x1.data(), 1, Q()},     {&w8, x1.data(), 2, Q(false)},
                             {&wb, xb.data(), 3, D()},  {&w4, x1.data(), 1, Q()},     {&w2, x2.data(), 5, rr},
                             {&w2, x2.data(), 3, Q()},  {&w1, x1.data(), 7, Q()},     {&w8, x1.data(), 0, Q()},
                             {&w2, x2.data(), 1, D(true, true)}};
  for (SimdLevel l : levels()) {
    ASSERT_EQ(set_simd_level(l), l);
    for (int th : {1, 2, 3}) {
      omp_set_num_threads(th);
      std::vector<std::vector<float>> want(js.size()), got(js.size());
      std::vector<LinearJob> jobs;
      for (size_t i = 0; i < js.size(); ++i) {
        const J& j = js[i];
        const int64_t nout = (j.o.row_end < 0 ? j.W->rows : j.o.row_end) - j.o.row_begin;
        want[i].assign(static_cast<size_t>(std::max<int64_t>(1, j.n_tok * nout)), -1.0f);
        got[i].assign(want[i].size(), -1.0f);  // (the zero-token job writes nothing)
        linear(j.W->view(), j.x, j.n_tok, want[i].data(), j.o);
        jobs.push_back(LinearJob{j.W->view(), j.x, j.n_tok, got[i].data(), j.o});
      }
      {  // leave other activations in linear()'s scratch, so that reading past a job's own tokens shows
        const std::vector<float> other = make_x(8 * 512, rng, true);
        std::vector<float> y(8 * 192);
        linear(w1.view(), other.data(), 8, y.data(), Q());
      }
      linear_batch(jobs);
      for (size_t i = 0; i < js.size(); ++i)
        expect_bitwise(want[i], got[i], fmt::format("job {} level={} threads={}", i, simd_level_name(l), th));
    }
  }
}

TEST(Gemm, NextGroupPrefetchTilesTheGroup) {
  // The fused GEMVs prefetch the next group one part per weight word of each k-step (gemm_kernels.h
  // next_group_part): over the k-steps of the FP4 / FP8 single-token GEMVs and of the 2-8 token ones (2 panel pairs,
  // each over all of K), with their word counts (a partial last step has fewer words), the parts must tile the next
  // group's bytes [0, bytes) in order, cache-line aligned: every line once, none past the end.
  using gemm_detail::next_group_part;
  using gemm_detail::next_group_slice_bytes;
  struct Walk {
    int64_t cols_per_step, codes_per_word, passes;
  };
  for (const Walk w : {Walk{128, 8, 1}, Walk{64, 4, 1}, Walk{128, 8, 2}, Walk{64, 4, 2}})
    for (int64_t K : {32, 96, 160, 2048, 4096, 4104, 7168})
      for (int64_t bytes : {int64_t{64}, int64_t{144}, int64_t{4096}, int64_t{100 * 2048}, int64_t{64 * 4096}, int64_t{64 * 3584},
                            int64_t{64 * 7168 + 64}}) {
        std::vector<int> words;  // words of each k-step, in the kernel's order
        for (int64_t pass = 0; pass < w.passes; ++pass)
          for (int64_t k0 = 0; k0 < K; k0 += w.cols_per_step)
            words.push_back(static_cast<int>(std::min(w.cols_per_step, K - k0) / w.codes_per_word));
        const int64_t slice = next_group_slice_bytes(bytes, static_cast<int64_t>(words.size()));
        ASSERT_EQ(slice % 64, 0);
        int64_t end = 0;
        for (size_t st = 0; st < words.size(); ++st)
          for (int c = 0; c < words[st]; ++c) {
            const auto [b0, b1] = next_group_part(bytes, slice, static_cast<int64_t>(st), c, words[st]);
            ASSERT_EQ(b0, end) << "K " << K << " bytes " << bytes << " step " << st << " part " << c;
            ASSERT_TRUE((b0 % 64 == 0 || b0 == bytes) && b1 >= b0 && b1 <= bytes);
            end = b1;
          }
        EXPECT_EQ(end, bytes) << "K " << K << " bytes " << bytes << " cols/step " << w.cols_per_step;
      }
}

TEST(CpuBackend, HeadLayoutIsThePanelCopy) {
  std::mt19937 rng(13);
  CpuBackend& be = cpu_backend();
  std::vector<Buffer> storage;
  const TestWeight W = make_weight(GemmFormat::bf16, 100, 96, rng);
  const GemmWeight v = be.add_head_layout(W.view(), storage);
  ASSERT_NE(v.panels, nullptr);
  EXPECT_EQ(v.w, W.w.data());
  ASSERT_EQ(storage.size(), 1u);
  std::vector<uint32_t> pan(size_t(bf16_panel_words(W.view())));
  pack_bf16_panels(W.view(), pan.data());
  EXPECT_EQ(std::memcmp(v.panels, pan.data(), pan.size() * 4), 0);
  // other heads: unchanged, nothing kept
  const TestWeight F = make_weight(GemmFormat::fp8, 128, 128, rng), N = make_weight(GemmFormat::bf16, 64, 80, rng);
  EXPECT_EQ(be.add_head_layout(F.view(), storage).panels, nullptr);
  EXPECT_EQ(be.add_head_layout(N.view(), storage).panels, nullptr);
  EXPECT_EQ(storage.size(), 1u);
}

TEST(Gemm, SmallBatchQuantizedNarrowShapes) {
  // 2-8 tokens, reference (Q) numerics, K a multiple of 32 but not of 128 (the demo model's 64-, 96- and
  // 160-column linears and experts): the fused multi-token FP4 / FP8 GEMV's masked last step and short last FP8
  // block, full groups and a partial one
  std::mt19937 rng(14);
  for (int64_t n : {1, 2, 3, 5, 8})
    for (const Case& c : {Case{GemmFormat::fp4, 192, 96, n, Q()}, Case{GemmFormat::fp4, 128, 160, n, Q(false)},
                          Case{GemmFormat::fp4, 64, 32, n, Q()}, Case{GemmFormat::fp4, 100, 96, n, Q()},
                          Case{GemmFormat::fp8, 128, 96, n, Q()}, Case{GemmFormat::fp8, 512, 64, n, Q(false)},
                          Case{GemmFormat::fp8, 64, 160, n, Q()}, Case{GemmFormat::fp8, 128, 96, n, Q(), false, 24},
                          Case{GemmFormat::fp8, 64, 224, n, Q(), true}, Case{GemmFormat::fp8, 64, 96, n, D()}})
      run_case(c, rng);
}

TEST(Gemm, RowOfOutputIndependentOfBatch) {
  // Row t of y depends only on row t of x: a 1-token call equals the same row of a 37-token call.
  std::mt19937 rng(5);
  const TestWeight W = make_weight(GemmFormat::fp4, 96, 512, rng);
  const std::vector<float> x = make_x(37 * 512, rng, true);
  std::vector<float> y(37 * 96), y1(96);
  linear(W.view(), x.data(), 37, y.data(), Q());
  for (int64_t t : {0, 17, 36}) {
    linear(W.view(), x.data() + t * 512, 1, y1.data(), Q());
    EXPECT_EQ(std::memcmp(y1.data(), y.data() + t * 96, 96 * 4), 0) << t;
  }
}

TEST(Gemm, RejectsBadArguments) {
  std::mt19937 rng(6);
  const TestWeight W = make_weight(GemmFormat::bf16, 8, 16, rng);
  const TestWeight W8 = make_weight(GemmFormat::fp8, 8, 16, rng);
  std::vector<float> x(16), y(8);
  EXPECT_THROW(linear(W.view(), x.data(), 1, y.data(), Q()), Error);  // act quant of a bf16 weight
  EXPECT_THROW(linear(W.view(), x.data(), 1, y.data(), D(false, false, 4, 2)), Error);
  EXPECT_THROW(linear(W.view(), x.data(), 1, y.data(), D(false, false, 0, 9)), Error);
  GemmWeight g = W8.view();
  g.block_cols = 64;
  EXPECT_THROW(linear(g, x.data(), 1, y.data(), Q()), Error);
  g = W8.view();
  g.scale = nullptr;
  EXPECT_THROW(linear(g, x.data(), 1, y.data(), D()), Error);
  EXPECT_NO_THROW(linear(W.view(), x.data(), 0, y.data(), D()));
}

TEST(Gemm, SimdLevelSelection) {
  LevelGuard guard;
  EXPECT_EQ(set_simd_level(SimdLevel::scalar), SimdLevel::scalar);
  EXPECT_EQ(simd_level(), SimdLevel::scalar);
  // asking for more than the CPU has is clamped to the best available level
  EXPECT_EQ(set_simd_level(SimdLevel::avx512vbmi), best_simd_level());
  EXPECT_STREQ(simd_level_name(SimdLevel::avx2), "avx2");
  EXPECT_STREQ(simd_level_name(SimdLevel::avx512vbmi), "avx512vbmi");
  // the VBMI kernels are chosen exactly when the CPU has AVX-512 with VBMI (and the build has them)
  const CpuFeatures& c = cpu_features();
  if (c.avx2 && c.fma && c.f16c && c.avx512f && c.avx512bw && c.avx512vl && c.avx512vbmi) {
    EXPECT_EQ(best_simd_level(), SimdLevel::avx512vbmi);
  }
  if (!c.avx512vbmi) {
    EXPECT_NE(best_simd_level(), SimdLevel::avx512vbmi);
  }
}

TEST(Gemm, NumericsNames) {
  EXPECT_EQ(parse_numerics("reference"), Numerics::reference);
  EXPECT_EQ(parse_numerics("dense"), Numerics::dense);
  EXPECT_FALSE(parse_numerics("Dense").has_value());
  EXPECT_EQ(numerics_name(Numerics::dense), "dense");
  EXPECT_TRUE(quantized_linear_opts(Numerics::reference).act_quant_fp8);
  EXPECT_FALSE(quantized_linear_opts(Numerics::dense).act_quant_fp8);
  EXPECT_FALSE(quantized_linear_opts(Numerics::dense).out_bf16);
}

}  // namespace
}  // namespace dsv4
