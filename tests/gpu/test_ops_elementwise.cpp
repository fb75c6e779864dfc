// CUDA vs CPU: the elementwise, row and hyper-connection ops (src/backend/cuda/k_elementwise.cu, k_hc.cu) against
// CpuOps, at tiny and real V4-Flash shapes, both numerics where the op has the flag. One printed line per check.
//
// Checks:
// * BITWISE (every element's bits equal): fill, round_bf16, scale, embed, gather/scatter/add_rows, rope, fp8_sim,
//   fp4_sim, hadamard, check_finite, swiglu, hc_pre, hc_head, hc_post, and CUDA batch invariance (row t of an
//   n-token call equals the same row of a smaller call). These ops are the same IEEE operations in the same order on
//   both sides (exp: glibc's expf on both).
// * ULP checks (expect_ulps: elements whose bits differ are "flips"; each flip must be within N ulps of the output
//   format at that value, and the fraction of flips is bounded): rmsnorm, head_rms (sum of squares in a different
//   order).
#include <cstdarg>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "backend/cuda/gemm_path.h"
#include "gpu_modes.h"
#include "gpu_test_util.h"

namespace dsv4::test::gpu {
namespace {
// Own helpers in a nested namespace: names added to gpu_test_util.h later are hidden here, never ambiguous.
namespace ew {

const Ops& cops() { return cpu().ops(); }
const Ops& gops() { return cuda()->ops(); }
Backend& dev() { return *cuda(); }

const char* num(bool bf16) { return bf16 ? "reference" : "dense"; }

constexpr int64_t kNTok[] = {1, 7, 300};

uint32_t fbits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float bitsf(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// ---- comparisons -------------------------------------------------------------------------------------------------
template <class T>
uint32_t raw_bits(T v) {
  if constexpr (std::is_same_v<T, float>) return fbits(v);
  else return uint32_t(v);
}

// Every element bitwise equal; prints the count of differing elements.
template <class T>
void expect_bitwise(const std::string& op, const std::string& shape, const std::vector<T>& ref,
                    const std::vector<T>& got) {
  const size_t n = std::min(ref.size(), got.size());
  int64_t nd = 0, first = -1;
  for (size_t i = 0; i < n; ++i)
    if (raw_bits(ref[i]) != raw_bits(got[i])) {
      if (first < 0) first = int64_t(i);
      ++nd;
    }
  const bool ok = nd == 0 && ref.size() == got.size();
  std::printf("[%s] %s: bitwise, %lld/%zu elements differ %s\n", op.c_str(), shape.c_str(), (long long)nd, n,
              ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  if (!ok) {
    if (first < 0) {
      ADD_FAILURE() << op << " " << shape << ": size " << got.size() << " != " << ref.size();
      return;
    }
    const size_t i = size_t(first);
    ADD_FAILURE() << op << " " << shape << ": " << nd << " of " << n << " elements differ bitwise; first at " << i
                  << ": ref " << double(ref[i]) << " (0x" << std::hex << raw_bits(ref[i]) << ") got "
                  << double(got[i]) << " (0x" << raw_bits(got[i]) << std::dec << ")";
  }
}

// One ulp of the output format (bf16: 8 significant bits, fp32: 24) at magnitude a (subnormals: the fixed spacing).
double ulp_of(double a, bool bf16) {
  a = std::abs(a);
  int e = -125;
  if (a != 0) std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int ex = std::max(e - 1, -126);
  return std::ldexp(1.0, ex - (bf16 ? 7 : 23));
}

// Outputs equal up to rounding noise. A "flip" is an element whose bits differ; each flip must be within max_ulp
// ulps of the output format at max(|ref|, |got|) or within atol, and at most max_frac of the elements may flip.
void expect_ulps(const std::string& op, const std::string& shape, const std::vector<float>& ref,
                 const std::vector<float>& got, bool bf16_out, double max_ulp, double max_frac, double atol = 0.0) {
  const size_t n = std::min(ref.size(), got.size());
  int64_t flips = 0, bad = 0, first_bad = -1;
  double worst_ulp = 0, worst_abs = 0;
  for (size_t i = 0; i < n; ++i) {
    if (fbits(ref[i]) == fbits(got[i])) continue;
    ++flips;
    const double r = ref[i], g = got[i], d = std::abs(r - g);
    const double u = d / ulp_of(std::max(std::abs(r), std::abs(g)), bf16_out);
    const bool ok = std::isfinite(d) && (u <= max_ulp || d <= atol);
    if (std::isfinite(d)) {
      worst_ulp = std::max(worst_ulp, u);
      worst_abs = std::max(worst_abs, d);
    }
    if (!ok) {
      if (first_bad < 0) first_bad = int64_t(i);
      ++bad;
    }
  }
  const double frac = n ? double(flips) / double(n) : 0.0;
  const bool ok = bad == 0 && frac <= max_frac && ref.size() == got.size();
  std::printf("[%s] %s: %s flips %lld/%zu (%.3g%%), max %.3g ulp, max_abs %.3g (tol <= %.3g ulp or <= %.1g abs, "
              "<= %.3g%% flips) %s\n",
              op.c_str(), shape.c_str(), bf16_out ? "bf16" : "fp32", (long long)flips, n, 100.0 * frac, worst_ulp,
              worst_abs, max_ulp, atol, 100.0 * max_frac, ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  if (!ok) {
    ADD_FAILURE() << op << " " << shape << ": " << flips << " flips (" << 100.0 * frac << "%, bound "
                  << 100.0 * max_frac << "%), " << bad << " outside the ulp bound"
                  << (first_bad >= 0 ? strf("; first at %lld: ref %.9g got %.9g", (long long)first_bad,
                                            double(ref[size_t(first_bad)]), double(got[size_t(first_bad)]))
                                     : std::string());
  }
}

// ---- inputs ------------------------------------------------------------------------------------------------------
std::vector<int32_t> randi(size_t n, uint32_t seed, int32_t lo, int32_t hi) {  // uniform in [lo, hi]
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
// The first n of a random permutation of [0, m) (distinct).
std::vector<int32_t> distinct(size_t n, int32_t m, uint32_t seed) {
  std::vector<int32_t> p(static_cast<size_t>(m));
  for (int32_t i = 0; i < m; ++i) p[size_t(i)] = i;
  std::mt19937 rng(seed);
  std::shuffle(p.begin(), p.end(), rng);
  p.resize(n);
  return p;
}
uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Runs `gpu_op(ptr)` on a device copy of x (in place) and returns the result.
template <class F>
std::vector<float> on_gpu_inplace(const std::vector<float>& x, F&& gpu_op) {
  Buffer b = to_device(dev(), x);
  gpu_op(b.as<float>());
  return to_host<float>(dev(), b, x.size());
}

// ---- fill / round / scale ----------------------------------------------------------------------------------------
TEST(GpuOpsElementwise, Fill) {
  DSV4_REQUIRE_GPU();
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(300) * 4096 + 3}) {
    for (float value : {3.25f, -0.0f}) {
      std::vector<float> ref(size_t(n), 1.0f);
      cops().fill(ref.data(), n, value);
      Buffer b = out_buffer<float>(dev(), size_t(n));
      gops().fill(b.as<float>(), n, value);
      expect_bitwise("fill", strf("n=%lld value=%g", (long long)n, value), ref, to_host<float>(dev(), b, size_t(n)));
    }
  }
}

// Inputs with the rounding corner cases of bf16: ties (low half 0x8000) with even and odd kept bits, values just
// above / below a tie, carries into the exponent, subnormals, +-0, +-inf, the largest finite values, and (with_nan)
// NaNs with payloads. Arithmetic on a NaN returns the canonical NaN on the GPU but keeps the payload on x86, so NaNs
// are only fed to round_bf16 (no arithmetic).
std::vector<float> bf16_corner_values(size_t n, uint32_t seed, bool with_nan) {
  std::vector<float> v = randn(n, seed, 3.0f);
  const uint32_t special[] = {0x3F808000u, 0x3F818000u, 0x3F808001u, 0x3F807FFFu, 0x3FFF8000u, 0x7F7FFFFFu,
                              0xFF7FFFFFu, 0x00000001u, 0x80008000u, 0x00018000u, 0x00000000u, 0x80000000u,
                              0x7F800000u, 0xFF800000u, 0x7F7F8000u, 0x7FC00000u, 0x7F800001u, 0xFFC12345u};
  const size_t n_special = sizeof special / sizeof special[0] - (with_nan ? 0 : 3);
  for (size_t i = 0; i < n; ++i)
    if (i % 7 == 3) v[i] = bitsf(special[(i / 7) % n_special]);
  return v;
}

TEST(GpuOpsElementwise, RoundBf16) {
  DSV4_REQUIRE_GPU();
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(300) * 4096}) {
    const auto x = bf16_corner_values(size_t(n), 11 + uint32_t(n), true);
    auto ref = x;
    cops().round_bf16(ref.data(), n);
    const auto got = on_gpu_inplace(x, [&](float* p) { gops().round_bf16(p, n); });
    expect_bitwise("round_bf16", strf("n=%lld (corner values incl. NaN payloads)", (long long)n), ref, got);
  }
}

TEST(GpuOpsElementwise, Scale) {
  DSV4_REQUIRE_GPU();
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(300) * 4096}) {
    for (bool bf16 : {false, true}) {
      const auto x = bf16_corner_values(size_t(n), 21 + uint32_t(n), false);
      const float alpha = 0.08838834764831845f;  // 128^-0.5
      auto ref = x;
      cops().scale(ref.data(), n, alpha, bf16);
      const auto got = on_gpu_inplace(x, [&](float* p) { gops().scale(p, n, alpha, bf16); });
      expect_bitwise("scale", strf("n=%lld alpha=%.6g %s", (long long)n, alpha, num(bf16)), ref, got);
    }
  }
}

// ---- embed -------------------------------------------------------------------------------------------------------
TEST(GpuOpsElementwise, Embed) {
  DSV4_REQUIRE_GPU();
  struct Case {
    GemmFormat fmt;
    int64_t vocab, dim;
  };
  // Real: the BF16 embedding table 129280 x 4096 (1 GB; random bit patterns incl. NaN/inf codes: embed is a pure
  // widening on both sides); an F32 table; tiny-a (bf16) and tiny-b (f32) shapes.
  const Case cases[] = {{GemmFormat::bf16, 129280, 4096}, {GemmFormat::f32, 1000, 4096}, {GemmFormat::bf16, 256, 128},
                        {GemmFormat::f32, 200, 96}};
  uint32_t seed = 100;
  for (const Case& c : cases) {
    const int64_t esz = c.fmt == GemmFormat::bf16 ? 2 : 4;
    std::vector<uint8_t> host(size_t(c.vocab * c.dim * esz));
    uint64_t st = seed++;
    for (size_t i = 0; i + 8 <= host.size(); i += 8) {
      const uint64_t r = splitmix64(st);
      std::memcpy(&host[i], &r, 8);
    }
    if (c.fmt == GemmFormat::f32)  // f32: finite normal values (the CPU memcpy and the GPU load are both exact anyway)
      for (size_t i = 0; i < host.size(); i += 4) {
        uint32_t b;
        std::memcpy(&b, &host[i], 4);
        b = (b & 0x807FFFFFu) | (uint32_t(1 + (b >> 23) % 250) << 23);
        std::memcpy(&host[i], &b, 4);
      }
    WeightView hv;
    hv.fmt = c.fmt;
    hv.rows = c.vocab;
    hv.cols = c.dim;
    hv.w = host.data();
    Buffer tb = dev().upload_bytes(host.data(), host.size(), "embed table");
    WeightView dv = hv;
    dv.w = tb.as<uint8_t>();
    for (int64_t n_tok : kNTok) {
      auto ids = randi(size_t(n_tok), seed++, 0, int32_t(c.vocab - 1));
      ids[0] = int32_t(c.vocab - 1);  // the last row (largest offset)
      if (n_tok > 1) ids[1] = 0;
      Buffer di = to_device(dev(), ids);
      for (int copies : {1, 4}) {
        const size_t n_out = size_t(n_tok * copies * c.dim);
        std::vector<float> ref(n_out);
        cops().embed(hv, ids.data(), n_tok, copies, ref.data());
        Buffer out = out_buffer<float>(dev(), n_out);
        gops().embed(dv, di.as<int32_t>(), n_tok, copies, out.as<float>());
        expect_bitwise("embed",
                       strf("%s vocab=%lld dim=%lld n_tok=%lld copies=%d", c.fmt == GemmFormat::bf16 ? "bf16" : "f32",
                            (long long)c.vocab, (long long)c.dim, (long long)n_tok, copies),
                       ref, to_host<float>(dev(), out, n_out));
      }
    }
  }
}

// ---- rows --------------------------------------------------------------------------------------------------------
// dim 512: the float4 path; dim 130: the scalar path; "misaligned": a float4-able dim with an output offset by one
// float (scalar path chosen by alignment).
TEST(GpuOpsRows, GatherRows) {
  DSV4_REQUIRE_GPU();
  for (int64_t dim : {int64_t(512), int64_t(130)}) {
    for (bool misaligned : {false, true}) {
      if (misaligned && dim % 4 != 0) continue;
      for (int64_t n : kNTok) {
        const int64_t n_a = 50, n_b = 400;
        const auto a = randn(size_t(n_a * dim), 1 + uint32_t(n), 1.0f);
        const auto b = randn(size_t(n_b * dim), 2 + uint32_t(n), 1.0f);
        auto idx = randi(size_t(n), 3 + uint32_t(n), 0, int32_t(n_a + n_b - 1));
        idx[0] = int32_t(n_a + n_b - 1);
        if (n > 1) idx[1] = int32_t(n_a - 1);
        if (n > 2) idx[2] = int32_t(n_a);
        std::vector<float> ref(size_t(n * dim));
        cops().gather_rows(a.data(), n_a, b.data(), idx.data(), n, dim, ref.data());
        Buffer da = to_device(dev(), a), db = to_device(dev(), b), di = to_device(dev(), idx);
        Buffer out = out_buffer<float>(dev(), size_t(n * dim) + 1);
        float* o = out.as<float>() + (misaligned ? 1 : 0);
        gops().gather_rows(da.as<float>(), n_a, db.as<float>(), di.as<int32_t>(), n, dim, o);
        expect_bitwise("gather_rows",
                       strf("n=%lld dim=%lld n_a=%lld n_b=%lld%s", (long long)n, (long long)dim, (long long)n_a,
                            (long long)n_b, misaligned ? " misaligned" : ""),
                       ref, to_host<float>(dev(), o, size_t(n * dim)));
      }
    }
  }
}

TEST(GpuOpsRows, ScatterRows) {
  DSV4_REQUIRE_GPU();
  for (int64_t dim : {int64_t(512), int64_t(130)}) {
    for (int64_t n : kNTok) {
      const int64_t n_src = 320, n_dst = 1000;
      const auto src = randn(size_t(n_src * dim), 4 + uint32_t(n), 1.0f);
      const auto dst0 = randn(size_t(n_dst * dim), 5 + uint32_t(n), 1.0f);
      const auto si = randi(size_t(n), 6 + uint32_t(n), 0, int32_t(n_src - 1));
      const auto di = distinct(size_t(n), int32_t(n_dst), 7 + uint32_t(n));
      auto ref = dst0;
      cops().scatter_rows(src.data(), si.data(), ref.data(), di.data(), n, dim);
      Buffer ds = to_device(dev(), src), dd = to_device(dev(), dst0), dsi = to_device(dev(), si),
             ddi = to_device(dev(), di);
      gops().scatter_rows(ds.as<float>(), dsi.as<int32_t>(), dd.as<float>(), ddi.as<int32_t>(), n, dim);
      expect_bitwise("scatter_rows", strf("n=%lld dim=%lld n_dst=%lld (whole dst)", (long long)n, (long long)dim,
                                          (long long)n_dst),
                     ref, to_host<float>(dev(), dd, dst0.size()));
    }
  }
}

TEST(GpuOpsRows, AddRows) {
  DSV4_REQUIRE_GPU();
  for (int64_t dim : {int64_t(4096), int64_t(130)}) {
    for (int64_t n : kNTok) {
      const int64_t n_table = 1000;
      const auto x = randn(size_t(n * dim), 8 + uint32_t(n), 1.0f);
      const auto table = randn(size_t(n_table * dim), 9 + uint32_t(n), 0.5f);
      const auto rows = randi(size_t(n), 10 + uint32_t(n), 0, int32_t(n_table - 1));
      auto ref = x;
      cops().add_rows(ref.data(), n, dim, table.data(), rows.data());
      Buffer dt = to_device(dev(), table), dr = to_device(dev(), rows);
      const auto got = on_gpu_inplace(x, [&](float* p) { gops().add_rows(p, n, dim, dt.as<float>(), dr.as<int32_t>()); });
      expect_bitwise("add_rows", strf("n=%lld dim=%lld", (long long)n, (long long)dim), ref, got);
    }
  }
}

// ---- rmsnorm / head_rms ------------------------------------------------------------------------------------------
// Tolerance: the sum of squares is accumulated in double on both sides (the products are exact), in a different
// order, so float(sum) differs only when it sits on an fp32 rounding boundary (~1e-8 per row). Bound: every flip
// within 2 ulps of the output format (a changed float(sum) moves s = 1/sqrt(var+eps) by <= 1 ulp, y by <= 2) and at
// most 0.1% of the elements (expected: 0).
TEST(GpuOpsRows, RmsNorm) {
  DSV4_REQUIRE_GPU();
  for (int64_t dim : {int64_t(4096), int64_t(1024), int64_t(512), int64_t(128), int64_t(96)}) {
    for (int64_t n : kNTok) {
      for (bool bf16 : {false, true}) {
        const auto x = randn(size_t(n * dim), 30 + uint32_t(dim + n), 2.0f, bf16);
        auto w = randn(size_t(dim), 31 + uint32_t(dim), 0.2f);
        for (auto& v : w) v = round_to_bf16(1.0f + v);  // norm weights are bf16 in the checkpoint
        for (bool with_w : {true, false}) {
          const float* wp = with_w ? w.data() : nullptr;
          std::vector<float> ref(x.size());
          cops().rmsnorm(x.data(), n, dim, wp, 1e-6f, bf16, ref.data());
          Buffer dx = to_device(dev(), x), dw = to_device(dev(), w);
          Buffer dy = out_buffer<float>(dev(), x.size());
          const float* dwp = with_w ? dw.as<float>() : nullptr;
          gops().rmsnorm(dx.as<float>(), n, dim, dwp, 1e-6f, bf16, dy.as<float>());
          const std::string sh =
              strf("n_rows=%lld dim=%lld w=%s %s", (long long)n, (long long)dim, with_w ? "yes" : "null", num(bf16));
          expect_ulps("rmsnorm", sh, ref, to_host<float>(dev(), dy, x.size()), bf16, 2, 1e-3);
          // y aliasing x
          gops().rmsnorm(dx.as<float>(), n, dim, dwp, 1e-6f, bf16, dx.as<float>());
          expect_ulps("rmsnorm", sh + " in-place", ref, to_host<float>(dev(), dx, x.size()), bf16, 2, 1e-3);
        }
      }
    }
  }
}

// bf16: the squares are bf16 values summed in double — exact unless the row spans > 45 binades — so the chain of
// bf16 roundings normally matches bitwise; fp32 as rmsnorm. Same bound as rmsnorm (expected: 0 flips).
TEST(GpuOpsRows, HeadRms) {
  DSV4_REQUIRE_GPU();
  for (int64_t n_tok : kNTok) {
    for (bool bf16 : {false, true}) {
      const int64_t heads = 64, dim = 512, n = n_tok * heads;
      const auto x = randn(size_t(n * dim), 40 + uint32_t(n_tok), 3.0f, bf16);
      auto ref = x;
      cops().head_rms(ref.data(), n, dim, 1e-6f, bf16);
      const auto got = on_gpu_inplace(x, [&](float* p) { gops().head_rms(p, n, dim, 1e-6f, bf16); });
      expect_ulps("head_rms", strf("n_tok=%lld heads=%lld dim=%lld %s", (long long)n_tok, (long long)heads,
                                   (long long)dim, num(bf16)),
                  ref, got, bf16, 2, 1e-3);
    }
  }
  for (bool bf16 : {false, true}) {  // tiny-a q: 2 heads x 128, and a row wider than one warp's path (2048)
    for (int64_t dim : {int64_t(128), int64_t(2048)}) {
      const int64_t n = 7 * 2;
      const auto x = randn(size_t(n * dim), 41 + uint32_t(dim), 3.0f, bf16);
      auto ref = x;
      cops().head_rms(ref.data(), n, dim, 1e-6f, bf16);
      const auto got = on_gpu_inplace(x, [&](float* p) { gops().head_rms(p, n, dim, 1e-6f, bf16); });
      expect_ulps("head_rms", strf("n_rows=%lld dim=%lld %s", (long long)n, (long long)dim, num(bf16)), ref, got,
                  bf16, 2, 1e-3);
    }
  }
}

// ---- rope --------------------------------------------------------------------------------------------------------
std::vector<float> rope_cos_sin(int64_t n_tok, int64_t rd, uint32_t seed) {
  const auto pos = randi(size_t(n_tok), seed, 0, 100000);
  std::vector<float> cs(size_t(n_tok * rd));
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t i = 0; i < rd / 2; ++i) {
      const double f = std::pow(10000.0, -2.0 * double(i) / double(rd));
      const float ang = float(double(pos[size_t(t)]) * f);
      cs[size_t(t * rd + 2 * i)] = std::cos(ang);
      cs[size_t(t * rd + 2 * i + 1)] = std::sin(ang);
    }
  return cs;
}

