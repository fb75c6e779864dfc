// moe_tc_big_kernel (src/backend/cuda/k_moe_tc.cu: the prefill experts of the fast (Q) mode, FP4 weights on f16
// tensor cores) driven directly through cuda::gemm_internal::moe_tc_big, against an fp64 reference of the same products.
//
// What the kernel guarantees (its file comment): every product act_code x e2m1 x 2^(e - 127) is exact, the block
// scales are exact powers of two, and the only roundings are the fp32 additions in its own order: per 128-column
// block, 8 k16 mmas chained onto the accumulator (a fast block: every E8M0 code of the warp's rows in [104, 128]) or,
// per 32-column group, 2 mmas from 0 then one fma onto the accumulator (a slow block). The reference (ref_dot) walks
// that order in fp64 and adds up a rigorous bound of those roundings per output: per mma 2^-19 (|accumulator| +
// sum |its 16 products|), per fma 2^-23 |result|, the accumulator bounded by the exact partial sum plus the error so
// far. That is ~0.06 of one product at K = 4096 and far less at K = 128, so a wrong k position, nibble, scale,
// fragment row or segment row (an error of at least one product) fails. Special codes: 0 adds 0 (the CPU takes
// 2^-127: below 2^-100 of the products), 255 makes the output non-finite. kW13 outputs go through SwiGLU (clamp 7,
// routing weight): the bound is carried through it (|d silu| <= 1.1, the clamp is 1-Lipschitz) plus 2^-21 |h| for
// SwiGLU's own fp32 arithmetic.
// Also: rows past the last segment (and so the rows past a segment's end, which the kernel repeats) are never
// written; segments of 1..300 rows (full and partial 64-row tiles); tokens of zero activations; every FP4 nibble.
//
// Two kernels behind moe_tc_big: CudaMoeTcBig.* run the mma.sync kernel (set_moe_big_kernel(MoeBigKernel::mma)),
// CudaMoeWgmma.* the same checks on the wgmma kernel (k_moe_wgmma.cu; compute capability 9.0 with the sm_90a build:
// there it must run, elsewhere the tests skip), plus V4-Flash's shapes (256 experts, ragged segments: sampled
// outputs against fp64, every output against the mma.sync kernel, two runs bitwise equal). run_big checks that the
// kernel each test means is the one that ran (moe_wgmma_calls). The wgmma kernel decides fast / other per block for
// all 256 weight rows of a CTA (the mma.sync kernel per warp of 32): the bound takes either order per block.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstring>

#include <cuda_runtime.h>

#include "backend/cuda/gemm_path.h"
#include "backend/cuda/kernels.h"
#include "gpu_test_util.h"

