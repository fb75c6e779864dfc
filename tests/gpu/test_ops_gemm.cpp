// CUDA vs CPU: linear() (src/backend/cuda/k_gemm.cu, gemm_cublaslt.cpp) against CpuOps::linear (backend/gemm.h) for
// every weight format (FP8 with E8M0 / F32 / 64x64 block scales, FP4, BF16, F32), both products ((Q) act_quant +
// block-scaled, (D) dense, (D) with weight_as_bf16), out_bf16 on/off, output-row subranges, and every path
// (simt, small_m, cublaslt, auto), at tiny shapes with partial blocks and at the real V4-Flash shapes.
//
// Checks and tolerances (one printed line each):
// * BITWISE vs CPU, (Q) and (D), on the simt and small_m paths. Every output is computed in the CPU's order of gemm.h:
//   (Q) per scale block an fma chain from 0 over the block, then acc += s * (sa * sw), blocks ascending (the products
//   are exact), with the same bit-exact activation quantization; (D) one fma chain over all of K in ascending k with
//   the exactly dequantized weight (code * scale in one fp32 multiply, bf16-rounded with weight_as_bf16). Both
//   kernels (tile_kernel, and small_kernel (Q) / rowchain_kernel (D) for decode) keep one accumulator per output, so
//   every output bit must match, whatever the path, n_tok or row range. (FP8 with F32 scales in (Q): against the
//   CPU's scalar kernels, see run_cpu.)
// * BITWISE simt == small_m, every mode (implied by the above; checked on its own so a failure names the kernel).
// * BITWISE batch invariance: row t of a 300-token call == the same row computed alone (simt and small_m).
// * gemv (the default decode kernel, its own summation order) vs CPU: atol = 2 K 2^-24 B (+ rtol 2^-7 with
//   out_bf16), B as below: each side's fp32 sum of the same products is within (K-1) 2^-24 sum|x_k w_k| of the exact
//   one. Also run-to-run determinism and batch invariance (row t of an 8-token call == alone; 2- and 5-token calls),
//   bitwise.
// * wo_a's grouped linear in the fast mode on f16 tensor cores (linear_grouped, 1..8 tokens, (D) + weight_as_bf16,
//   bf16 activations): the products are exact there too (e4m3 codes and bf16 x as f16 after a power-of-two
//   scaling), the 128-column partial sums are tensor-core fp32 sums: the cuBLASLt tolerance below. Also run-to-run
//   determinism and batch invariance (token t of an 8-token call == alone), bitwise.
// * cuBLASLt vs CPU: atol = max(2^-11, K * 2^-24) * B (+ rtol 2^-7 with out_bf16), B = max_m |x_m|_2 * max_n |Wd_n|_2
//   (Cauchy-Schwarz bound of sum_k |x_k * w_k|): the 128-column partial sums are tensor-core FP8 accumulations
//   (Hopper keeps ~14 bits inside one MMA chain, hence 2^-11 with margin) instead of the CPU's fma chain, and an fp32
//   value next to a bf16 rounding boundary may round to the neighbour (one bf16 ulp <= 2^-7 |value|). Also:
//   run-to-run determinism (bitwise). Not asserted (printed only): row t of a 300-token call vs the same row in a
//   64-token call — cuBLASLt may pick another algorithm for another n_tok.
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <functional>

#include "backend/cuda/gemm_path.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "backend/gemm.h"
#include "gpu_test_util.h"