TEST(GpuOpsRows, Rope) {
  DSV4_REQUIRE_GPU();
  struct Case {
    int64_t heads, head_dim, rd;
  };
  const Case cases[] = {{64, 512, 64}, {1, 512, 64}, {2, 128, 64}};  // q, kv, tiny
  for (const Case& c : cases)
    for (int64_t n_tok : kNTok)
      for (bool inverse : {false, true})
        for (bool bf16 : {false, true}) {
          const auto x = randn(size_t(n_tok * c.heads * c.head_dim), 50 + uint32_t(n_tok + c.heads), 1.0f, bf16);
          const auto cs = rope_cos_sin(n_tok, c.rd, 51 + uint32_t(n_tok));
          auto ref = x;
          cops().rope(ref.data(), n_tok, c.heads, c.head_dim, c.rd, cs.data(), inverse, bf16);
          Buffer dcs = to_device(dev(), cs);
          const auto got = on_gpu_inplace(x, [&](float* p) {
            gops().rope(p, n_tok, c.heads, c.head_dim, c.rd, dcs.as<float>(), inverse, bf16);
          });
          expect_bitwise("rope",
                         strf("n_tok=%lld heads=%lld head_dim=%lld rd=%lld %s %s", (long long)n_tok,
                              (long long)c.heads, (long long)c.head_dim, (long long)c.rd,
                              inverse ? "inverse" : "forward", num(bf16)),
                         ref, got);
        }
}