namespace dsv4::test::gpu {
namespace {
namespace tb {  // own helpers

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
  double uni() { return double(next() >> 11) * 0x1p-53; }
};

double e2m1(int n) {
  static const double v[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (n & 8) ? -v[n & 7] : v[n & 7];
}
// the kernel's reading of an E8M0 code: 0 -> 0, 255 -> infinity
double e8m0(int e) { return e == 0 ? 0.0 : e == 255 ? INFINITY : std::ldexp(1.0, e - 127); }

// Scale codes of a test weight.
enum class Scales {
  fast,      // 110..126: every block on the fast path
  edges,     // also the fast range's ends 104 and 128 in 1 group of 20
  mixed,     // 1 group in 300 outside the f16 range (103, 129, 60..102, 130..160): the blocks of those warps (about
             // a third of them) on the slow path
  specials,  // as mixed, plus codes 0 and 255 in 1 group of 300 each
};

struct Layer {
  int64_t E = 0, D = 0, I = 0;
  std::vector<HostWeight> w1, w2, w3;  // w1 / w3 [I, D], w2 [D, I]
  std::vector<Buffer> storage;
  std::vector<ExpertView> dev;
  Buffer table;
};

HostWeight make_fp4(int64_t rows, int64_t cols, Scales sc, Rng& rng) {
  HostWeight h;
  h.view.fmt = GemmFormat::fp4;
  h.view.rows = rows;
  h.view.cols = cols;
  h.view.block_rows = 1;
  h.view.block_cols = 32;
  h.w.resize(size_t(rows * cols / 2));
  if (h.w.size() % 8 == 0 && h.w.size() >= (size_t(1) << 20)) {  // (large weights: 8 bytes per draw)
    for (size_t i = 0; i < h.w.size(); i += 8) {
      const uint64_t v = rng.next();
      std::memcpy(&h.w[i], &v, 8);
    }
  } else {
    for (auto& b : h.w) b = uint8_t(rng.next());  // every nibble
  }
  h.scale.resize(size_t(rows * (cols / 32)));
  for (auto& s : h.scale) {
    s = uint8_t(110 + rng.below(17));
    const int64_t r = rng.below(300);
    if (sc == Scales::edges && r < 15) s = uint8_t(r % 2 ? 104 : 128);
    if ((sc == Scales::mixed || sc == Scales::specials) && r == 0) {
      const int64_t k = rng.below(4);
      s = uint8_t(k == 0 ? 103 : k == 1 ? 129 : k == 2 ? 60 + rng.below(43) : 130 + rng.below(31));
    }
    if (sc == Scales::specials && (r == 1 || r == 2)) s = uint8_t(r == 1 ? 0 : 255);
  }
  h.view.w = h.w.data();
  h.view.scale = h.scale.data();
  return h;
}

Layer make_layer(int64_t E, int64_t D, int64_t I, Scales sc, uint64_t seed) {
  Layer L;
  L.E = E, L.D = D, L.I = I;
  Rng rng(seed);
  for (int64_t e = 0; e < E; ++e) {
    L.w1.push_back(make_fp4(I, D, sc, rng));
    L.w2.push_back(make_fp4(D, I, sc, rng));
    L.w3.push_back(make_fp4(I, D, sc, rng));
  }
  for (int64_t e = 0; e < E; ++e)
    L.dev.push_back(ExpertView{cuda()->upload(L.w1[size_t(e)].view, L.storage),
                               cuda()->upload(L.w2[size_t(e)].view, L.storage),
                               cuda()->upload(L.w3[size_t(e)].view, L.storage)});
  L.table = cuda()->upload_bytes(L.dev.data(), L.dev.size() * sizeof(ExpertView), "expert table");
  return L;
}

// Activation codes (every finite e4m3 value as fp32) and power-of-two block scales 2^-10..2^5 (act_quant's smallest,
// 2^-22, for the zero rows).
struct Acts {
  int64_t rows = 0, K = 0;
  std::vector<float> code, sa;
};

Acts make_acts(int64_t rows, int64_t K, const std::vector<int64_t>& zero_rows, Rng& rng) {
  Acts a;
  a.rows = rows, a.K = K;
  a.code.resize(size_t(rows * K));
  a.sa.resize(size_t(rows * (K / 128)));
  for (auto& c : a.code) {
    uint8_t b = uint8_t(rng.next());
    if ((b & 0x7F) == 0x7F) b ^= 1;  // no NaN
    c = e4m3fn_to_float(b);
  }
  for (auto& s : a.sa) s = std::ldexp(1.0f, int(rng.below(16)) - 10);
  for (const int64_t r : zero_rows) {
    std::fill_n(a.code.begin() + r * K, K, 0.0f);
    std::fill_n(a.sa.begin() + r * (K / 128), K / 128, std::ldexp(1.0f, -22));
  }
  return a;
}

// Reference of one output: the exact value (fp64; NaN where a code 255 meets it) and a bound of the kernel's
// rounding error. x: activation row (codes, scales), W: the weight row. Each mma adds 16 exact products p to an fp32
// accumulator C with an error of at most 2^-19 (|C| + sum |p|) (16 fp32 ulps: even a tensor core that truncated every
// addend at the largest one's last bit stays inside), |C| <= |exact partial sum| + the error so far; a slow block's
// fma adds at most 2^-23 |result|. Per block the larger of the fast and the slow order's bounds (the kernel picks per
// warp of 32 weight rows, so a row may take either).
struct Ref {
  double v = 0, bound = 0;
};

Ref ref_dot(const Acts& a, int64_t row, const HostWeight& W, int64_t wrow) {
  const int64_t K = a.K, nkb = K / 128;
  const double u_mma = std::ldexp(1.0, -19), u_fma = std::ldexp(1.0, -23);
  const float* code = &a.code[size_t(row * K)];
  const float* sa = &a.sa[size_t(row * nkb)];
  const uint8_t* w = &W.w[size_t(wrow * K / 2)];
  const uint8_t* sc = &W.scale[size_t(wrow * K / 32)];
  Ref r;
  bool nonfinite = false;
  for (int64_t kb = 0; kb < nkb; ++kb) {
    // step 2 G + h of the block: columns 32 G + 8 t + {4 h .. 4 h + 3}, t = 0..3 (the kernel's order)
    double sum[8] = {}, abs[8] = {};
    for (int s = 0; s < 8; ++s) {
      const int G = s / 2, h = s % 2;
      const double scale = e8m0(sc[kb * 4 + G]);
      for (int t = 0; t < 4; ++t)
        for (int v = 4 * h; v < 4 * h + 4; ++v) {
          const int64_t k = kb * 128 + 32 * G + 8 * t + v;
          if (std::isinf(scale)) {
            nonfinite = true;
            continue;
          }
          const double p = double(code[k]) * sa[kb] * e2m1((w[k / 2] >> (4 * (k & 1))) & 0xF) * scale;
          sum[s] += p;
          abs[s] += std::fabs(p);
        }
    }
    double fast = 0, slow = 0, part = r.v;  // fast order: 8 mmas onto the accumulator
    for (int s = 0; s < 8; ++s) {
      fast += u_mma * (std::fabs(part) + r.bound + fast + abs[s]);
      part += sum[s];
    }
    part = r.v;  // slow order: per group 2 mmas from 0, then an fma onto the accumulator
    for (int G = 0; G < 4; ++G) {
      const double d1 = u_mma * abs[2 * G];
      const double d2 = d1 + u_mma * (std::fabs(sum[2 * G]) + d1 + abs[2 * G + 1]);
      part += sum[2 * G] + sum[2 * G + 1];
      slow += d2 + u_fma * (std::fabs(part) + r.bound + slow + d2);
    }
    for (int s = 0; s < 8; ++s) r.v += sum[s];
    r.bound += std::max(fast, slow);
  }
  if (nonfinite) r.v = NAN;
  return r;
}

// SwiGLU as the kernel's epilogue computes it (device_swiglu.cuh), in fp64.
double swiglu(double g, double u, double limit, double rw) {
  if (limit > 0) u = std::min(std::max(u, -limit), limit), g = std::min(g, limit);
  return rw * (g / (1.0 + std::exp(-g))) * u;
}

struct Segs {
  std::vector<int32_t> seg_start, big_tile_start;
  int64_t P = 0;
};

// Segments of the given sizes (expert e: sizes[e] rows), every one on moe_tc_big_kernel (tiles of 64 rows; the
// launcher's grid holds ceil(P / 64) + min(E, P / 17) tiles: the sizes must keep P / 17 >= E).
Segs make_segs(const std::vector<int64_t>& sizes) {
  Segs s;
  s.seg_start.push_back(0);
  s.big_tile_start.push_back(0);
  for (const int64_t c : sizes) {
    s.seg_start.push_back(int32_t(s.seg_start.back() + c));
    s.big_tile_start.push_back(int32_t(s.big_tile_start.back() + (c + 63) / 64));
  }
  s.P = s.seg_start.back();
  return s;
}

struct Run {
  std::vector<float> y;  // [P + 64, ld]: rows past P must stay unwritten
  int64_t ld = 0;
};

// moe_tc_big on device copies of the inputs; w13: a = tokens' codes [n_tok, D] gathered through row_tok.
Run run_big(bool w13, const Layer& L, const Segs& s, const Acts& a, const std::vector<int32_t>& row_tok,
            const std::vector<float>& row_w, float limit) {
  cuda::gemm_internal::MoeGemmArgs g;
  const Buffer seg = to_device(*cuda(), s.seg_start), big = to_device(*cuda(), s.big_tile_start);
  const Buffer tok = to_device(*cuda(), row_tok), rw = to_device(*cuda(), row_w);
  const Buffer ad = to_device(*cuda(), a.code), sad = to_device(*cuda(), a.sa);
  g.table = static_cast<const ExpertView*>(L.table.data());
  g.n_experts = L.E;
  g.fmt = GemmFormat::fp4;
  g.d_model = L.D;
  g.inter = L.I;
  g.seg_start = seg.as<int32_t>();
  g.big_tile_start = big.as<int32_t>();
  g.n_rows_bound = s.P;
  g.n_tok = w13 ? a.rows : s.P;
  g.row_tok = tok.as<int32_t>();
  g.row_w = rw.as<float>();
  g.quant = true;
  g.out_bf16 = false;
  g.words_ok = g.w16_ok = true;
  const size_t ws_bytes = cuda::gemm_internal::moe_tc_big_scratch_bytes(GemmFormat::fp4, true, g.n_tok, s.P, L.D, L.I);
  Buffer ws = out_buffer<uint8_t>(*cuda(), ws_bytes);
  g.a8_ws = ws.data();
  Run r;
  r.ld = w13 ? L.I : L.D;
  Buffer y = out_buffer<float>(*cuda(), size_t((s.P + 64) * r.ld));
  cuda()->synchronize();
  const bool want_wgmma = cuda::gemm_internal::moe_tc_big_wgmma_ok();
  const int64_t wg_before = cuda::moe_wgmma_calls();
  cuda::gemm_internal::moe_tc_big(w13, g, ad.as<float>(), sad.as<float>(), y.as<float>(), r.ld, limit, false, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cuda::moe_wgmma_calls() - wg_before, want_wgmma ? 1 : 0) << "the wgmma kernel ran where not meant to, or "
                                                                        "did not run where meant to";
  r.y = to_host<float>(*cuda(), y, size_t((s.P + 64) * r.ld));
  return r;
}

struct Check {
  int64_t n = 0, bad = 0, nonfinite_ok = 0, unwritten_bad = 0;
  double worst = 0;  // max |got - ref| / bound
  std::string first;
};

void report(const std::string& label, const Check& c) {
  const bool ok = c.bad == 0 && c.unwritten_bad == 0;
  std::printf("[moe_tc_big] %s: %lld outputs, worst |got - ref| / bound %.3g, %lld non-finite as expected, "
              "%lld outside the bound, %lld written rows past the segments %s\n",
              label.c_str(), (long long)c.n, c.worst, (long long)c.nonfinite_ok, (long long)c.bad,
              (long long)c.unwritten_bad, ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  if (!ok) ADD_FAILURE() << label << ": " << c.bad << " outputs outside the bound, " << c.unwritten_bad
                         << " rows past the segments written; first: " << c.first;
}

void expect_unwritten(const Run& r, int64_t P, Check& c) {
  for (int64_t i = P * r.ld; i < int64_t(r.y.size()); ++i) {
    uint32_t b;
    std::memcpy(&b, &r.y[size_t(i)], 4);
    if (b != 0xFFFFFFFFu) ++c.unwritten_bad;
  }
}

void note(Check& c, double got, double want, double bound, const std::string& where) {
  ++c.n;
  if (std::isnan(want)) {  // a code 255 in the row: non-finite
    if (std::isfinite(got)) {
      if (c.bad++ == 0) c.first = where + strf(": want non-finite, got %.9g", got);
    } else {
      ++c.nonfinite_ok;
    }
    return;
  }
  const double e = std::fabs(got - want);
  c.worst = std::max(c.worst, bound > 0 ? e / bound : (e > 0 ? INFINITY : 0.0));
  if (!(e <= bound)) {
    if (c.bad++ == 0) c.first = where + strf(": got %.9g want %.17g bound %.3g", got, want, bound);
  }
}

// w2: o[r, n] = W2 h[r] for every sorted row r of expert e.
void check_w2(const std::string& label, const Layer& L, const Segs& s, const Acts& a) {
  const std::vector<int32_t> tok(size_t(s.P), 0);
  const std::vector<float> rw(size_t(s.P), 1.0f);
  const Run r = run_big(false, L, s, a, tok, rw, 0.0f);
  Check c;
  for (int64_t e = 0; e < L.E; ++e)
    for (int64_t row = s.seg_start[size_t(e)]; row < s.seg_start[size_t(e) + 1]; ++row)
      for (int64_t n = 0; n < L.D; ++n) {
        const Ref f = ref_dot(a, row, L.w2[size_t(e)], n);
        note(c, r.y[size_t(row * r.ld + n)], f.v, f.bound, strf("expert %lld row %lld col %lld", (long long)e,
                                                                  (long long)row, (long long)n));
      }
  expect_unwritten(r, s.P, c);
  report(label + strf(" w2 [%lld, %lld]", (long long)L.D, (long long)L.I), c);
}

// w1 | w3 + SwiGLU: h[r, n] = swiglu(W1 x, W3 x, limit, row_w[r]), x = codes of token row_tok[r].
void check_w13(const std::string& label, const Layer& L, const Segs& s, const Acts& a, Rng& rng, float limit) {
  std::vector<int32_t> tok(size_t(s.P));
  std::vector<float> rw(size_t(s.P));
  for (auto& t : tok) t = int32_t(rng.below(a.rows));
  for (auto& w : rw) w = float(0.25 + rng.uni());
  const Run r = run_big(true, L, s, a, tok, rw, limit);
  Check c;
  for (int64_t e = 0; e < L.E; ++e)
    for (int64_t row = s.seg_start[size_t(e)]; row < s.seg_start[size_t(e) + 1]; ++row)
      for (int64_t n = 0; n < L.I; ++n) {
        const Ref g = ref_dot(a, tok[size_t(row)], L.w1[size_t(e)], n);
        const Ref u = ref_dot(a, tok[size_t(row)], L.w3[size_t(e)], n);
        const double w = rw[size_t(row)];
        const double want = std::isnan(g.v) || std::isnan(u.v) ? NAN : swiglu(g.v, u.v, limit, w);
        const double silu_max = std::max(std::fabs(g.v), 0.3) + 1.1 * g.bound;
        const double bound = w * (1.1 * g.bound * (std::fabs(u.v) + u.bound) + silu_max * u.bound) +
                             std::ldexp(std::fabs(want), -21) + 1e-37;
        note(c, r.y[size_t(row * r.ld + n)], want, bound,
             strf("expert %lld row %lld col %lld", (long long)e, (long long)row, (long long)n));
      }
  expect_unwritten(r, s.P, c);
  report(label + strf(" w1|w3 [%lld, %lld] + SwiGLU (limit %g)", (long long)L.I, (long long)L.D, double(limit)), c);
}

bool big_ok(const Layer& L, int64_t P) {
  cuda::gemm_internal::MoeGemmArgs g;
  g.fmt = GemmFormat::fp4;
  g.quant = true;
  g.d_model = L.D;
  g.inter = L.I;
  g.w16_ok = true;
  g.n_rows_bound = P;
  return cuda::gemm_internal::moe_tc_big_ok(g);
}

// Segment sizes 1..300: full and partial tiles, a tile of one row, 63 / 64 / 65.
const std::vector<int64_t> kSizes = {1, 2, 7, 16, 17, 31, 32, 63, 64, 65, 100, 127, 128, 129, 192, 257, 300};

}  // namespace tb

using namespace tb;

void fast_blocks() {
  // every block on the fast path: scaled f16 weights, 8 chained mmas per block; K = 512 (w1|w3) and 256 (w2),
  // 17 experts with segments of 1..300 rows, 3 tokens of zero activations
  const Layer L = make_layer(int64_t(kSizes.size()), 512, 256, Scales::fast, 11);
  const Segs s = make_segs(kSizes);
  if (!big_ok(L, s.P)) GTEST_SKIP() << "moe_tc_big does not run on this device / binary";
  Rng rng(12);
  const Acts x = make_acts(400, L.D, {0, 17, 399}, rng);
  check_w13("fast codes, segments of 1..300 rows", L, s, x, rng, 7.0f);
  const Acts h = make_acts(s.P, L.I, {3, 64, s.P - 1}, rng);
  check_w2("fast codes, segments of 1..300 rows", L, s, h);
}

void one_block_every_nibble() {
  // K = 256 (w1|w3) and 128 (w2: one block): the bound is a few 2^-19 of the sum of |products|, so a single wrong
  // nibble, k position or scale shows; the fast range's end codes 104 and 128
  const Layer L = make_layer(3, 256, 128, Scales::edges, 21);
  const Segs s = make_segs({64, 37, 300});
  if (!big_ok(L, s.P)) GTEST_SKIP() << "moe_tc_big does not run on this device / binary";
  Rng rng(22);
  const Acts x = make_acts(150, L.D, {5}, rng);
  check_w13("K 256, codes 104 and 128", L, s, x, rng, 0.0f);
  const Acts h = make_acts(s.P, L.I, {}, rng);
  check_w2("K 128, codes 104 and 128", L, s, h);
}

void slow_blocks_special_codes() {
  // scales outside f16's exact range (103, 129, 60..102, 130..160) in 1 group of 300: those warps' blocks take the
  // per-group path, the others the fast one; then also codes 0 (adds 0) and 255 (outputs non-finite; w1|w3 without
  // the clamp, which would turn a NaN g into the limit)
  {
    const Layer L = make_layer(4, 512, 256, Scales::mixed, 31);
    const Segs s = make_segs({65, 128, 300, 20});
    if (!big_ok(L, s.P)) GTEST_SKIP() << "moe_tc_big does not run on this device / binary";
    Rng rng(32);
    const Acts x = make_acts(200, L.D, {1}, rng);
    check_w13("codes outside the f16 range", L, s, x, rng, 7.0f);
    const Acts h = make_acts(s.P, L.I, {}, rng);
    check_w2("codes outside the f16 range", L, s, h);
  }
  {
    const Layer L = make_layer(4, 512, 256, Scales::specials, 41);
    const Segs s = make_segs({65, 128, 300, 20});
    Rng rng(42);
    const Acts x = make_acts(200, L.D, {}, rng);
    check_w13("codes 0 and 255 too", L, s, x, rng, 0.0f);
    const Acts h = make_acts(s.P, L.I, {}, rng);
    check_w2("codes 0 and 255 too", L, s, h);
  }
}

void long_k_chains() {
  // V4-Flash's K: 4096 for w1|w3 (32 blocks whose activation scales vary: the accumulator's rescale by sa[kb - 1] /
  // sa[kb]) and 2048 for w2 (two layers, so that the host reference stays small), two experts
  const Segs s = make_segs({65, 91});
  {
    const Layer L = make_layer(2, 4096, 256, Scales::fast, 51);
    if (!big_ok(L, s.P)) GTEST_SKIP() << "moe_tc_big does not run on this device / binary";
    Rng rng(52);
    const Acts x = make_acts(120, L.D, {7}, rng);
    check_w13("K 4096", L, s, x, rng, 7.0f);
  }
  {
    const Layer L = make_layer(2, 256, 2048, Scales::fast, 53);
    Rng rng(54);
    const Acts h = make_acts(s.P, L.I, {}, rng);
    check_w2("K 2048", L, s, h);
  }
}


// ---- V4-Flash's shapes on the wgmma kernel ------------------------------------------------------------------------

// Outputs checked against fp64 per expert: its first, middle and last row, at tile-edge and random columns.
std::vector<int64_t> sample_cols(int64_t n, Rng& rng) {
  std::vector<int64_t> c = {0, 1, 2, 7, 8, 63, 64, 65, 127, 128, 129, 255, 256, n - 1};
  for (int i = 0; i < 26; ++i) c.push_back(rng.below(n));
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  return c;
}
std::vector<int64_t> sample_rows(const Segs& s, int64_t e) {
  const int64_t a = s.seg_start[size_t(e)], b = s.seg_start[size_t(e) + 1];
  if (b <= a) return {};
  std::vector<int64_t> r = {a, a + (b - a) / 2, b - 1};
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

// got (wgmma) against base (mma.sync) on every output of the segments: both are within their fp32 bounds of the
// exact sums, so they differ by far less than 2^-8 of the row's rms (a wrong fragment, swizzle or k position moves
// an output by the order of the rms); non-finite exactly where base is. Rows past the segments stay unwritten.
void expect_near_base(const std::string& label, const Run& got, const Run& base, int64_t P, int64_t n) {
  int64_t bad = 0, nonfinite = 0, equal = 0;
  double worst = 0;
  std::string first;
  for (int64_t r = 0; r < P; ++r) {
    double ss = 0;
    int64_t cnt = 0;
    for (int64_t c = 0; c < n; ++c) {
      const double v = base.y[size_t(r * base.ld + c)];
      if (std::isfinite(v)) ss += v * v, ++cnt;
    }
    const double rms = cnt ? std::sqrt(ss / double(cnt)) : 0.0;
    for (int64_t c = 0; c < n; ++c) {
      const float a = got.y[size_t(r * got.ld + c)], b = base.y[size_t(r * base.ld + c)];
      if (!std::isfinite(b) || !std::isfinite(a)) {
        if (std::isfinite(a) != std::isfinite(b)) {
          if (bad++ == 0) first = strf("row %lld col %lld: got %.9g, mma.sync kernel %.9g", (long long)r,
                                       (long long)c, double(a), double(b));
        } else {
          ++nonfinite;
        }
        continue;
      }
      if (a == b) ++equal;
      const double tol = std::ldexp(rms + std::fabs(double(b)), -8) + 1e-30;
      const double e = std::fabs(double(a) - double(b));
      worst = std::max(worst, e / tol);
      if (!(e <= tol) && bad++ == 0)
        first = strf("row %lld col %lld: got %.9g, mma.sync kernel %.9g (row rms %.3g)", (long long)r, (long long)c,
                     double(a), double(b), rms);
    }
  }
  Check u;
  expect_unwritten(got, P, u);
  const bool ok = bad == 0 && u.unwritten_bad == 0;
  std::printf("[moe_wgmma] %s vs the mma.sync kernel: %lld outputs, %lld bitwise equal, %lld non-finite in both, "
              "worst |diff| / tol %.3g, %lld outside, %lld written rows past the segments %s\n",
              label.c_str(), (long long)(P * n), (long long)equal, (long long)nonfinite, worst, (long long)bad,
              (long long)u.unwritten_bad, ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  if (!ok) ADD_FAILURE() << label << ": " << bad << " outputs differ from the mma.sync kernel, "
                         << u.unwritten_bad << " rows past the segments written; first: " << first;
}

void expect_bitwise_runs(const std::string& label, const Run& a, const Run& b) {
  const bool same = a.y.size() == b.y.size() && std::memcmp(a.y.data(), b.y.data(), a.y.size() * 4) == 0;
  std::printf("[moe_wgmma] %s: two runs bitwise equal: %s\n", label.c_str(), same ? "PASS" : "FAIL");
  if (!same) ADD_FAILURE() << label << ": two runs of the wgmma kernel differ";
}

struct KernelScope {  // a prefill expert kernel chosen for a scope (then the one before again)
  explicit KernelScope(cuda::MoeBigKernel k) : before(cuda::moe_big_kernel()) { cuda::set_moe_big_kernel(k); }
  ~KernelScope() { cuda::set_moe_big_kernel(before); }
  cuda::MoeBigKernel before;
};

// w13 and w2 of a layer of V4-Flash's shapes on the wgmma kernel: fp64 on the sampled outputs, the mma.sync kernel
// on all, a second run bitwise.
void flash_layer(const std::string& label, int64_t E, Scales sc, const std::vector<int64_t>& sizes, uint64_t seed) {
  const Layer L = make_layer(E, 4096, 2048, sc, seed);
  const Segs s = make_segs(sizes);
  Rng rng(seed + 1);
  // w1 | w3 + SwiGLU (limit 7 unless codes 255 occur: the clamp would turn a NaN g into the limit)
  const float limit = sc == Scales::specials ? 0.0f : 7.0f;
  const Acts x = make_acts(std::max<int64_t>(s.P / 6, 64), L.D, {0}, rng);
  std::vector<int32_t> tok(size_t(s.P));
  std::vector<float> rw(size_t(s.P));
  for (auto& t : tok) t = int32_t(rng.below(x.rows));
  for (auto& w : rw) w = float(0.25 + rng.uni());
  {
    const Run a = run_big(true, L, s, x, tok, rw, limit), b = run_big(true, L, s, x, tok, rw, limit);
    expect_bitwise_runs(label + " w1|w3", a, b);
    Check c;
    for (int64_t e = 0; e < L.E; ++e)
      for (const int64_t row : sample_rows(s, e))
        for (const int64_t n : sample_cols(L.I, rng)) {
          const Ref g = ref_dot(x, tok[size_t(row)], L.w1[size_t(e)], n);
          const Ref u = ref_dot(x, tok[size_t(row)], L.w3[size_t(e)], n);
          const double w = rw[size_t(row)];
          const double want = std::isnan(g.v) || std::isnan(u.v) ? NAN : swiglu(g.v, u.v, limit, w);
          const double silu_max = std::max(std::fabs(g.v), 0.3) + 1.1 * g.bound;
          const double bound = w * (1.1 * g.bound * (std::fabs(u.v) + u.bound) + silu_max * u.bound) +
                               std::ldexp(std::fabs(want), -21) + 1e-37;
          note(c, a.y[size_t(row * a.ld + n)], want, bound,
               strf("expert %lld row %lld col %lld", (long long)e, (long long)row, (long long)n));
        }
    expect_unwritten(a, s.P, c);
    report(label + " w1|w3 [2048, 4096] + SwiGLU, sampled outputs (wgmma)", c);
    Run base;
    {
      KernelScope k(cuda::MoeBigKernel::mma);
      base = run_big(true, L, s, x, tok, rw, limit);
    }
    expect_near_base(label + " w1|w3", a, base, s.P, L.I);
  }
  {
    const Acts h = make_acts(s.P, L.I, {1}, rng);
    const std::vector<int32_t> tok0(size_t(s.P), 0);
    const std::vector<float> rw1(size_t(s.P), 1.0f);
    const Run a = run_big(false, L, s, h, tok0, rw1, 0.0f), b = run_big(false, L, s, h, tok0, rw1, 0.0f);
    expect_bitwise_runs(label + " w2", a, b);
    Check c;
    for (int64_t e = 0; e < L.E; ++e)
      for (const int64_t row : sample_rows(s, e))
        for (const int64_t n : sample_cols(L.D, rng)) {
          const Ref f = ref_dot(h, row, L.w2[size_t(e)], n);
          note(c, a.y[size_t(row * a.ld + n)], f.v, f.bound,
               strf("expert %lld row %lld col %lld", (long long)e, (long long)row, (long long)n));
        }
    expect_unwritten(a, s.P, c);
    report(label + " w2 [4096, 2048], sampled outputs (wgmma)", c);
    Run base;
    {
      KernelScope k(cuda::MoeBigKernel::mma);
      base = run_big(false, L, s, h, tok0, rw1, 0.0f);
    }
    expect_near_base(label + " w2", a, base, s.P, L.D);
  }
}

// Whether the wgmma kernel must run here: compute capability 9.0 (the build's default architecture is sm_90a).
bool wgmma_expected() {
  int dev = 0, major = 0, minor = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
         minor == 0;
}

#define DSV4_REQUIRE_WGMMA()                                                                                      \
  do {                                                                                                            \
    DSV4_REQUIRE_GPU();                                                                                           \
    if (!wgmma_expected()) GTEST_SKIP() << "the wgmma kernel runs on compute capability 9.0 only";                \
    ASSERT_TRUE(cuda::gemm_internal::moe_tc_big_wgmma_ok())                                                       \
        << "compute capability 9.0 but the wgmma kernel does not run (not an sm_90a build, or its shared memory "  \
           "refused)";                                                                                            \
  } while (0)

}  // namespace

TEST(CudaMoeTcBig, FastBlocksWithinFp32BoundOfExactProducts) {
  DSV4_REQUIRE_GPU();
  KernelScope k(cuda::MoeBigKernel::mma);
  fast_blocks();
}
TEST(CudaMoeTcBig, OneBlockEveryNibbleTight) {
  DSV4_REQUIRE_GPU();
  KernelScope k(cuda::MoeBigKernel::mma);
  one_block_every_nibble();
}
TEST(CudaMoeTcBig, SlowBlocksAndSpecialScaleCodes) {
  DSV4_REQUIRE_GPU();
  KernelScope k(cuda::MoeBigKernel::mma);
  slow_blocks_special_codes();
}
TEST(CudaMoeTcBig, LongKChainsBlockScales) {
  DSV4_REQUIRE_GPU();
  KernelScope k(cuda::MoeBigKernel::mma);
  long_k_chains();
}

TEST(CudaMoeWgmma, FastBlocksWithinFp32BoundOfExactProducts) {
  KernelScope k(cuda::MoeBigKernel::auto_);  // (the default is mma.sync until this kernel has run on a GPU)
  DSV4_REQUIRE_WGMMA();
  fast_blocks();
}
TEST(CudaMoeWgmma, OneBlockEveryNibbleTight) {
  KernelScope k(cuda::MoeBigKernel::auto_);  // (the default is mma.sync until this kernel has run on a GPU)
  DSV4_REQUIRE_WGMMA();
  one_block_every_nibble();
}
TEST(CudaMoeWgmma, SlowBlocksAndSpecialScaleCodes) {
  KernelScope k(cuda::MoeBigKernel::auto_);  // (the default is mma.sync until this kernel has run on a GPU)
  DSV4_REQUIRE_WGMMA();
  slow_blocks_special_codes();
}
TEST(CudaMoeWgmma, LongKChainsBlockScales) {
  KernelScope k(cuda::MoeBigKernel::auto_);  // (the default is mma.sync until this kernel has run on a GPU)
  DSV4_REQUIRE_WGMMA();
  long_k_chains();
}

TEST(CudaMoeWgmma, FlashShapes256ExpertsRagged) {
  KernelScope k(cuda::MoeBigKernel::auto_);  // (the default is mma.sync until this kernel has run on a GPU)
  DSV4_REQUIRE_WGMMA();
  // V4-Flash: hidden 4096, moe_intermediate 2048, 256 experts; segments of 17..140 rows (ragged: partial 64-row
  // tiles everywhere), a few of exactly 64, 65, 128 and 1 row; E8M0 codes 110..126 and the fast range's ends
  Rng rng(61);
  std::vector<int64_t> sizes(256);
  for (auto& c : sizes) c = 17 + rng.below(124);
  sizes[3] = 64, sizes[4] = 65, sizes[100] = 128, sizes[200] = 1, sizes[255] = 2;
  flash_layer("V4-Flash 256 experts, codes 104..128", 256, Scales::edges, sizes, 62);
}

TEST(CudaMoeWgmma, FlashShapesEveryScaleCodeClass) {
  KernelScope k(cuda::MoeBigKernel::auto_);  // (the default is mma.sync until this kernel has run on a GPU)
  DSV4_REQUIRE_WGMMA();
  // codes outside the f16 range (103, 129, 60..102, 130..160) and the special 0 and 255 at V4-Flash's K: most
  // blocks on the per-group path, outputs non-finite where a 255 meets them
  flash_layer("V4-Flash 8 experts, every code class", 8, Scales::specials, {65, 300, 17, 128, 64, 200, 1, 129}, 71);
  flash_layer("V4-Flash 8 experts, codes outside the f16 range", 8, Scales::mixed, {100, 64, 33, 250, 129, 17, 70, 90},
              81);
}

}  // namespace dsv4::test::gpu