namespace dsv4::test::gpu {
namespace {
namespace gm {  // own helpers: names added to gpu_test_util.h later can never clash

using cuda::GemmPath;

const Ops& cops() { return cpu().ops(); }
const Ops& gops() { return cuda()->ops(); }

uint32_t fbits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// splitmix64: fills gigabytes of weights in about a second.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uni() { return float(next() >> 40) * 0x1p-24f; }  // [0, 1)
  float normal() {
    const float u1 = (float(next() >> 40) + 1.0f) * 0x1p-24f, u2 = uni();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
  }
};

struct Fmt {
  GemmFormat f;
  bool sf32 = false;  // FP8 scales stored as F32
  int64_t blk = 128;  // FP8 scale block (square)
};

std::string fmt_name(const Fmt& f) {
  switch (f.f) {
    case GemmFormat::fp8:
      return f.blk != 128 ? strf("fp8/e8m0-%lldx%lld", (long long)f.blk, (long long)f.blk)
                          : (f.sf32 ? "fp8/f32scale" : "fp8/e8m0");
    case GemmFormat::fp4: return "fp4/e8m0";
    case GemmFormat::bf16: return "bf16";
    case GemmFormat::f32: return "f32";
  }
  return "?";
}

// Random weight in the checkpoint formats (like gpu_test_util.h's random_weight, but fast enough for 1 GB):
// FP8 every code but NaN, scales 2^-9..2^-7 (E8M0) or (0.5..1.5)*2^-8 (F32, not powers of two); FP4 every nibble,
// scales 2^-6..2^-4; BF16 / F32 uniform in [-0.1, 0.1).
HostWeight make_weight(const Fmt& fm, int64_t rows, int64_t cols, uint64_t seed) {
  Rng rng(seed);
  HostWeight h;
  WeightView& v = h.view;
  v.fmt = fm.f;
  v.rows = rows;
  v.cols = cols;
  auto fill_bytes = [&](std::vector<uint8_t>& b) {
    size_t i = 0;
    for (; i + 8 <= b.size(); i += 8) {
      const uint64_t r = rng.next();
      std::memcpy(&b[i], &r, 8);
    }
    for (; i < b.size(); ++i) b[i] = uint8_t(rng.next());
  };
  switch (fm.f) {
    case GemmFormat::fp8: {
      h.w.resize(size_t(rows * cols));
      fill_bytes(h.w);
      for (auto& b : h.w)
        if ((b & 0x7F) == 0x7F) b ^= 0x01;  // no NaN codes
      v.block_rows = fm.blk;
      v.block_cols = fm.blk;
      const int64_t sr = (rows + fm.blk - 1) / fm.blk, sc = (cols + fm.blk - 1) / fm.blk;
      if (fm.sf32) {
        v.scale_f32 = true;
        h.scale.resize(size_t(sr * sc) * 4);
        for (int64_t i = 0; i < sr * sc; ++i) {
          const float s = (0.5f + rng.uni()) * 0x1p-8f;
          std::memcpy(&h.scale[size_t(i) * 4], &s, 4);
        }
      } else {
        h.scale.resize(size_t(sr * sc));
        for (auto& s : h.scale) s = uint8_t(118 + rng.next() % 3);
      }
      break;
    }
    case GemmFormat::fp4: {
      h.w.resize(size_t(rows * cols / 2));
      fill_bytes(h.w);
      v.block_rows = 1;
      v.block_cols = 32;
      h.scale.resize(size_t(rows * ((cols + 31) / 32)));
      for (auto& s : h.scale) s = uint8_t(121 + rng.next() % 3);
      break;
    }
    case GemmFormat::bf16: {
      h.w.resize(size_t(rows * cols) * 2);
      for (int64_t i = 0; i < rows * cols; ++i) {
        const uint16_t b = float_to_bf16_rne((rng.uni() - 0.5f) * 0.2f);
        std::memcpy(&h.w[size_t(i) * 2], &b, 2);
      }
      break;
    }
    case GemmFormat::f32: {
      h.w.resize(size_t(rows * cols) * 4);
      for (int64_t i = 0; i < rows * cols; ++i) {
        const float f = (rng.uni() - 0.5f) * 0.2f;
        std::memcpy(&h.w[size_t(i) * 4], &f, 4);
      }
      break;
    }
  }
  v.w = h.w.data();
  v.scale = h.scale.empty() ? nullptr : h.scale.data();
  return h;
}

// Exactly dequantized element (r, c) (the (D) weight of gemm.h).
float dequant(const WeightView& v, int64_t r, int64_t c) {
  switch (v.fmt) {
    case GemmFormat::fp8: {
      const int64_t i = (r / v.block_rows) * ((v.cols + v.block_cols - 1) / v.block_cols) + c / v.block_cols;
      float s;
      if (v.scale_f32)
        std::memcpy(&s, v.scale + 4 * i, 4);
      else
        s = e8m0_to_float(v.scale[i]);
      return e4m3fn_to_float(v.w[r * v.cols + c]) * s;
    }
    case GemmFormat::fp4: {
      const uint8_t b = v.w[r * (v.cols / 2) + c / 2];
      const float sc = e8m0_to_float(v.scale[r * ((v.cols + 31) / 32) + c / 32]);
      return e2m1_to_float(c % 2 == 0 ? (b & 0xF) : (b >> 4)) * sc;
    }
    case GemmFormat::bf16: {
      uint16_t h;
      std::memcpy(&h, v.w + 2 * (r * v.cols + c), 2);
      return bf16_to_float(h);
    }
    case GemmFormat::f32: {
      float f;
      std::memcpy(&f, v.w + 4 * (r * v.cols + c), 4);
      return f;
    }
  }
  return 0;
}

double max_row_norm_w(const WeightView& v, int64_t r0, int64_t r1) {
  double m = 0;
  for (int64_t r = r0; r < r1; ++r) {
    double s = 0;
    for (int64_t c = 0; c < v.cols; ++c) {
      const double d = dequant(v, r, c);
      s += d * d;
    }
    m = std::max(m, std::sqrt(s));
  }
  return m;
}

double max_row_norm_x(const std::vector<float>& x, int64_t n, int64_t K) {
  double m = 0;
  for (int64_t t = 0; t < n; ++t) {
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += double(x[size_t(t * K + k)]) * x[size_t(t * K + k)];
    m = std::max(m, std::sqrt(s));
  }
  return m;
}

std::vector<float> make_x(int64_t n, int64_t K, uint64_t seed, bool bf16) {
  Rng rng(seed);
  std::vector<float> x(size_t(n * K));
  for (auto& v : x) v = bf16 ? round_to_bf16(rng.normal()) : rng.normal();
  return x;
}

// Forces a GEMM path for its lifetime.
struct PathScope {
  GemmPath prev;
  explicit PathScope(GemmPath p) : prev(cuda::gemm_path()) { cuda::set_gemm_path(p); }
  ~PathScope() { cuda::set_gemm_path(prev); }
};

struct DevWeight {
  std::vector<Buffer> storage;
  WeightView v;
};
std::unique_ptr<DevWeight> upload(const HostWeight& h) {
  auto d = std::make_unique<DevWeight>();
  d->v = cuda()->upload(h.view, d->storage);
  return d;
}

// CPU reference. (Q) with F32 FP8 scales runs on the CPU's scalar kernels: the AVX2 / AVX-512 kernels are compiled
// with an FMA target and GCC contracts their `acc + s * (sa * sw)` into one fma (C++ defaults to -ffp-contract=fast),
// which differs from the scalar order of gemm.h by one rounding when s * sc is inexact — never with E8M0 scales
// (powers of two: the product is exact), only with F32 ones. The scalar kernel is the documented semantics.
std::vector<float> run_cpu(const HostWeight& h, const std::vector<float>& x, int64_t n, int64_t nout,
                           const LinearOpts& o) {
  std::vector<float> y(size_t(n * nout));
  const SimdLevel lv = simd_level();
  const bool scalar = o.act_quant_fp8 && h.view.fmt == GemmFormat::fp8 && h.view.scale_f32;
  if (scalar) set_simd_level(SimdLevel::scalar);
  cops().linear(h.view, x.data(), n, y.data(), o);
  if (scalar) set_simd_level(lv);
  return y;
}

std::vector<float> run_gpu(const WeightView& Wd, const float* xd, int64_t n, int64_t nout, const LinearOpts& o,
                           GemmPath p, GemmPath* taken) {
  PathScope ps(p);
  Buffer yd = out_buffer<float>(*cuda(), size_t(n * nout));
  gops().linear(Wd, xd, n, yd.as<float>(), o);
  if (taken) *taken = cuda::last_gemm_path();
  return to_host<float>(*cuda(), yd, size_t(n * nout));
}

// Every element's bits equal.
void expect_bitwise(const std::string& op, const std::string& shape, const std::vector<float>& ref,
                    const std::vector<float>& got) {
  const size_t n = std::min(ref.size(), got.size());
  int64_t nd = 0, first = -1;
  double maxd = 0;
  for (size_t i = 0; i < n; ++i)
    if (fbits(ref[i]) != fbits(got[i])) {
      if (first < 0) first = int64_t(i);
      ++nd;
      maxd = std::max(maxd, double(std::fabs(ref[i] - got[i])));
    }
  const bool ok = nd == 0 && ref.size() == got.size();
  std::printf("[%s] %s: bitwise, %lld/%zu elements differ (max_abs %.3g) %s\n", op.c_str(), shape.c_str(),
              (long long)nd, n, maxd, ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  if (!ok) {
    if (first < 0) {
      ADD_FAILURE() << op << " " << shape << ": size " << got.size() << " != " << ref.size();
      return;
    }
    const size_t i = size_t(first);
    ADD_FAILURE() << op << " " << shape << ": " << nd << " of " << n << " elements differ bitwise; first at " << i
                  << ": ref " << ref[i] << " got " << got[i];
  }
}

std::vector<float> rows_of(const std::vector<float>& y, int64_t t0, int64_t nt, int64_t width) {
  return std::vector<float>(y.begin() + t0 * width, y.begin() + (t0 + nt) * width);
}

const char* path_name(GemmPath p) { return cuda::gemm_path_name(p); }

// One CUDA result against the CPU reference, with the check its path calls for (see the file comment).
void check_vs_cpu(const std::string& label, const std::vector<float>& ref, const std::vector<float>& got, bool Q,
                  GemmPath taken, int64_t K, double B, bool out_bf16) {
  (void)Q;
  const double u = std::ldexp(1.0, -24);
  if (taken == GemmPath::cublaslt) {
    expect_close("linear", label, ref, got, std::max(std::ldexp(1.0, -11), double(K) * u) * B,
                 out_bf16 ? std::ldexp(1.0, -7) : 0.0);
  } else if (taken == GemmPath::gemv) {
    // another fp32 summation order of the same exact products: each side within (K - 1) u sum|x_k w_k| <= K u B of
    // the exact sum, so the two within 2 K u B; a bf16 output may round to the neighbour (one bf16 ulp)
    expect_close("linear", label, ref, got, 2.0 * double(K) * u * B, out_bf16 ? std::ldexp(1.0, -7) : 0.0);
  } else {
    expect_bitwise("linear", label, ref, got);  // (Q) and (D): the CPU's order on simt and small_m
  }
}

struct Mode {
  const char* name;
  bool Q, wbf16;
};

}  // namespace gm

using namespace gm;

// ---- tiny shapes: partial blocks, every format / mode / path -----------------------------------------------------
TEST(CudaGemm, LinearTinyShapesAllFormatsModesPaths) {
  DSV4_REQUIRE_GPU();
  struct Shape {
    int64_t rows, cols, r0, r1;
  };
  // 96 x 144: partial row block (96 of 128) and partial column blocks (144 = 128 + 16; FP4: 4.5 blocks of 32);
  // 64 x 128: whole blocks; 40 x 100: K not a multiple of 8 or 16 (scalar load paths everywhere).
  const Shape shapes[] = {{96, 144, 16, 80}, {64, 128, 32, 64}, {40, 100, 8, 24}};
  const Fmt fmts[] = {{GemmFormat::fp8, false, 128}, {GemmFormat::fp8, true, 128}, {GemmFormat::fp8, false, 64},
                      {GemmFormat::fp4}, {GemmFormat::bf16}, {GemmFormat::f32}};
  const Mode qmode{"Q", true, false}, dmode{"D", false, false}, dwmode{"D+weight_as_bf16", false, true};
  const int64_t ntoks[] = {1, 5, 300};
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    for (const Fmt& f : fmts) {
      const HostWeight h = make_weight(f, s.rows, s.cols, seed++);
      const auto d = upload(h);
      std::vector<Mode> modes;
      const bool quant = f.f == GemmFormat::fp8 || f.f == GemmFormat::fp4;
      if (quant && f.blk == 128) modes.push_back(qmode);
      modes.push_back(dmode);
      modes.push_back(dwmode);
      for (const Mode& m : modes) {
        for (int variant = 0; variant < 2; ++variant) {
          LinearOpts o;
          o.act_quant_fp8 = m.Q;
          o.weight_as_bf16 = m.wbf16;
          o.out_bf16 = variant == 0 ? m.Q : !m.Q;
          if (variant == 1) o.row_begin = s.r0, o.row_end = s.r1;
          const int64_t r0 = o.row_begin, r1 = o.row_end < 0 ? s.rows : o.row_end, nout = r1 - r0;
          const double Bw = max_row_norm_w(h.view, r0, r1);
          for (const int64_t n : ntoks) {
            const std::vector<float> x = make_x(n, s.cols, seed++, false);
            const double B = max_row_norm_x(x, n, s.cols) * Bw * (m.Q ? 1.1 : 1.0);
            const std::vector<float> ref = run_cpu(h, x, n, nout, o);
            const Buffer xd = to_device(*cuda(), x);
            const std::string base =
                strf("%s %lldx%lld rows[%lld,%lld) n_tok=%lld %s out_%s", fmt_name(f).c_str(), (long long)s.rows,
                     (long long)s.cols, (long long)r0, (long long)r1, (long long)n, m.name,
                     o.out_bf16 ? "bf16" : "fp32");
            GemmPath t1, t2;
            const auto ys = run_gpu(d->v, xd.as<float>(), n, nout, o, GemmPath::simt, &t1);
            const auto ym = run_gpu(d->v, xd.as<float>(), n, nout, o, GemmPath::small_m, &t2);
            EXPECT_EQ(t1, GemmPath::simt);
            EXPECT_EQ(t2, GemmPath::small_m);
            check_vs_cpu(base + " path=simt", ref, ys, m.Q, t1, s.cols, B, o.out_bf16);
            check_vs_cpu(base + " path=small_m", ref, ym, m.Q, t2, s.cols, B, o.out_bf16);
            expect_bitwise("linear simt==small_m", base, ys, ym);
            GemmPath t3;  // gemv: shapes it cannot take (K = 100, > 8 tokens) fall back to small_m / simt
            const auto yg = run_gpu(d->v, xd.as<float>(), n, nout, o, GemmPath::gemv, &t3);
            check_vs_cpu(base + strf(" path=gemv(taken %s)", path_name(t3)), ref, yg, m.Q, t3, s.cols, B,
                         o.out_bf16);
            const int64_t gcc = f.f == GemmFormat::fp4 ? 32 : f.f == GemmFormat::fp8 ? 16 : f.f == GemmFormat::bf16 ? 8 : 4;
            const bool gv_shape = s.cols % gcc == 0;
            EXPECT_EQ(t3, n > 8 ? GemmPath::simt : gv_shape ? GemmPath::gemv : GemmPath::small_m) << base;
          }
        }
      }
    }
  }
}

// Auto path choice and forced-path fallbacks.
TEST(CudaGemm, LinearPathSelection) {
  DSV4_REQUIRE_GPU();
  const HostWeight h = make_weight({GemmFormat::fp8}, 256, 512, 77);
  const auto d = upload(h);
  const bool lt = cuda::gemm_internal::cublaslt_device_ok();
  std::printf("[linear] cuBLASLt block-scaled path available on this device: %s\n", lt ? "yes" : "no");
  LinearOpts q;
  q.act_quant_fp8 = true;
  q.out_bf16 = true;
  LinearOpts dn;
  for (const int64_t n : {1, 8, 9, 63, 64, 300}) {
    const std::vector<float> x = make_x(n, 512, 1000 + n, false);
    const Buffer xd = to_device(*cuda(), x);
    GemmPath tq, td, tf;
    run_gpu(d->v, xd.as<float>(), n, 256, q, GemmPath::auto_, &tq);
    run_gpu(d->v, xd.as<float>(), n, 256, dn, GemmPath::auto_, &td);
    run_gpu(d->v, xd.as<float>(), n, 256, dn, GemmPath::cublaslt, &tf);  // (D) never runs on cuBLASLt
    const GemmPath want_d = n <= 8 ? GemmPath::gemv : GemmPath::simt;
    const GemmPath want_q = (lt && n > 8) ? GemmPath::cublaslt : want_d;
    std::printf("[linear] path auto n_tok=%lld: (Q) %s (want %s), (D) %s (want %s), forced cublaslt (D) -> %s\n",
                (long long)n, path_name(tq), path_name(want_q), path_name(td), path_name(want_d), path_name(tf));
    EXPECT_EQ(tq, want_q) << "n_tok " << n;
    EXPECT_EQ(td, want_d) << "n_tok " << n;
    EXPECT_EQ(tf, GemmPath::simt) << "n_tok " << n;
    // the deterministic mode: only the kernels in the CPU's order
    cuda::set_deterministic(true);
    GemmPath dq, dd;
    run_gpu(d->v, xd.as<float>(), n, 256, q, GemmPath::auto_, &dq);
    run_gpu(d->v, xd.as<float>(), n, 256, dn, GemmPath::auto_, &dd);
    cuda::set_deterministic(false);
    const GemmPath want_det = n <= 8 ? GemmPath::small_m : GemmPath::simt;
    std::printf("[linear] path auto deterministic n_tok=%lld: (Q) %s, (D) %s (want %s)\n", (long long)n,
                path_name(dq), path_name(dd), path_name(want_det));
    EXPECT_EQ(dq, want_det) << "n_tok " << n;
    EXPECT_EQ(dd, want_det) << "n_tok " << n;
  }
}

// cuBLASLt at small shapes (K/128 a multiple of 4), padded M (65), row subranges, E8M0 and F32 scales.
TEST(CudaGemm, LinearCublasLtSmallShapes) {
  DSV4_REQUIRE_GPU();
  const bool lt = cuda::gemm_internal::cublaslt_device_ok();
  struct C {
    int64_t rows, cols, r0, r1;
    bool sf32;
  };
  const C cases[] = {{256, 512, 128, 256, false}, {256, 512, 0, 256, true}, {128, 1024, 0, 128, false}};
  uint64_t seed = 500;
  for (const C& c : cases) {
    const Fmt f{GemmFormat::fp8, c.sf32, 128};
    const HostWeight h = make_weight(f, c.rows, c.cols, seed++);
    const auto d = upload(h);
    const double Bw = max_row_norm_w(h.view, c.r0, c.r1);
    for (const bool ob : {true, false}) {
      LinearOpts o;
      o.act_quant_fp8 = true;
      o.out_bf16 = ob;
      o.row_begin = c.r0;
      o.row_end = c.r1;
      const int64_t nout = c.r1 - c.r0;
      for (const int64_t n : {1, 5, 64, 65, 300}) {
        const std::vector<float> x = make_x(n, c.cols, seed++, false);
        const double B = max_row_norm_x(x, n, c.cols) * Bw * 1.1;
        const std::vector<float> ref = run_cpu(h, x, n, nout, o);
        const Buffer xd = to_device(*cuda(), x);
        GemmPath t1, t2;
        const auto y1 = run_gpu(d->v, xd.as<float>(), n, nout, o, GemmPath::cublaslt, &t1);
        const auto y2 = run_gpu(d->v, xd.as<float>(), n, nout, o, GemmPath::cublaslt, &t2);
        const std::string base = strf("%s %lldx%lld rows[%lld,%lld) n_tok=%lld Q out_%s path=cublaslt(taken %s)",
                                      fmt_name(f).c_str(), (long long)c.rows, (long long)c.cols, (long long)c.r0,
                                      (long long)c.r1, (long long)n, ob ? "bf16" : "fp32", path_name(t1));
        EXPECT_EQ(t1, lt ? GemmPath::cublaslt : GemmPath::simt) << base;
        check_vs_cpu(base, ref, y1, true, t1, c.cols, B, ob);
        expect_bitwise("linear cublaslt run-to-run", base, y1, y2);
      }
    }
  }
}

// (D) with extreme block scales, weight_as_bf16 on / off, bitwise vs CPU on simt and small_m. FP8 E8M0 exponents 0
// and 2 (code * scale subnormal: there the bf16 rounding of the dequantized weight is not the identity, and
// rowchain_kernel must not skip it; rows 0..127 see only these two blocks, so their outputs show it), 4 and 134
// (2^7; rounding is the identity: an e4m3 code times a power of two >= 2^-124 keeps <= 4 significant bits, the
// kernel skips it); F32 scales around 2^-130 (subnormal, always rounded); FP4 with exponents 0..3 (an e2m1 code times
// any power of two is a bf16 value). 256 x 256 and 64 x 256: rowchain_kernel's fast path; 40 x 100: its per-element
// path.
TEST(CudaGemm, LinearDenseExtremeScales) {
  DSV4_REQUIRE_GPU();
  struct C {
    Fmt f;
    int64_t rows, cols;
    std::vector<uint8_t> e8;  // E8M0 exponents of the scale grid, row-major (FP4: random 0..3)
  };
  const C cases[] = {{{GemmFormat::fp8, false, 128}, 256, 256, {0, 2, 4, 134}},
                     {{GemmFormat::fp8, true, 128}, 64, 256, {}},
                     {{GemmFormat::fp8, false, 64}, 40, 100, {1, 6}},
                     {{GemmFormat::fp4}, 64, 256, {}}};
  uint64_t seed = 700;
  for (const C& c : cases) {
    HostWeight h = make_weight(c.f, c.rows, c.cols, seed++);
    Rng rng(seed++);
    std::string sdesc;
    if (c.f.f == GemmFormat::fp8 && c.f.sf32) {
      for (size_t i = 0; i + 4 <= h.scale.size(); i += 4) {
        const float sc = (0.5f + rng.uni()) * 0x1p-130f;
        std::memcpy(&h.scale[i], &sc, 4);
      }
      sdesc = "f32 ~2^-130";
    } else if (c.f.f == GemmFormat::fp4) {
      for (auto& sc : h.scale) sc = uint8_t(rng.next() % 4);
      sdesc = "e8m0 0..3";
    } else {
      ASSERT_EQ(h.scale.size(), c.e8.size());
      h.scale = c.e8;
      h.view.scale = h.scale.data();
      sdesc = "e8m0";
      for (const uint8_t e : c.e8) sdesc += strf(" %d", int(e));
    }
    const auto d = upload(h);
    for (const bool wb : {true, false}) {
      for (const int64_t n : {1, 5, 70}) {
        LinearOpts o;
        o.weight_as_bf16 = wb;
        const std::vector<float> x = make_x(n, c.cols, seed++, false);
        const std::vector<float> ref = run_cpu(h, x, n, c.rows, o);
        const Buffer xd = to_device(*cuda(), x);
        const std::string base = strf("%s %lldx%lld scales %s n_tok=%lld D%s out_fp32", fmt_name(c.f).c_str(),
                                      (long long)c.rows, (long long)c.cols, sdesc.c_str(), (long long)n,
                                      wb ? "+weight_as_bf16" : "");
        const auto ys = run_gpu(d->v, xd.as<float>(), n, c.rows, o, GemmPath::simt, nullptr);
        const auto ym = run_gpu(d->v, xd.as<float>(), n, c.rows, o, GemmPath::small_m, nullptr);
        expect_bitwise("linear", base + " path=simt", ref, ys);
        expect_bitwise("linear", base + " path=small_m", ref, ym);
      }
    }
  }
}

// ---- real V4-Flash shapes ------------------------------------------------------------------------------------------
namespace gm {
struct RealCase {
  const char* name;
  Fmt fmt;
  int64_t rows, cols;
  Mode mode;
  bool out_bf16;
  int64_t r0, r1;  // r1 = -1: all rows
  std::vector<int64_t> ntoks;
  bool x_bf16;  // reference numerics: bf16-representable activations
};

void run_real(const RealCase& c, uint64_t seed) {
  const HostWeight h = make_weight(c.fmt, c.rows, c.cols, seed);
  const auto d = upload(h);
  LinearOpts o;
  o.act_quant_fp8 = c.mode.Q;
  o.weight_as_bf16 = c.mode.wbf16;
  o.out_bf16 = c.out_bf16;
  o.row_begin = c.r0;
  o.row_end = c.r1;
  o.x_bf16 = c.x_bf16;  // (BF16 weights of more than 8 tokens then run on cuBLAS BF16 in the automatic path)
  const int64_t r1 = c.r1 < 0 ? c.rows : c.r1, nout = r1 - c.r0;
  const double Bw = max_row_norm_w(h.view, c.r0, r1);
  const bool lt_shape =
      c.mode.Q && c.fmt.f == GemmFormat::fp8 && cuda::gemm_internal::cublaslt_shape_ok(h.view, c.r0, r1);
  for (const int64_t n : c.ntoks) {
    const std::vector<float> x = make_x(n, c.cols, seed * 131 + n, c.x_bf16);
    const double B = max_row_norm_x(x, n, c.cols) * Bw * (c.mode.Q ? 1.1 : 1.0);
    const std::vector<float> ref = run_cpu(h, x, n, nout, o);
    const Buffer xd = to_device(*cuda(), x);
    const std::string base = strf("%s %s %lldx%lld rows[%lld,%lld) n_tok=%lld %s out_%s", c.name,
                                  fmt_name(c.fmt).c_str(), (long long)c.rows, (long long)c.cols, (long long)c.r0,
                                  (long long)r1, (long long)n, c.mode.name, c.out_bf16 ? "bf16" : "fp32");
    std::vector<GemmPath> paths = {GemmPath::simt, GemmPath::small_m, GemmPath::gemv, GemmPath::auto_};
    if (lt_shape) paths.push_back(GemmPath::cublaslt);
    std::vector<float> ys, ym;
    for (const GemmPath p : paths) {
      GemmPath taken;
      const auto y = run_gpu(d->v, xd.as<float>(), n, nout, o, p, &taken);
      check_vs_cpu(base + strf(" path=%s(taken %s)", path_name(p), path_name(taken)), ref, y, c.mode.Q, taken,
                   c.cols, B, c.out_bf16);
      if (p == GemmPath::simt) ys = y;
      if (p == GemmPath::small_m) ym = y;
      if (p == GemmPath::gemv && taken == GemmPath::gemv) {  // run to run: bitwise
        const auto y2 = run_gpu(d->v, xd.as<float>(), n, nout, o, p, nullptr);
        expect_bitwise("linear gemv determinism", base, y, y2);
      }
    }
    expect_bitwise("linear simt==small_m", base, ys, ym);
  }
}

const Mode kQ{"Q", true, false}, kD{"D", false, false}, kDw{"D+weight_as_bf16", false, true};
const Fmt kFp8{GemmFormat::fp8}, kFp4{GemmFormat::fp4}, kBf16{GemmFormat::bf16};
}  // namespace gm

TEST(CudaGemm, RealAttentionProjections) {
  DSV4_REQUIRE_GPU();
  // reference numerics: (Q) + bf16 output; dense: (D) fp32
  run_real({"wq_a", kFp8, 1024, 4096, kQ, true, 0, -1, {1, 2, 5, 64, 300}, true}, 11);
  run_real({"wq_a", kFp8, 1024, 4096, kD, false, 0, -1, {1, 2, 5, 8, 64, 300}, false}, 12);
  run_real({"wq_b", kFp8, 32768, 1024, kQ, true, 0, -1, {1, 5, 64, 300}, true}, 13);
  run_real({"wq_b", kFp8, 32768, 1024, kD, false, 0, -1, {1, 64}, false}, 14);
  run_real({"wkv", kFp8, 512, 4096, kQ, true, 0, -1, {1, 5, 64, 300}, true}, 15);
  run_real({"wo_b", kFp8, 4096, 8192, kQ, true, 0, -1, {1, 5, 64, 300}, true}, 16);
  run_real({"wo_b", kFp8, 4096, 8192, kD, false, 0, -1, {1, 64}, false}, 17);
  // the tensor-core decode kernel's persistent loop: more 16-row tiles than the GPU holds blocks at once (each block
  // takes several groups), and a tile count that leaves the last group of 2-slice tiles partial
  run_real({"wide", kFp8, 65536, 1024, kQ, true, 0, -1, {1, 5, 8}, true}, 18);
  run_real({"odd_tiles", kFp8, 16480, 2048, kQ, true, 0, -1, {1, 3, 8}, true}, 19);
}

TEST(CudaGemm, RealWoAGroupsWeightAsBf16) {
  DSV4_REQUIRE_GPU();
  // reference wo_a: FP8 weight dequantized to bf16, bf16 activations, no act quant, bf16 output; one group of
  // o_lora_rank = 1024 rows at a time (first and last group)
  run_real({"wo_a.g0", kFp8, 8192, 4096, kDw, true, 0, 1024, {1, 3, 5, 64, 300}, true}, 21);
  run_real({"wo_a.g7", kFp8, 8192, 4096, kDw, true, 7168, 8192, {1, 64}, true}, 21);
  run_real({"wo_a.g3", kFp8, 8192, 4096, kD, false, 3072, 4096, {1, 64}, false}, 22);
}

TEST(CudaGemm, RealExperts) {
  DSV4_REQUIRE_GPU();
  run_real({"shared.w1", kFp8, 2048, 4096, kQ, true, 0, -1, {1, 64, 300}, true}, 31);
  run_real({"shared.w2", kFp8, 4096, 2048, kQ, true, 0, -1, {1, 64, 300}, true}, 32);
  run_real({"expert.w1", kFp4, 2048, 4096, kQ, true, 0, -1, {1, 5, 64}, true}, 33);
  run_real({"expert.w1", kFp4, 2048, 4096, kD, false, 0, -1, {1, 5, 64}, false}, 34);
  run_real({"expert.w2", kFp4, 4096, 2048, kD, false, 0, -1, {1, 2, 64}, false}, 36);
  run_real({"expert.w2", kFp4, 4096, 2048, kQ, true, 0, -1, {1, 5, 64}, true}, 35);
}

TEST(CudaGemm, RealBf16HeadCompressorGate) {
  DSV4_REQUIRE_GPU();
  run_real({"gate", kBf16, 256, 4096, kD, false, 0, -1, {1, 2, 5, 8, 64, 300}, true}, 41);
  run_real({"compressor", kBf16, 1024, 4096, kD, false, 0, -1, {1, 5, 64, 300}, true}, 42);
  run_real({"head", kBf16, 129280, 4096, kD, false, 0, -1, {1, 5, 16}, true}, 43);  // 1 GB weight, 64-bit offsets
  run_real({"weights_proj", kBf16, 64, 4096, kD, true, 0, -1, {9, 64}, true}, 44);   // bf16 output
  run_real({"gate.dense", kBf16, 256, 4096, kD, false, 0, -1, {64}, false}, 45);     // fp32 x: never cuBLAS BF16
}

// Which kernel a BF16-weight linear of more than 8 tokens takes: cuBLAS BF16 with bf16-valued x (x_bf16), in the
// automatic path of the fast mode only; a row subrange starts at its row.
TEST(CudaGemm, LinearBf16PathSelection) {
  DSV4_REQUIRE_GPU();
  const HostWeight h = make_weight(kBf16, 512, 1024, 46);
  const auto d = upload(h);
  const double u = std::ldexp(1.0, -24);
  for (const int64_t n : {8, 9, 40, 128}) {
    const std::vector<float> x = make_x(n, 1024, 4600 + n, true);
    const Buffer xd = to_device(*cuda(), x);
    LinearOpts xb;
    xb.x_bf16 = true;
    xb.row_begin = 128;
    xb.row_end = 384;
    LinearOpts plain = xb;
    plain.x_bf16 = false;
    GemmPath t_xb, t_plain, t_det;
    const auto y = run_gpu(d->v, xd.as<float>(), n, 256, xb, GemmPath::auto_, &t_xb);
    run_gpu(d->v, xd.as<float>(), n, 256, plain, GemmPath::auto_, &t_plain);
    cuda::set_deterministic(true);
    const auto yd = run_gpu(d->v, xd.as<float>(), n, 256, xb, GemmPath::auto_, &t_det);
    cuda::set_deterministic(false);
    const GemmPath want = n <= 8 ? GemmPath::gemv : GemmPath::cublaslt;
    std::printf("[linear] bf16 weight n_tok=%lld: x_bf16 %s (want %s), fp32 x %s, deterministic %s\n", (long long)n,
                path_name(t_xb), path_name(want), path_name(t_plain), path_name(t_det));
    EXPECT_EQ(t_xb, want) << "n_tok " << n;
    EXPECT_EQ(t_plain, n <= 8 ? GemmPath::gemv : GemmPath::simt) << "n_tok " << n;
    EXPECT_EQ(t_det, n <= 8 ? GemmPath::small_m : GemmPath::simt) << "n_tok " << n;
    const std::vector<float> ref = run_cpu(h, x, n, 256, xb);
    expect_bitwise("linear", strf("bf16 512x1024 rows[128,384) n_tok=%lld deterministic", (long long)n), ref, yd);
    expect_close("linear", strf("bf16 512x1024 rows[128,384) n_tok=%lld x_bf16 auto (%s)", (long long)n,
                                path_name(t_xb)),
                 ref, y, std::max(std::ldexp(1.0, -11), 1024.0 * u) * max_row_norm_x(x, n, 1024) *
                             max_row_norm_w(h.view, 128, 384), 0.0);
  }
}

// wo_a in the fast mode: 8 groups of [1024, 4096] FP8 (E8M0 scales) on linear_grouped's f16 tensor-core kernel.
TEST(CudaGemm, GroupedWoATensorCores) {
  DSV4_REQUIRE_GPU();
  const int64_t G = 8, R = 1024, K = 4096;
  const HostWeight h = make_weight(kFp8, G * R, K, 31);
  const auto d = upload(h);
  LinearOpts o;
  o.weight_as_bf16 = true;
  o.out_bf16 = true;
  PathScope ps(GemmPath::auto_);
  const double Bw = max_row_norm_w(h.view, 0, G * R), u = std::ldexp(1.0, -24);
  auto run = [&](const std::vector<float>& x, int64_t n) {
    const Buffer xd = to_device(*cuda(), x);
    EXPECT_TRUE(cuda::linear_grouped_tc(d->v, n, G, xd.as<float>(), o)) << "n_tok " << n;
    Buffer yd = out_buffer<float>(*cuda(), size_t(G * n * R));
    gops().linear_grouped(d->v, xd.as<float>(), n, G, yd.as<float>(), o);
    return to_host<float>(*cuda(), yd, size_t(G * n * R));
  };
  std::vector<float> x8;
  for (const int64_t n : {1, 3, 8}) {
    const std::vector<float> x = make_x(G * n, K, 500 + n, true);  // [G, n, K]
    std::vector<float> ref(size_t(G * n * R));
    cops().linear_grouped(h.view, x.data(), n, G, ref.data(), o);
    const std::string base = strf("wo_a 8 x [1024, 4096] fp8/e8m0 n_tok=%lld D+weight_as_bf16 out_bf16", (long long)n);
    const auto y = run(x, n);
    expect_close("linear_grouped", base + " (f16 tensor cores)", ref, y,
                 std::max(std::ldexp(1.0, -11), double(K) * u) * max_row_norm_x(x, G * n, K) * Bw, std::ldexp(1.0, -7));
    expect_bitwise("linear_grouped determinism", base, y, run(x, n));
    if (n == 8) {  // token t of the 8-token call == alone
      const auto y8 = y;
      for (const int64_t t : {int64_t(0), int64_t(6)}) {
        std::vector<float> xt, y8t;
        for (int64_t g = 0; g < G; ++g) {
          xt.insert(xt.end(), x.begin() + (g * n + t) * K, x.begin() + (g * n + t + 1) * K);
          y8t.insert(y8t.end(), y8.begin() + (g * n + t) * R, y8.begin() + (g * n + t + 1) * R);
        }
        expect_bitwise("linear_grouped batch invariance", strf("wo_a token %lld of 8 vs alone", (long long)t), y8t,
                       run(xt, 1));
      }
    }
  }
  // not taken: dense numerics (no weight_as_bf16: fp32 activations), 9 tokens
  const Buffer xd = to_device(*cuda(), make_x(G * 9, K, 77, true));
  LinearOpts od;
  EXPECT_FALSE(cuda::linear_grouped_tc(d->v, 1, G, xd.as<float>(), od));
  EXPECT_FALSE(cuda::linear_grouped_tc(d->v, 9, G, xd.as<float>(), o));
}

// wo_a of more than 8 tokens (fast mode): bf16(dequantized FP8) x bf16 activations on a cuBLAS BF16 strided-batched
// GEMM (k_bf16_tc.cu) vs the CPU: the same tolerance as the f16 decode kernel; deterministic.
TEST(CudaGemm, GroupedWoAPrefillBf16TensorCores) {
  DSV4_REQUIRE_GPU();
  const int64_t G = 8, R = 1024, K = 4096;
  const HostWeight h = make_weight(kFp8, G * R, K, 33);
  const auto d = upload(h);
  LinearOpts o;
  o.weight_as_bf16 = true;
  o.out_bf16 = true;
  PathScope ps(GemmPath::auto_);
  const double Bw = max_row_norm_w(h.view, 0, G * R), u = std::ldexp(1.0, -24);
  for (const int64_t n : {9, 32, 128, 256, 300}) {
    const std::vector<float> x = make_x(G * n, K, 700 + n, true);  // [G, n, K], bf16 values
    std::vector<float> ref(size_t(G * n * R));
    cops().linear_grouped(h.view, x.data(), n, G, ref.data(), o);
    auto run = [&]() {
      const Buffer xd = to_device(*cuda(), x);
      Buffer yd = out_buffer<float>(*cuda(), size_t(G * n * R));
      gops().linear_grouped(d->v, xd.as<float>(), n, G, yd.as<float>(), o);
      EXPECT_EQ(cuda::last_gemm_path(), GemmPath::cublaslt) << "n_tok " << n << ": not on the BF16 GEMM";
      return to_host<float>(*cuda(), yd, size_t(G * n * R));
    };
    const std::string base = strf("wo_a 8 x [1024, 4096] fp8/e8m0 n_tok=%lld weight_as_bf16 out_bf16", (long long)n);
    const auto y = run();
    expect_close("linear_grouped", base + " (cuBLAS bf16)", ref, y,
                 std::max(std::ldexp(1.0, -11), double(K) * u) * max_row_norm_x(x, G * n, K) * Bw, std::ldexp(1.0, -7));
    expect_bitwise("linear_grouped determinism", base + " (cuBLAS bf16)", y, run());
  }
}

// The shared expert's w1 and w3 in one tensor-core launch (cuda::linear_pair, (Q), 1..8 tokens) vs the CPU's two
// linears: the gemv tolerance; each output == its linear() on the GPU and token t of an 8-token call == alone,
// bitwise.
TEST(CudaGemm, LinearPairSharedExpert) {
  DSV4_REQUIRE_GPU();
  const int64_t N = 2048, K = 4096;
  const HostWeight h1 = make_weight(kFp8, N, K, 41), h3 = make_weight(kFp8, N, K, 42);
  const auto d1 = upload(h1), d3 = upload(h3);
  LinearOpts o;
  o.act_quant_fp8 = true;
  o.out_bf16 = true;
  PathScope ps(GemmPath::auto_);
  const double B1 = max_row_norm_w(h1.view, 0, N), B3 = max_row_norm_w(h3.view, 0, N), u = std::ldexp(1.0, -24);
  auto run = [&](const std::vector<float>& x, int64_t n) {
    const Buffer xd = to_device(*cuda(), x);
    Buffer y1 = out_buffer<float>(*cuda(), size_t(n * N)), y3 = out_buffer<float>(*cuda(), size_t(n * N));
    Buffer scratch(*cuda(), cuda::linear_scratch_bytes(d1->v, n, o) + 256, "scratch");
    cuda::linear_pair(d1->v, d3->v, xd.as<float>(), n, y1.as<float>(), y3.as<float>(), o, scratch.data(),
                      static_cast<cuda::CudaBackend*>(cuda())->stream());
    EXPECT_EQ(cuda::last_gemm_path(), GemmPath::gemv);
    return std::make_pair(to_host<float>(*cuda(), y1, size_t(n * N)), to_host<float>(*cuda(), y3, size_t(n * N)));
  };
  std::vector<float> x8;
  for (const int64_t n : {1, 3, 8}) {
    const std::vector<float> x = make_x(n, K, 600 + n, true);
    const double Bx = max_row_norm_x(x, n, K) * 1.1;
    const auto [y1, y3] = run(x, n);
    const std::string base = strf("shared w1|w3 2048x4096 fp8/e8m0 n_tok=%lld Q out_bf16 (linear_pair)", (long long)n);
    expect_close("linear_pair", base + " w1", run_cpu(h1, x, n, N, o), y1, 2.0 * double(K) * u * Bx * B1,
                 std::ldexp(1.0, -7));
    expect_close("linear_pair", base + " w3", run_cpu(h3, x, n, N, o), y3, 2.0 * double(K) * u * Bx * B3,
                 std::ldexp(1.0, -7));
    {  // each output bitwise its own linear() (the same K slices)
      const Buffer xd = to_device(*cuda(), x);
      expect_bitwise("linear_pair", base + " w1 vs linear()",
                     run_gpu(d1->v, xd.as<float>(), n, N, o, GemmPath::auto_, nullptr), y1);
      expect_bitwise("linear_pair", base + " w3 vs linear()",
                     run_gpu(d3->v, xd.as<float>(), n, N, o, GemmPath::auto_, nullptr), y3);
    }
    if (n == 8) {
      for (const int64_t t : {int64_t(0), int64_t(5)}) {
        const std::vector<float> xt(x.begin() + t * K, x.begin() + (t + 1) * K);
        const auto [a1, a3] = run(xt, 1);
        expect_bitwise("linear_pair batch invariance", strf("w1 token %lld of 8 vs alone", (long long)t),
                       rows_of(y1, t, 1, N), a1);
        expect_bitwise("linear_pair batch invariance", strf("w3 token %lld of 8 vs alone", (long long)t),
                       rows_of(y3, t, 1, N), a3);
      }
    }
  }
}

// Ops::linear_pair at attention's wq_a [1024, 4096] and wkv [512, 4096] (FP8 e8m0, (Q), 1..8 tokens): one
// tensor-core launch (cuda::linear_pair) whose outputs are bitwise what two linear() calls give in the fast mode,
// within the gemv tolerance of the CPU, and bitwise the CPU's in the deterministic mode. A pair whose matrices would
// take different K slices alone (8192 rows: 4, 512 rows: 8) runs as the two linears: bitwise again.
TEST(CudaGemm, LinearPairWqAWkv) {
  DSV4_REQUIRE_GPU();
  const int64_t K = 4096;
  LinearOpts o;
  o.act_quant_fp8 = true;
  o.out_bf16 = true;
  const double u = std::ldexp(1.0, -24);
  for (const auto& shape : {std::pair<int64_t, int64_t>{1024, 512}, std::pair<int64_t, int64_t>{8192, 512}}) {
    const int64_t Na = shape.first, Nb = shape.second;
    const HostWeight ha = make_weight(kFp8, Na, K, 51), hb = make_weight(kFp8, Nb, K, 52);
    const auto da = upload(ha), db = upload(hb);
    const double Ba = max_row_norm_w(ha.view, 0, Na), Bb = max_row_norm_w(hb.view, 0, Nb);
    PathScope ps(GemmPath::auto_);
    for (const int64_t n : {1, 2, 5, 8}) {
      const std::vector<float> x = make_x(n, K, 640 + n, true);
      const Buffer xd = to_device(*cuda(), x);
      auto pair = [&]() {
        Buffer ya = out_buffer<float>(*cuda(), size_t(n * Na)), yb = out_buffer<float>(*cuda(), size_t(n * Nb));
        gops().linear_pair(da->v, db->v, xd.as<float>(), n, ya.as<float>(), yb.as<float>(), o);
        return std::make_pair(to_host<float>(*cuda(), ya, size_t(n * Na)), to_host<float>(*cuda(), yb, size_t(n * Nb)));
      };
      const std::string base = strf("[%lld|%lld, 4096] fp8/e8m0 n_tok=%lld Q out_bf16", (long long)Na, (long long)Nb,
                                    (long long)n);
      const auto [ya, yb] = pair();
      EXPECT_EQ(cuda::last_gemm_path(), GemmPath::gemv) << base;
      expect_bitwise("linear_pair", base + " a vs linear()", run_gpu(da->v, xd.as<float>(), n, Na, o,
                                                                     GemmPath::auto_, nullptr), ya);
      expect_bitwise("linear_pair", base + " b vs linear()", run_gpu(db->v, xd.as<float>(), n, Nb, o,
                                                                     GemmPath::auto_, nullptr), yb);
      const double Bx = max_row_norm_x(x, n, K) * 1.1;
      const std::vector<float> ra = run_cpu(ha, x, n, Na, o), rb = run_cpu(hb, x, n, Nb, o);
      expect_close("linear_pair", base + " a vs CPU", ra, ya, 2.0 * double(K) * u * Bx * Ba, std::ldexp(1.0, -7));
      expect_close("linear_pair", base + " b vs CPU", rb, yb, 2.0 * double(K) * u * Bx * Bb, std::ldexp(1.0, -7));
      cuda::set_deterministic(true);
      const auto [da_y, db_y] = pair();
      cuda::set_deterministic(false);
      expect_bitwise("linear_pair", base + " a deterministic vs CPU", ra, da_y);
      expect_bitwise("linear_pair", base + " b deterministic vs CPU", rb, db_y);
    }
  }
}

// ---- batch invariance ----------------------------------------------------------------------------------------------
TEST(CudaGemm, BatchInvariance) {
  DSV4_REQUIRE_GPU();
  struct C {
    const char* name;
    Fmt fmt;
    int64_t rows, cols;
    Mode mode;
    bool out_bf16;
    int64_t r0, r1;
  };
  const C cases[] = {{"wq_a", kFp8, 1024, 4096, kQ, true, 0, -1},
                     {"wq_a", kFp8, 1024, 4096, kD, false, 0, -1},
                     {"expert.w1", kFp4, 2048, 4096, kQ, true, 0, -1},
                     {"expert.w1", kFp4, 2048, 4096, kD, false, 0, -1},
                     {"gate", kBf16, 256, 4096, kD, false, 0, -1},
                     {"wo_a.g1", kFp8, 8192, 4096, kDw, true, 1024, 2048},
                     {"wo_b", kFp8, 4096, 8192, kQ, true, 0, -1},
                     {"odd_tiles", kFp8, 16480, 2048, kQ, true, 0, -1}};
  const int64_t N = 300, rows_checked[] = {0, 137, 299};
  uint64_t seed = 900;
  for (const C& c : cases) {
    const HostWeight h = make_weight(c.fmt, c.rows, c.cols, seed++);
    const auto d = upload(h);
    LinearOpts o;
    o.act_quant_fp8 = c.mode.Q;
    o.weight_as_bf16 = c.mode.wbf16;
    o.out_bf16 = c.out_bf16;
    o.row_begin = c.r0;
    o.row_end = c.r1;
    const int64_t nout = (c.r1 < 0 ? c.rows : c.r1) - c.r0;
    const std::vector<float> x = make_x(N, c.cols, seed++, true);
    const Buffer xd = to_device(*cuda(), x);
    for (const GemmPath p : {GemmPath::simt, GemmPath::small_m}) {
      const auto y = run_gpu(d->v, xd.as<float>(), N, nout, o, p, nullptr);
      for (const int64_t t : rows_checked) {
        const auto y1 = run_gpu(d->v, xd.as<float>() + t * c.cols, 1, nout, o, p, nullptr);
        expect_bitwise("linear batch invariance",
                       strf("%s %s %s path=%s: row %lld of %lld tokens vs alone", c.name, fmt_name(c.fmt).c_str(),
                            c.mode.name, path_name(p), (long long)t, (long long)N),
                       rows_of(y, t, 1, nout), y1);
      }
    }
    {  // gemv: row t of an 8-token call == the same token alone (the kernel's order depends on the shape only)
      const auto y8 = run_gpu(d->v, xd.as<float>(), 8, nout, o, GemmPath::gemv, nullptr);
      for (const int64_t t : {int64_t(0), int64_t(3), int64_t(7)}) {
        GemmPath tk;
        const auto y1 = run_gpu(d->v, xd.as<float>() + t * c.cols, 1, nout, o, GemmPath::gemv, &tk);
        EXPECT_EQ(tk, GemmPath::gemv) << c.name;
        expect_bitwise("linear batch invariance",
                       strf("%s %s %s path=gemv: row %lld of 8 tokens vs alone", c.name, fmt_name(c.fmt).c_str(),
                            c.mode.name, (long long)t),
                       rows_of(y8, t, 1, nout), y1);
      }
      for (const int64_t m : {int64_t(2), int64_t(5)}) {  // and of 2- and 5-token calls (other tokens per pass)
        const auto ym = run_gpu(d->v, xd.as<float>(), m, nout, o, GemmPath::gemv, nullptr);
        expect_bitwise("linear batch invariance",
                       strf("%s %s %s path=gemv: rows 0..%lld of %lld tokens vs of 8", c.name,
                            fmt_name(c.fmt).c_str(), c.mode.name, (long long)m - 1, (long long)m),
                       rows_of(y8, 0, m, nout), ym);
      }
    }
    if (c.mode.Q && c.fmt.f == GemmFormat::fp8) {
      // the automatic path of 1..8 tokens (the tensor-core decode kernel): row t of an 8-token call == alone
      const auto y8 = run_gpu(d->v, xd.as<float>(), 8, nout, o, GemmPath::auto_, nullptr);
      for (const int64_t t : {int64_t(0), int64_t(5), int64_t(7)}) {
        GemmPath tk;
        const auto y1 = run_gpu(d->v, xd.as<float>() + t * c.cols, 1, nout, o, GemmPath::auto_, &tk);
        EXPECT_EQ(tk, GemmPath::gemv) << c.name;
        expect_bitwise("linear batch invariance",
                       strf("%s %s %s path=auto: row %lld of 8 tokens vs alone", c.name, fmt_name(c.fmt).c_str(),
                            c.mode.name, (long long)t),
                       rows_of(y8, t, 1, nout), y1);
      }
      const auto y3 = run_gpu(d->v, xd.as<float>(), 3, nout, o, GemmPath::auto_, nullptr);
      expect_bitwise("linear batch invariance",
                     strf("%s %s %s path=auto: rows 0..2 of 3 tokens vs of 8", c.name, fmt_name(c.fmt).c_str(),
                          c.mode.name),
                     rows_of(y8, 0, 3, nout), y3);
    }
    if (c.mode.Q && c.fmt.f == GemmFormat::fp8) {
      // cuBLASLt: deterministic for one shape (checked in LinearCublasLtSmallShapes); across n_tok only reported.
      GemmPath t300, t64;
      const auto y300 = run_gpu(d->v, xd.as<float>(), N, nout, o, GemmPath::cublaslt, &t300);
      const auto y64 = run_gpu(d->v, xd.as<float>() + 100 * c.cols, 64, nout, o, GemmPath::cublaslt, &t64);
      const auto a = rows_of(y300, 100, 64, nout);
      int64_t nd = 0;
      double md = 0;
      for (size_t i = 0; i < a.size(); ++i)
        if (fbits(a[i]) != fbits(y64[i])) ++nd, md = std::max(md, double(std::fabs(a[i] - y64[i])));
      std::printf("[linear cublaslt n_tok dependence] %s: rows 100..163 of 300 tokens (%s) vs a 64-token call (%s): "
                  "%lld/%zu elements differ, max_abs %.3g (informational, not asserted)\n",
                  c.name, path_name(t300), path_name(t64), (long long)nd, a.size(), md);
    }
  }
}

}  // namespace
}  // namespace dsv4::test::gpu