// head_rms then rope in one kernel (Ops::head_rms_rope, the query after wq_b): bitwise the two ops on the GPU, for
// V4-Flash's query (64 heads x 512, rd 64), tiny-a's (2 x 128) and a head wider than one warp's path (2048).
TEST(GpuOpsRows, HeadRmsRope) {
  DSV4_REQUIRE_GPU();
  struct Case {
    int64_t heads, head_dim, rd;
  };
  const Case cases[] = {{64, 512, 64}, {2, 128, 64}, {2, 2048, 64}};
  for (const Case& c : cases)
    for (int64_t n_tok : kNTok)
      for (bool bf16 : {false, true}) {
        const auto x = randn(size_t(n_tok * c.heads * c.head_dim), 60 + uint32_t(n_tok + c.heads), 3.0f, bf16);
        const auto cs = rope_cos_sin(n_tok, c.rd, 61 + uint32_t(n_tok));
        Buffer dcs = to_device(dev(), cs);
        const auto two = on_gpu_inplace(x, [&](float* p) {
          gops().head_rms(p, n_tok * c.heads, c.head_dim, 1e-6f, bf16);
          gops().rope(p, n_tok, c.heads, c.head_dim, c.rd, dcs.as<float>(), false, bf16);
        });
        const auto one = on_gpu_inplace(x, [&](float* p) {
          gops().head_rms_rope(p, n_tok, c.heads, c.head_dim, 1e-6f, c.rd, dcs.as<float>(), bf16);
        });
        expect_bitwise("head_rms_rope",
                       strf("n_tok=%lld heads=%lld head_dim=%lld rd=%lld %s vs head_rms + rope", (long long)n_tok,
                            (long long)c.heads, (long long)c.head_dim, (long long)c.rd, num(bf16)),
                       two, one);
      }
}

// ---- FP8 / FP4 simulation ----------------------------------------------------------------------------------------
// bf16 activations with a different magnitude per block of 32 (2^-24 .. 2^12) and a spread of 2^-12 inside a block
// (so small elements land on the e4m3 / e2m1 subnormal grids), one all-zero block per row (amax 0 -> the 1e-4 /
// 6*2^-126 floor) and exact ties of the e4m3 grid.
std::vector<float> quant_inputs(int64_t n_rows, int64_t stride, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> be(-24, 12), sp(0, 12);
  std::vector<float> x(size_t(n_rows * stride));
  for (int64_t r = 0; r < n_rows; ++r) {
    int e = 0;
    for (int64_t i = 0; i < stride; ++i) {
      if (i % 32 == 0) e = be(rng);
      x[size_t(r * stride + i)] = round_to_bf16(std::ldexp(nd(rng), e - sp(rng)));
    }
    const int64_t zb = (r * 32) % stride / 32 * 32;  // zero block
    for (int64_t i = zb; i < std::min(stride, zb + 32); ++i) x[size_t(r * stride + i)] = 0.0f;
    if (stride >= 128) {  // columns [64, 128): amax 56 = 448 * 2^-3 -> s = 2^-3 for block 64; exact e4m3 ties
      float* b = x.data() + r * stride + 64;
      for (int i = 4; i < 64; ++i) b[i] = round_to_bf16(std::clamp(4.0f * nd(rng), -55.0f, 55.0f));
      b[0] = 56.0f;
      b[1] = 8.5f * 0.125f;    // code 8.5: tie -> 8
      b[2] = -9.5f * 0.125f;   // code -9.5: tie -> -10
      b[3] = 0x1.2p-10f;       // code 4.5 * 2^-9 (subnormal grid): tie -> 4 * 2^-9
    }
  }
  return x;
}

TEST(GpuOpsRows, Fp8Sim) {
  DSV4_REQUIRE_GPU();
  struct Case {
    int64_t rows_per_tok, stride, n_cols, block;
    const char* what;
  };
  const Case cases[] = {{1, 512, 448, 64, "kv nope dims"},      {64, 512, 448, 64, "q-like rows"},
                        {1, 4096, 4096, 128, "GEMM input"},     {1, 144, 144, 128, "tiny-b partial block"},
                        {1, 96, 96, 128, "hidden < block"},     {1, 200, 136, 64, "stride > cols, partial"}};
  for (const Case& c : cases)
    for (int64_t n_tok : kNTok) {
      const int64_t n_rows = n_tok * c.rows_per_tok;
      const auto x = quant_inputs(n_rows, c.stride, 60 + uint32_t(n_rows + c.stride));
      auto ref = x;
      cops().fp8_sim(ref.data(), n_rows, c.stride, c.n_cols, c.block);
      const auto got = on_gpu_inplace(x, [&](float* p) { gops().fp8_sim(p, n_rows, c.stride, c.n_cols, c.block); });
      expect_bitwise("fp8_sim",
                     strf("n_rows=%lld stride=%lld n_cols=%lld block=%lld (%s; whole buffer)", (long long)n_rows,
                          (long long)c.stride, (long long)c.n_cols, (long long)c.block, c.what),
                     ref, got);
    }
}

TEST(GpuOpsRows, Fp4Sim) {
  DSV4_REQUIRE_GPU();
  struct Case {
    int64_t rows_per_tok, dim;
  };
  const Case cases[] = {{64, 128}, {1, 128}, {1, 96}, {3, 80}};  // indexer q heads, keys, tiny, partial block
  for (const Case& c : cases)
    for (int64_t n_tok : kNTok) {
      const int64_t n_rows = n_tok * c.rows_per_tok;
      const auto x = quant_inputs(n_rows, c.dim, 70 + uint32_t(n_rows + c.dim));
      auto ref = x;
      cops().fp4_sim(ref.data(), n_rows, c.dim);
      const auto got = on_gpu_inplace(x, [&](float* p) { gops().fp4_sim(p, n_rows, c.dim); });
      expect_bitwise("fp4_sim", strf("n_rows=%lld dim=%lld", (long long)n_rows, (long long)c.dim), ref, got);
    }
}

// ---- hadamard ----------------------------------------------------------------------------------------------------
TEST(GpuOpsRows, Hadamard) {
  DSV4_REQUIRE_GPU();
  for (int64_t n_tok : kNTok)
    for (bool bf16 : {false, true}) {
      const int64_t n = n_tok * 64, dim = 128;  // indexer q: 64 heads x 128
      const auto x = randn(size_t(n * dim), 80 + uint32_t(n_tok), 1.0f, bf16);
      auto ref = x;
      cops().hadamard(ref.data(), n, dim, bf16);
      const auto got = on_gpu_inplace(x, [&](float* p) { gops().hadamard(p, n, dim, bf16); });
      expect_bitwise("hadamard", strf("n_rows=%lld dim=%lld %s", (long long)n, (long long)dim, num(bf16)), ref, got);
    }
  for (int64_t dim : {int64_t(1), int64_t(2), int64_t(64), int64_t(512), int64_t(1024), int64_t(8192)})
    for (bool bf16 : {false, true}) {
      const int64_t n = 7;
      const auto x = randn(size_t(n * dim), 81 + uint32_t(dim), 1.0f, bf16);
      auto ref = x;
      cops().hadamard(ref.data(), n, dim, bf16);
      const auto got = on_gpu_inplace(x, [&](float* p) { gops().hadamard(p, n, dim, bf16); });
      expect_bitwise("hadamard", strf("n_rows=%lld dim=%lld %s", (long long)n, (long long)dim, num(bf16)), ref, got);
    }
}

// ---- check_finite ------------------------------------------------------------------------------------------------
TEST(GpuOpsRows, CheckFinite) {
  DSV4_REQUIRE_GPU();
  const float kNan = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
  for (int64_t dim : {int64_t(129280), int64_t(7)})
    for (int64_t n : kNTok) {
      auto x = randn(size_t(n * dim), 90 + uint32_t(n), 10.0f);
      std::mt19937 rng(91);
      for (int64_t r = 0; r < n; ++r) {
        float* row = x.data() + r * dim;
        const int64_t at = int64_t(rng() % uint32_t(dim));
        switch ((r + n) % 6) {  // n = 1: row 0 holds a NaN
          case 1: row[at] = kNan; break;
          case 2: row[dim - 1] = kInf; break;
          case 3: row[0] = -kInf; break;
          case 4: row[at] = std::numeric_limits<float>::max(); break;  // finite: not bad
          case 5: row[at] = bitsf(0xFFC00001u); break;                 // a negative NaN with payload
          default: break;                                              // clean
        }
      }
      std::vector<int32_t> ref(size_t(n), -1);
      cops().check_finite(x.data(), n, dim, ref.data());
      Buffer dx = to_device(dev(), x);
      Buffer bad = out_buffer<int32_t>(dev(), size_t(n));
      gops().check_finite(dx.as<float>(), n, dim, bad.as<int32_t>());
      expect_bitwise("check_finite", strf("n_rows=%lld dim=%lld (NaN/inf injected)", (long long)n, (long long)dim),
                     ref, to_host<int32_t>(dev(), bad, size_t(n)));
    }
}

// ---- swiglu ------------------------------------------------------------------------------------------------------
// Bitwise: the clamps (std::min / std::max semantics), (g / (1 + exp(-g))) * up and the row weight are the same IEEE
// operations in the same order on both sides, exp being glibc's expf on both (glibc_math.cuh on the device).
TEST(GpuOpsRows, Swiglu) {
  DSV4_REQUIRE_GPU();
  const int64_t dim = 2048;
  for (int64_t n : kNTok)
    for (float limit : {10.0f, 0.0f})
      for (bool with_w : {true, false})
        for (bool bf16 : {false, true}) {
          auto g = randn(size_t(n * dim), 100 + uint32_t(n), 6.0f, bf16);  // crosses +-10 often
          const auto up = randn(size_t(n * dim), 101 + uint32_t(n), 6.0f, bf16);
          // exp's special ranges: overflow (-g > 88.72), the subnormal / underflow tail, +-0
          const float special[] = {-89.0f, -100.0f, -87.5f, 103.5f, 104.0f, 110.0f, 0.0f, -0.0f, 1e-30f, -1e-30f};
          for (size_t i = 0; i < g.size(); i += 97) g[i] = special[(i / 97) % (sizeof special / sizeof special[0])];
          auto w = randn(size_t(n), 102 + uint32_t(n), 0.3f);
          for (auto& v : w) v = std::abs(v);
          const float* wp = with_w ? w.data() : nullptr;
          std::vector<float> ref(g.size());
          cops().swiglu(g.data(), up.data(), n, dim, limit, wp, bf16, ref.data());
          Buffer dg = to_device(dev(), g), du = to_device(dev(), up), dw = to_device(dev(), w);
          Buffer dh = out_buffer<float>(dev(), g.size());
          const float* dwp = with_w ? dw.as<float>() : nullptr;
          gops().swiglu(dg.as<float>(), du.as<float>(), n, dim, limit, dwp, bf16, dh.as<float>());
          const std::string sh = strf("n_rows=%lld dim=%lld limit=%g row_w=%s %s", (long long)n, (long long)dim,
                                      limit, with_w ? "yes" : "null", num(bf16));
          expect_bitwise("swiglu", sh, ref, to_host<float>(dev(), dh, g.size()));
          gops().swiglu(dg.as<float>(), du.as<float>(), n, dim, limit, dwp, bf16, dg.as<float>());  // h aliases g
          expect_bitwise("swiglu", sh + " in-place", ref, to_host<float>(dev(), dg, g.size()));
        }
}

// ---- hyper-connections -------------------------------------------------------------------------------------------
// hc_pre / hc_head are bitwise equal to the CPU (k_hc.cu: the mix dot products in the CPU's 8-partial-sum order, the
// CPU's double sum of squares, glibc's expf, the CPU's operation order everywhere else). The n_tok values cover
// every tile shape of the dot-product kernel (n_tok <= 32: one token per CTA; 33..1535: 4 tokens x 8 rows; >= 1536:
// 8 tokens x 24 rows (hc_pre); hc_head: 8 tokens x 4 rows above 32), and the batch-invariance checks compare the rows
// of the different shapes with each other.
constexpr float kHcEps = 1e-6f, kNormEps = 1e-6f;
constexpr int kSinkhorn = 20;
constexpr int64_t kHcNTok[] = {1600, 300, 7, 1};  // the first is the largest (the batch-invariance reference)

struct HcInputs {
  std::vector<float> X, fn, scale, base;
};

// exact_dots: X on the grid k/8 (|k| <= 16) and fn on k/1024 (|k| <= 16), so every product and partial sum is exact
// (many equal values, exact ties in max / softmax). Otherwise realistic: X bf16 N(0,1), fn N(0, 0.01), scale and
// base N(0,1).
HcInputs hc_inputs(int64_t n_tok, int hc, int64_t dim, int64_t n_mix, int64_t n_scale, bool exact_dots,
                   uint32_t seed) {
  HcInputs in;
  const int64_t width = hc * dim;
  if (exact_dots) {
    const auto xi = randi(size_t(n_tok * width), seed, -16, 16), fi = randi(size_t(n_mix * width), seed + 1, -16, 16);
    in.X.resize(xi.size());
    in.fn.resize(fi.size());
    for (size_t i = 0; i < xi.size(); ++i) in.X[i] = float(xi[i]) / 8.0f;
    for (size_t i = 0; i < fi.size(); ++i) in.fn[i] = float(fi[i]) / 1024.0f;
  } else {
    in.X = randn(size_t(n_tok * width), seed, 1.0f, true);
    in.fn = randn(size_t(n_mix * width), seed + 1, 0.01f);
  }
  in.scale = randn(size_t(n_scale), seed + 2, 1.0f);
  in.base = randn(size_t(n_mix), seed + 3, 1.0f);
  return in;
}

struct HcDev {  // device copies of HcInputs
  Buffer X, fn, scale, base;
};
HcDev hc_to_device(const HcInputs& in) {
  return {to_device(dev(), in.X), to_device(dev(), in.fn), to_device(dev(), in.scale), to_device(dev(), in.base)};
}

struct HcPreOut {
  std::vector<float> u, post, comb;
};

HcPreOut cpu_hc_pre(const HcInputs& in, int64_t n_tok, int hc, int64_t dim, bool bf16) {
  HcPreOut r{std::vector<float>(size_t(n_tok * dim)), std::vector<float>(size_t(n_tok * hc)),
             std::vector<float>(size_t(n_tok * hc * hc))};
  cops().hc_pre(in.X.data(), n_tok, hc, dim, in.fn.data(), in.scale.data(), in.base.data(), kSinkhorn, kHcEps,
                kNormEps, bf16, r.u.data(), r.post.data(), r.comb.data());
  return r;
}

HcPreOut gpu_hc_pre(HcDev& d, int64_t n_tok, int hc, int64_t dim, bool bf16) {
  Buffer du = out_buffer<float>(dev(), size_t(n_tok * dim)), dp = out_buffer<float>(dev(), size_t(n_tok * hc)),
         dc = out_buffer<float>(dev(), size_t(n_tok * hc * hc));
  gops().hc_pre(d.X.as<float>(), n_tok, hc, dim, d.fn.as<float>(), d.scale.as<float>(), d.base.as<float>(),
                kSinkhorn, kHcEps, kNormEps, bf16, du.as<float>(), dp.as<float>(), dc.as<float>());
  return {to_host<float>(dev(), du, size_t(n_tok * dim)), to_host<float>(dev(), dp, size_t(n_tok * hc)),
          to_host<float>(dev(), dc, size_t(n_tok * hc * hc))};
}

std::vector<float> cpu_hc_head(const HcInputs& in, int64_t n_tok, int hc, int64_t dim, bool bf16) {
  std::vector<float> u(size_t(n_tok * dim));
  cops().hc_head(in.X.data(), n_tok, hc, dim, in.fn.data(), in.scale.data(), in.base.data(), kHcEps, kNormEps, bf16,
                 u.data());
  return u;
}

std::vector<float> gpu_hc_head(HcDev& d, int64_t n_tok, int hc, int64_t dim, bool bf16) {
  Buffer du = out_buffer<float>(dev(), size_t(n_tok * dim));
  gops().hc_head(d.X.as<float>(), n_tok, hc, dim, d.fn.as<float>(), d.scale.as<float>(), d.base.as<float>(), kHcEps,
                 kNormEps, bf16, du.as<float>());
  return to_host<float>(dev(), du, size_t(n_tok * dim));
}

template <class T>
std::vector<T> head_rows(const std::vector<T>& v, size_t n) {
  return std::vector<T>(v.begin(), v.begin() + std::ptrdiff_t(n));
}

void expect_hc_pre_bitwise(const std::string& sh, const HcPreOut& ref, const HcPreOut& got) {
  expect_bitwise("hc_pre.u", sh, ref.u, got.u);
  expect_bitwise("hc_pre.post", sh, ref.post, got.post);
  expect_bitwise("hc_pre.comb", sh, ref.comb, got.comb);
}

struct HcCase {
  int hc;
  int64_t dim;
  const char* what;
};
// real; tiny-a / tiny-b hidden; width % 4 != 0 (scalar loads in the dot kernel); dim < mix (the dots do not fit in
// u: the per-token kernel computes them)
constexpr HcCase kHcPreCases[] = {
    {4, 4096, "real"}, {4, 128, "tiny-a"}, {4, 96, "tiny-b"}, {3, 33, "width%4!=0"}, {4, 16, "dim<mix"}};
constexpr HcCase kHcHeadCases[] = {
    {4, 4096, "real"}, {4, 128, "tiny-a"}, {4, 96, "tiny-b"}, {3, 33, "width%4!=0"}, {4, 2, "dim<mix"}};

// The deterministic mode (gemm_path.h) for a scope: the bitwise checks below run in it; the default (fast) mode has
// its own decode kernels (HcPreFastMode).
using gpu::DeterministicScope;

TEST(GpuOpsHc, HcPre) {
  DSV4_REQUIRE_GPU();
  DeterministicScope det;
  for (const HcCase& c : kHcPreCases)
    for (bool exact : {false, true}) {
      const int64_t n_mix = (2 + c.hc) * c.hc, n_max = kHcNTok[0];
      const HcInputs in = hc_inputs(n_max, c.hc, c.dim, n_mix, 3, exact, 200 + uint32_t(c.dim) + (exact ? 7 : 0));
      HcDev d = hc_to_device(in);
      for (bool bf16 : {false, true}) {
        HcPreOut full;  // the n_max-token CUDA result, for the batch-invariance checks
        for (int64_t n_tok : kHcNTok) {
          const std::string sh = strf("n_tok=%lld hc=%d dim=%lld (%s) %s inputs %s", (long long)n_tok, c.hc,
                                      (long long)c.dim, c.what, exact ? "exact-dot" : "realistic", num(bf16));
          const HcPreOut got = gpu_hc_pre(d, n_tok, c.hc, c.dim, bf16);
          expect_hc_pre_bitwise(sh, cpu_hc_pre(in, n_tok, c.hc, c.dim, bf16), got);
          if (n_tok == n_max) {
            full = got;
          } else {
            const std::string vs = strf(" vs rows of n_tok=%lld", (long long)n_max);
            expect_bitwise("hc_pre.u batch-invariance", sh + vs, head_rows(full.u, got.u.size()), got.u);
            expect_bitwise("hc_pre.post batch-invariance", sh + vs, head_rows(full.post, got.post.size()), got.post);
            expect_bitwise("hc_pre.comb batch-invariance", sh + vs, head_rows(full.comb, got.comb.size()), got.comb);
          }
        }
      }
    }
}

TEST(GpuOpsHc, HcHead) {
  DSV4_REQUIRE_GPU();
  DeterministicScope det;
  for (const HcCase& c : kHcHeadCases)
    for (bool exact : {false, true}) {
      const int64_t n_max = kHcNTok[0];
      const HcInputs in = hc_inputs(n_max, c.hc, c.dim, c.hc, 1, exact, 300 + uint32_t(c.dim) + (exact ? 7 : 0));
      HcDev d = hc_to_device(in);
      for (bool bf16 : {false, true}) {
        std::vector<float> full;
        for (int64_t n_tok : kHcNTok) {
          const std::string sh = strf("n_tok=%lld hc=%d dim=%lld (%s) %s inputs %s", (long long)n_tok, c.hc,
                                      (long long)c.dim, c.what, exact ? "exact-dot" : "realistic", num(bf16));
          const auto got = gpu_hc_head(d, n_tok, c.hc, c.dim, bf16);
          expect_bitwise("hc_head.u", sh, cpu_hc_head(in, n_tok, c.hc, c.dim, bf16), got);
          if (n_tok == n_max)
            full = got;
          else
            expect_bitwise("hc_head.u batch-invariance", sh + strf(" vs rows of n_tok=%lld", (long long)n_max),
                           head_rows(full, got.size()), got);
        }
      }
    }
}

// The sum of squares (k_hc.cu): the CPU adds double(x)^2 sequentially; the kernel sums in a tree and falls back to
// the sequential sum when float(tree sum) could differ from float(sequential sum). Rows built to sit exactly on a
// float rounding boundary: x = (x0, 2^-12, then 2^-30 ...) with x0 = 1 + j 2^-11, so x0^2 + 2^-24 is the midpoint
// between two floats. "big first": the sequential sum drops every 2^-60 term (below half a double ulp of ~1) and
// lands exactly on the midpoint (ties-to-even: rounds down), while any tree sum adds the small terms up first and
// rounds up -- only the fallback gives the CPU's float here (without it r, and with it post / comb / u, differ).
// "small first" (x0 and 2^-12 last): both orders keep the small terms and round up (the fallback is taken too and
// must agree). Mixed with realistic rows (fast path) in the same call; random signs (squares are what count).
TEST(GpuOpsHc, HcSumSqRoundingBoundary) {
  DSV4_REQUIRE_GPU();
  DeterministicScope det;
  const int hc = 4;
  const int64_t dim = 4096, width = hc * dim, n_tok = 48, n_mix = (2 + hc) * hc;
  HcInputs in = hc_inputs(n_tok, hc, dim, n_mix, 3, false, 500);
  std::mt19937 rng(501);
  for (int64_t t = 0; t < n_tok; ++t) {
    if (t % 3 == 2) continue;  // a realistic row
    float* x = in.X.data() + t * width;
    const bool big_first = t % 3 == 0;
    for (int64_t k = 0; k < width; ++k) x[k] = std::ldexp(1.0f, -30);
    const float x0 = 1.0f + float(t + 1) * std::ldexp(1.0f, -11);
    x[big_first ? 0 : width - 2] = x0;
    x[big_first ? 1 : width - 1] = std::ldexp(1.0f, -12);
    for (int64_t k = 0; k < width; ++k)
      if (rng() & 1) x[k] = -x[k];
  }
  HcDev d = hc_to_device(in);
  // hc_head's fn / scale / base: the first hc rows of hc_pre's
  HcInputs ih = in;
  ih.fn.resize(size_t(hc * width));
  ih.base.resize(size_t(hc));
  ih.scale.resize(1);
  HcDev dh = hc_to_device(ih);
  for (bool bf16 : {false, true}) {
    const std::string sh = strf("n_tok=%lld hc=%d dim=%lld (rows on a float rounding boundary of sum x^2) %s",
                                (long long)n_tok, hc, (long long)dim, num(bf16));
    expect_hc_pre_bitwise(sh, cpu_hc_pre(in, n_tok, hc, dim, bf16), gpu_hc_pre(d, n_tok, hc, dim, bf16));
    expect_bitwise("hc_head.u", sh, cpu_hc_head(ih, n_tok, hc, dim, bf16), gpu_hc_head(dh, n_tok, hc, dim, bf16));
  }
}

// hc_post is elementwise per (t, d) with the CPU's operation order: bitwise, out of place and in place (Xout = X).
// Fast mode (default) at decode sizes (n_tok <= 32): the dots by hc_dot_fast_kernel, the tree sum of squares.
// Tolerance: the dot products differ from the CPU's by fp32 rounding (each side within width * 2^-24 * sum|f x| of
// the exact value; ~1e-6 relative here); sigmoid, the 4x4 softmax and Sinkhorn are well conditioned, so post / comb
// stay within 2e-5 abs + 1e-4 rel and u within 1e-4 abs + 1e-4 rel of the CPU (+ one bf16 ulp, rtol 2^-7, with
// bf16); a wrong row, scale or missing normalization is off by orders of magnitude more. Also: deterministic (two
// runs bitwise) and batch invariant (the rows of a 7-token call == 1-token calls, bitwise).
TEST(GpuOpsHc, HcPreFastMode) {
  DSV4_REQUIRE_GPU();
  const int hc = 4;
  const int64_t dim = 4096, n_mix = (2 + hc) * hc;
  const HcInputs in = hc_inputs(7, hc, dim, n_mix, 3, false, 4242);
  HcDev d = hc_to_device(in);
  for (bool bf16 : {false, true}) {
    const double rt = bf16 ? std::ldexp(1.0, -7) : 1e-4;
    HcPreOut seven;
    for (int64_t n_tok : {int64_t(7), int64_t(1)}) {
      const std::string sh = strf("fast mode n_tok=%lld hc=4 dim=4096 %s", (long long)n_tok, num(bf16));
      const HcPreOut ref = cpu_hc_pre(in, n_tok, hc, dim, bf16);
      const HcPreOut got = gpu_hc_pre(d, n_tok, hc, dim, bf16);
      expect_close("hc_pre.u", sh, ref.u, got.u, 1e-4, rt);
      expect_close("hc_pre.post", sh, ref.post, got.post, 2e-5, 1e-4);
      expect_close("hc_pre.comb", sh, ref.comb, got.comb, 2e-5, 1e-4);
      const HcPreOut again = gpu_hc_pre(d, n_tok, hc, dim, bf16);
      expect_bitwise("hc_pre.u determinism", sh, got.u, again.u);
      expect_bitwise("hc_pre.comb determinism", sh, got.comb, again.comb);
      if (n_tok == 7)
        seven = got;
      else
        expect_bitwise("hc_pre.u batch-invariance", sh + " vs row 0 of n_tok=7", head_rows(seven.u, got.u.size()),
                       got.u);
    }
    const std::string sh = strf("fast mode hc_head n_tok=7 hc=4 dim=4096 %s", num(bf16));
    const HcInputs hin = hc_inputs(7, hc, dim, hc, 1, false, 4343);
    HcDev hd = hc_to_device(hin);
    expect_close("hc_head.u", sh, cpu_hc_head(hin, 7, hc, dim, bf16), gpu_hc_head(hd, 7, hc, dim, bf16), 1e-4, rt);
  }
}

// hc_pre_norm (hc_pre, then rmsnorm of u with the sublayer's norm weight) on CUDA: bitwise what hc_pre followed by
// rmsnorm gives on CUDA, in both modes (the fast decode path normalizes inside hc_pre's last kernel with
// rmsnorm_vec_kernel's operations; every other shape runs the two ops), and within the fast-mode tolerance of the CPU.
TEST(GpuOpsHc, HcPreNormEqualsHcPreThenRmsnorm) {
  DSV4_REQUIRE_GPU();
  for (const HcCase c : {HcCase{4, 4096, "real"}, HcCase{4, 96, "tiny-b"}, HcCase{4, 2048, "half"}})
    for (bool det : {false, true}) {
      std::unique_ptr<gpu::DeterministicScope> scope;
      if (det) scope = std::make_unique<gpu::DeterministicScope>();
      const int hc = c.hc;
      const int64_t dim = c.dim, n_mix = (2 + hc) * hc;
      const HcInputs in = hc_inputs(7, hc, dim, n_mix, 3, false, 5151);
      HcDev d = hc_to_device(in);
      const auto w = randn(size_t(dim), 5252, 1.0f);
      Buffer dw = to_device(dev(), w);
      for (bool bf16 : {false, true})
        for (int64_t n_tok : {int64_t(7), int64_t(1)}) {
          const std::string sh = strf("%s n_tok=%lld hc=%d dim=%lld %s %s", c.what, (long long)n_tok, hc,
                                      (long long)dim, num(bf16), det ? "deterministic" : "fast");
          HcPreOut two = gpu_hc_pre(d, n_tok, hc, dim, bf16);
          Buffer du2 = to_device(dev(), two.u);
          gops().rmsnorm(du2.as<float>(), n_tok, dim, dw.as<float>(), kNormEps, bf16, du2.as<float>());
          two.u = to_host<float>(dev(), du2, size_t(n_tok * dim));
          Buffer du = out_buffer<float>(dev(), size_t(n_tok * dim)), dp = out_buffer<float>(dev(), size_t(n_tok * hc)),
                 dc = out_buffer<float>(dev(), size_t(n_tok * hc * hc));
          gops().hc_pre_norm(d.X.as<float>(), n_tok, hc, dim, d.fn.as<float>(), d.scale.as<float>(),
                             d.base.as<float>(), kSinkhorn, kHcEps, kNormEps, bf16, dw.as<float>(), du.as<float>(),
                             dp.as<float>(), dc.as<float>());
          const HcPreOut one{to_host<float>(dev(), du, size_t(n_tok * dim)), to_host<float>(dev(), dp, size_t(n_tok * hc)),
                             to_host<float>(dev(), dc, size_t(n_tok * hc * hc))};
          expect_bitwise("hc_pre_norm.u vs hc_pre + rmsnorm", sh, two.u, one.u);
          expect_bitwise("hc_pre_norm.post", sh, two.post, one.post);
          expect_bitwise("hc_pre_norm.comb", sh, two.comb, one.comb);
          // the CPU's hc_pre_norm (Ops' default: the two ops)
          HcPreOut ref = cpu_hc_pre(in, n_tok, hc, dim, bf16);
          cops().rmsnorm(ref.u.data(), n_tok, dim, w.data(), kNormEps, bf16, ref.u.data());
          if (det)
            expect_bitwise("hc_pre_norm.u vs the CPU", sh, ref.u, one.u);
          else
            expect_close("hc_pre_norm.u vs the CPU", sh, ref.u, one.u, 1e-3, bf16 ? std::ldexp(1.0, -6) : 1e-3);
        }
    }
}

TEST(GpuOpsHc, HcPost) {
  DSV4_REQUIRE_GPU();
  const struct {
    int hc;
    int64_t dim;
  } cases[] = {{4, 4096}, {4, 96}, {4, 98}, {2, 64}};  // real; tiny-b; scalar path (dim % 4 != 0); hc 2
  for (const auto& c : cases)
    for (int64_t n_tok : kNTok)
      for (bool bf16 : {false, true}) {
        const int64_t width = c.hc * c.dim;
        const uint32_t seed = 400 + uint32_t(n_tok + c.dim);
        const auto f = randn(size_t(n_tok * c.dim), seed, 1.0f, true);
        const auto X = randn(size_t(n_tok * width), seed + 1, 1.0f, true);
        auto post = randn(size_t(n_tok * c.hc), seed + 2, 1.0f);
        for (auto& p : post) p = 2.0f / (1.0f + std::exp(-p));
        auto comb = randn(size_t(n_tok * c.hc * c.hc), seed + 3, 1.0f);
        for (auto& v : comb) v = std::abs(v) / float(c.hc);
        std::vector<float> ref(X.size());
        cops().hc_post(f.data(), X.data(), post.data(), comb.data(), n_tok, c.hc, c.dim, bf16, ref.data());
        Buffer df = to_device(dev(), f), dX = to_device(dev(), X), dp = to_device(dev(), post),
               dc = to_device(dev(), comb);
        Buffer dout = out_buffer<float>(dev(), X.size());
        gops().hc_post(df.as<float>(), dX.as<float>(), dp.as<float>(), dc.as<float>(), n_tok, c.hc, c.dim, bf16,
                       dout.as<float>());
        const std::string sh =
            strf("n_tok=%lld hc=%d dim=%lld %s", (long long)n_tok, c.hc, (long long)c.dim, num(bf16));
        expect_bitwise("hc_post", sh, ref, to_host<float>(dev(), dout, X.size()));
        gops().hc_post(df.as<float>(), dX.as<float>(), dp.as<float>(), dc.as<float>(), n_tok, c.hc, c.dim, bf16,
                       dX.as<float>());
        expect_bitwise("hc_post", sh + " in-place", ref, to_host<float>(dev(), dX, X.size()));
      }
}

}  // namespace ew
}  // namespace
}  // namespace dsv4::test::gpu
