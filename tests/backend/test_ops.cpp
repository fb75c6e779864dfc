// Unit tests of the CPU ops (src/backend/ops.h) against direct formulas from spec §4/§5.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/gemm.h"
#include "core/error.h"
#include "format/numeric.h"

namespace dsv4 {
namespace {

const Ops& ops() { return cpu_backend().ops(); }
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> randv(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
bool is_bf16(float x) { return round_to_bf16(x) == x; }

TEST(Ops, RmsNormMatchesFormulaAndRoundsToBf16) {
  auto x = randv(3 * 96, 1), w = randv(96, 2);
  std::vector<float> y(x.size()), yb(x.size());
  ops().rmsnorm(x.data(), 3, 96, w.data(), 1e-6f, false, y.data());
  ops().rmsnorm(x.data(), 3, 96, w.data(), 1e-6f, true, yb.data());
  for (int r = 0; r < 3; ++r) {
    double ss = 0;
    for (int i = 0; i < 96; ++i) ss += double(x[r * 96 + i]) * x[r * 96 + i];
    const double s = 1.0 / std::sqrt(ss / 96 + 1e-6);
    for (int i = 0; i < 96; ++i) {
      EXPECT_NEAR(y[r * 96 + i], w[i] * x[r * 96 + i] * s, 1e-5);
      EXPECT_TRUE(is_bf16(yb[r * 96 + i]));
      EXPECT_EQ(yb[r * 96 + i], round_to_bf16(y[r * 96 + i]));
    }
  }
}

TEST(Ops, CheckFiniteFlagsEachNonFiniteRow) {
  // rows of logits width and short rows: one NaN / +inf / -inf anywhere (vector body and tail) flags its row only;
  // the largest finite values, subnormals and -0 do not
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t dim : {int64_t(129280), int64_t(37), int64_t(1)}) {
    for (int64_t at : {int64_t(0), dim / 2, dim - 1}) {
      for (float bad : {nan, kInf, -kInf}) {
        std::vector<float> x = randv(size_t(3 * dim), 9);
        x[0] = std::numeric_limits<float>::max();
        x[size_t(dim - 1)] = -std::numeric_limits<float>::max();
        x[size_t(2 * dim)] = std::numeric_limits<float>::denorm_min();
        x[size_t(3 * dim - 1)] = -0.0f;
        x[size_t(dim + at)] = bad;
        int32_t flags[3] = {-1, -1, -1};
        ops().check_finite(x.data(), 3, dim, flags);
        EXPECT_EQ(flags[0], 0) << dim << " " << at;
        EXPECT_NE(flags[1], 0) << dim << " " << at << " " << bad;
        EXPECT_EQ(flags[2], 0) << dim << " " << at;
      }
    }
  }
}

TEST(Ops, HeadRmsBf16AndFp32) {
  auto x = randv(2 * 128, 3, 5.0f);
  for (auto& v : x) v = round_to_bf16(v);
  auto a = x, b = x;
  ops().head_rms(a.data(), 2, 128, 1e-6f, false);
  ops().head_rms(b.data(), 2, 128, 1e-6f, true);
  for (int r = 0; r < 2; ++r) {
    double ss = 0;
    for (int i = 0; i < 128; ++i) ss += double(a[r * 128 + i]) * a[r * 128 + i];
    EXPECT_NEAR(ss / 128, 1.0, 1e-4);
  }
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_TRUE(is_bf16(b[i]));
    EXPECT_NEAR(b[i], a[i], 0.02 * std::abs(a[i]) + 1e-3);
  }
}

TEST(Ops, RopeRotatesLastDimsAndInverts) {
  const int64_t n = 2, H = 3, Dh = 16, rd = 8;
  auto x = randv(size_t(n * H * Dh), 4);
  std::vector<float> cs(size_t(n * rd));
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < rd / 2; ++i) {
      const float a = 0.3f * float(t + 1) * float(i + 1);
      cs[size_t(t * rd + 2 * i)] = std::cos(a);
      cs[size_t(t * rd + 2 * i + 1)] = std::sin(a);
    }
  auto y = x;
  ops().rope(y.data(), n, H, Dh, rd, cs.data(), false, false);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* a = &x[size_t((t * H + h) * Dh)];
      const float* b = &y[size_t((t * H + h) * Dh)];
      for (int i = 0; i < Dh - rd; ++i) EXPECT_EQ(a[i], b[i]);  // nope dims untouched
      for (int i = 0; i < rd / 2; ++i) {                        // interleaved complex multiply
        const float c = cs[size_t(t * rd + 2 * i)], s = cs[size_t(t * rd + 2 * i + 1)];
        const float re = a[Dh - rd + 2 * i], im = a[Dh - rd + 2 * i + 1];
        EXPECT_NEAR(b[Dh - rd + 2 * i], re * c - im * s, 1e-6);
        EXPECT_NEAR(b[Dh - rd + 2 * i + 1], re * s + im * c, 1e-6);
      }
    }
  ops().rope(y.data(), n, H, Dh, rd, cs.data(), true, false);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}

TEST(Ops, Fp8SimulationIsBlockwiseE4m3) {
  // block 64 over the first 448 columns of a 512-wide row; the last 64 stay untouched
  auto x = randv(2 * 512, 5, 3.0f);
  auto y = x;
  ops().fp8_sim(y.data(), 2, 512, 448, 64);
  for (int r = 0; r < 2; ++r) {
    for (int b = 0; b < 7; ++b) {
      float amax = 0;
      for (int i = 0; i < 64; ++i) amax = std::max(amax, std::abs(x[r * 512 + b * 64 + i]));
      const float s = std::exp2(std::ceil(std::log2(std::max(amax, 1e-4f) / 448.0f)));
      for (int i = 0; i < 64; ++i) {
        const float v = x[r * 512 + b * 64 + i];
        const float q = e4m3fn_to_float(float_to_e4m3fn_rne_satfinite(v / s)) * s;
        EXPECT_EQ(y[r * 512 + b * 64 + i], round_to_bf16(q));
      }
    }
    for (int i = 448; i < 512; ++i) EXPECT_EQ(y[r * 512 + i], x[r * 512 + i]);
  }
}

TEST(Ops, Fp4SimulationProducesE2m1Multiples) {
  auto x = randv(128, 6, 2.0f);
  auto y = x;
  ops().fp4_sim(y.data(), 1, 128);
  const float mags[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int b = 0; b < 4; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::abs(x[b * 32 + i]));
    const float s = std::exp2(std::ceil(std::log2(amax / 6.0f)));
    for (int i = 0; i < 32; ++i) {
      const float q = std::abs(y[b * 32 + i]) / s;
      EXPECT_TRUE(std::find(std::begin(mags), std::end(mags), q) != std::end(mags)) << q;
      EXPECT_LE(std::abs(y[b * 32 + i] - x[b * 32 + i]), s * 1.0f + 1e-6f);
    }
  }
}

TEST(Ops, HadamardIsOrthonormalSylvester) {
  std::vector<float> e(128, 0.0f);
  e[0] = 1.0f;
  ops().hadamard(e.data(), 1, 128, false);
  for (float v : e) EXPECT_NEAR(v, 1.0 / std::sqrt(128.0), 1e-7);
  std::vector<float> e1(8, 0.0f);
  e1[1] = 1.0f;  // column 1 of the natural-order H8: +,-,+,-,...
  ops().hadamard(e1.data(), 1, 8, false);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(e1[i], (i % 2 ? -1 : 1) / std::sqrt(8.0), 1e-7);
  auto x = randv(2 * 128, 7);
  auto y = x;
  ops().hadamard(y.data(), 2, 128, false);
  ops().hadamard(y.data(), 2, 128, false);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}

TEST(Ops, HcPreSinkhornIsDoublyStochasticAndHcPostUsesTransposedComb) {
  const int hc = 4;
  const int64_t D = 32, n = 2, mix = (2 + hc) * hc;
  auto X = randv(size_t(n * hc * D), 8);
  auto fn = randv(size_t(mix * hc * D), 9, 0.05f);
  std::vector<float> scale{0.7f, 0.9f, 1.3f};
  auto base = randv(size_t(mix), 10, 0.5f);
  std::vector<float> u(size_t(n * D)), post(size_t(n * hc)), comb(size_t(n * hc * hc));
  ops().hc_pre(X.data(), n, hc, D, fn.data(), scale.data(), base.data(), 20, 1e-6f, 1e-6f, false, u.data(),
               post.data(), comb.data());
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < hc; ++j) {
      double rs = 0, cs = 0;
      for (int k = 0; k < hc; ++k) {
        rs += comb[size_t(t * 16 + j * 4 + k)];
        cs += comb[size_t(t * 16 + k * 4 + j)];
      }
      EXPECT_NEAR(rs, 1.0, 1e-3);
      EXPECT_NEAR(cs, 1.0, 1e-5);
      EXPECT_GT(post[size_t(t * hc + j)], 0.0f);
      EXPECT_LT(post[size_t(t * hc + j)], 2.0f);
    }
    // u = Σ_j pre_j x_j with pre_j = sigmoid(mix_j * s0 + b_j) + eps
    const float* x = &X[size_t(t * hc * D)];
    double ss = 0;
    for (int64_t i = 0; i < hc * D; ++i) ss += double(x[i]) * x[i];
    const double r = 1.0 / std::sqrt(ss / double(hc * D) + 1e-6);
    std::vector<double> pre(hc);
    for (int j = 0; j < hc; ++j) {
      double m = 0;
      for (int64_t i = 0; i < hc * D; ++i) m += double(fn[size_t(j * hc * D + i)]) * x[i];
      pre[size_t(j)] = 1.0 / (1.0 + std::exp(-(m * r * scale[0] + base[size_t(j)]))) + 1e-6;
    }
    for (int64_t d = 0; d < D; ++d) {
      double s = 0;
      for (int j = 0; j < hc; ++j) s += pre[size_t(j)] * x[j * D + d];
      EXPECT_NEAR(u[size_t(t * D + d)], s, 1e-4);
    }
  }
  // hc_post orientation: X'_k = post_k f + Σ_j C[j][k] X_j with a non-symmetric C
  std::vector<float> C(16), P{0.5f, 1.0f, 1.5f, 0.25f};
  for (int j = 0; j < 4; ++j)
    for (int k = 0; k < 4; ++k) C[size_t(j * 4 + k)] = float(j * 4 + k + 1) / 10.0f;
  auto f = randv(size_t(D), 11);
  std::vector<float> Xo(size_t(hc * D));
  ops().hc_post(f.data(), X.data(), P.data(), C.data(), 1, hc, D, false, Xo.data());
  for (int k = 0; k < 4; ++k)
    for (int64_t d = 0; d < D; ++d) {
      double s = P[size_t(k)] * f[size_t(d)];
      for (int j = 0; j < 4; ++j) s += C[size_t(j * 4 + k)] * X[size_t(j * D + d)];
      EXPECT_NEAR(Xo[size_t(k * D + d)], s, 1e-5);
    }
}

TEST(Ops, SparseAttentionWithSinkMatchesNaiveSoftmax) {
  const int64_t n = 2, H = 3, dim = 32, nk = 150, K = 140;
  auto q = randv(size_t(n * H * dim), 12), kva = randv(size_t(100 * dim), 13), kvb = randv(size_t(50 * dim), 14);
  std::vector<float> sink{0.5f, -1.0f, 2.0f};
  std::vector<int32_t> idx(size_t(n * K), -1);
  std::mt19937 rng(15);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < K; ++i)
      if (rng() % 5) idx[size_t(t * K + i)] = int32_t(rng() % nk);
  // index i < 100: window rows (ring = kva rows 0..59, fresh = kva rows 60..99), else compressed row i - 100;
  // split into the op's two lists: the first KW entries index window rows, the rest compressed rows
  const int64_t KW = 70, KC = K - KW;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < K; ++i) {
      int32_t& j = idx[size_t(t * K + i)];
      if (j < 0) continue;
      if (i < KW) j = j % 100;
      else j = 100 + j % 50;
    }
  auto row = [&](int32_t j) { return j < 100 ? kva.data() + j * dim : kvb.data() + (j - 100) * dim; };
  std::vector<int32_t> widx(size_t(n * KW)), cidx(size_t(n * KC));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < KW; ++i) widx[size_t(t * KW + i)] = idx[size_t(t * K + i)];
    for (int64_t i = 0; i < KC; ++i) {
      const int32_t j = idx[size_t(t * K + KW + i)];
      cidx[size_t(t * KC + i)] = j < 0 ? -1 : j - 100;
    }
  }
  KvRows src{kva.data(), 60, kva.data() + 60 * dim, 40, kvb.data(), 50, dim};
  std::vector<float> o(size_t(n * H * dim)), ob(o.size());
  const float scale = 0.17f;
  ops().sparse_attention(q.data(), n, H, src, widx.data(), KW, cidx.data(), KC, sink.data(), scale, false, o.data());
  ops().sparse_attention(q.data(), n, H, src, widx.data(), KW, cidx.data(), KC, sink.data(), scale, true, ob.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> s;
      std::vector<const float*> rows;
      for (int64_t i = 0; i < K; ++i) {
        const int32_t j = idx[size_t(t * K + i)];
        if (j < 0) continue;
        double d = 0;
        for (int64_t c = 0; c < dim; ++c) d += double(q[size_t((t * H + h) * dim + c)]) * row(j)[c];
        s.push_back(d * scale);
        rows.push_back(row(j));
      }
      double m = *std::max_element(s.begin(), s.end()), den = std::exp(sink[size_t(h)] - m);
      for (double v : s) den += std::exp(v - m);
      for (int64_t c = 0; c < dim; ++c) {
        double acc = 0;
        for (size_t i = 0; i < s.size(); ++i) acc += std::exp(s[i] - m) * rows[i][c];
        EXPECT_NEAR(o[size_t((t * H + h) * dim + c)], acc / den, 1e-5);
        EXPECT_NEAR(ob[size_t((t * H + h) * dim + c)], acc / den, 2e-2);
        EXPECT_TRUE(is_bf16(ob[size_t((t * H + h) * dim + c)]));
      }
    }
  // no valid entry: zero output
  std::vector<int32_t> none(size_t(K), -1);
  std::vector<float> z(size_t(H * dim), 1.0f);
  ops().sparse_attention(q.data(), 1, H, src, none.data(), KW, none.data(), KC, sink.data(), scale, true, z.data());
  for (float v : z) EXPECT_EQ(v, 0.0f);
  // thread count invariance
  std::vector<float> o1(o.size());
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  ops().sparse_attention(q.data(), n, H, src, widx.data(), KW, cidx.data(), KC, sink.data(), scale, true, o1.data());
  omp_set_num_threads(saved);
  EXPECT_EQ(o1, ob);
}

TEST(Ops, CompressPoolIgnoresMinusInfAndReadsBothSources) {
  // 3 candidates of width 2 (coff 1): step rows 0, 1 and state row 0 (index 2); a -1 slot is empty
  std::vector<float> kv{1, 10, 3, 20}, s{0, -kInf, 0, 0};
  std::vector<float> skv{5, 30}, ss{-kInf, 0};
  std::vector<int32_t> cand{0, 1, 2, -1};
  std::vector<float> out(2);
  ops().compress_pool(kv.data(), s.data(), 2, skv.data(), ss.data(), cand.data(), 1, 4, 1, 2, out.data());
  EXPECT_NEAR(out[0], 2.0f, 1e-6);   // mean of 1, 3
  EXPECT_NEAR(out[1], 25.0f, 1e-5);  // mean of 20, 30
  // coff 2: candidates of the first half read columns [0, c), the second half [c, 2c)
  std::vector<float> kv2{1, 2, 3, 4}, s2{0, 0, 0, 0};  // one step row of width 4 (c = 2)
  std::vector<int32_t> cand2{0, -1, 0, -1};            // n_cand 4: j = 0 (first half), j = 2 (second half)
  ops().compress_pool(kv2.data(), s2.data(), 1, nullptr, nullptr, cand2.data(), 1, 4, 2, 2, out.data());
  EXPECT_NEAR(out[0], 2.0f, 1e-6);  // mean of 1 (col 0) and 3 (col 2)
  EXPECT_NEAR(out[1], 3.0f, 1e-6);  // mean of 2 and 4
}

TEST(Ops, IndexerTopkScoresTiesAndPadding) {
  const int64_t H = 2, dim = 4;
  // keys: j-th key = e_(j%4) * (j+1); query head 0 = (1,1,1,1), head 1 = (-1,-1,-1,-1) (relu kills it)
  std::vector<float> keys(8 * 4, 0.0f);
  for (int j = 0; j < 8; ++j) keys[size_t(j * 4 + j % 4)] = float(j % 4 == 3 ? 2 : 1);
  std::vector<float> q{1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1};
  std::vector<float> w{1.0f, 5.0f, 1.0f, 5.0f};
  std::vector<int32_t> nv{8, 2};
  std::vector<int32_t> sel(2 * 3);
  PagedRows kr;
  kr.rows = keys.data();
  ops().indexer_topk(q.data(), 2, H, dim, kr, nv.data(), 8, w.data(), 3, false, sel.data());
  // scores token 0: j=3,7 -> 2; others 1: top3 = 3, 7, 0 (ties -> lower index)
  EXPECT_EQ(sel[0], 3);
  EXPECT_EQ(sel[1], 7);
  EXPECT_EQ(sel[2], 0);
  // token 1 sees 2 rows only
  EXPECT_EQ(sel[3], 0);
  EXPECT_EQ(sel[4], 1);
  EXPECT_EQ(sel[5], -1);
}

// Paged keys: the same logical keys scattered over pages of 2 rows in a pool, two sequences with their own page
// tables in one call. The selection (by score, ties -> lower LOGICAL index) is the contiguous one, mapped to pool rows.
TEST(Ops, IndexerTopkPagedKeysSelectPoolRows) {
  const int64_t H = 2, dim = 4, pr = 2;
  std::vector<float> logical(8 * 4, 0.0f);
  for (int j = 0; j < 8; ++j) logical[size_t(j * 4 + j % 4)] = float(j % 4 == 3 ? 2 : 1);
  // sequence A: logical pages 0..3 -> pool pages 5, 1, 6, 3; sequence B (other keys): pages 0, 2
  const std::vector<int32_t> pages{5, 1, 6, 3, 0, 2};
  std::vector<float> pool(7 * pr * 4, 0.0f);
  for (int j = 0; j < 8; ++j) {
    const int64_t row = int64_t(pages[size_t(j / pr)]) * pr + j % pr;
    std::copy(logical.begin() + j * 4, logical.begin() + j * 4 + 4, pool.begin() + row * 4);
  }
  for (int j = 0; j < 4; ++j) pool[size_t((pages[size_t(4 + j / pr)] * pr + j % pr) * 4 + 3 - j % 4)] = 3.0f;  // B
  std::vector<float> q{1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, 0, 0, 0, 0};
  std::vector<float> w{1.0f, 5.0f, 1.0f, 5.0f, 1.0f, 1.0f};
  std::vector<int32_t> nv{8, 2, 3}, table{0, 0, 4};
  std::vector<int32_t> sel(3 * 3);
  PagedRows kr;
  kr.rows = pool.data();
  kr.pages = pages.data();
  kr.table = table.data();
  kr.page_rows = pr;
  kr.max_run = 2;
  ops().indexer_topk(q.data(), 3, H, dim, kr, nv.data(), 8, w.data(), 3, false, sel.data());
  auto prow = [&](int t0, int j) { return int32_t(pages[size_t(t0 + j / pr)] * pr + j % pr); };
  EXPECT_EQ(sel[0], prow(0, 3));
  EXPECT_EQ(sel[1], prow(0, 7));
  EXPECT_EQ(sel[2], prow(0, 0));
  EXPECT_EQ(sel[3], prow(0, 0));
  EXPECT_EQ(sel[4], prow(0, 1));
  EXPECT_EQ(sel[5], -1);
  // sequence B: every visible key scores 3 (ties): logical order 0, 1, 2
  EXPECT_EQ(sel[6], prow(4, 0));
  EXPECT_EQ(sel[7], prow(4, 1));
  EXPECT_EQ(sel[8], prow(4, 2));
}

TEST(Ops, RouteHashAndBiasedTopk) {
  const int64_t E = 6, k = 2;
  std::vector<float> logits{0.1f, 2.0f, -1.0f, 0.5f, 25.0f, 1.0f};
  std::vector<float> bias{0, 0, 100.0f, 0, 0, 0};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  auto sc = [](float l) { return float(std::sqrt(l > 20 ? double(l) : std::log1p(std::exp(double(l))))); };
  ops().route(logits.data(), 1, E, k, bias.data(), nullptr, nullptr, 1.5f, ids.data(), w.data());
  EXPECT_EQ(ids[0], 2);  // selected by bias
  EXPECT_EQ(ids[1], 4);
  const float s = sc(-1.0f) + sc(25.0f);
  EXPECT_NEAR(w[0], sc(-1.0f) / s * 1.5f, 1e-6);  // weights from the unbiased scores
  EXPECT_NEAR(w[1], sc(25.0f) / s * 1.5f, 1e-6);
  std::vector<int32_t> hid{0, 0, 5, 0};  // tid2eid [vocab 2, k 2]; the token is id 1
  std::vector<int32_t> tok{1};
  ops().route(logits.data(), 1, E, k, nullptr, hid.data(), tok.data(), 1.0f, ids.data(), w.data());
  EXPECT_EQ(ids[0], 5);
  EXPECT_EQ(ids[1], 0);
  EXPECT_NEAR(w[0] + w[1], 1.0f, 1e-6);
}

TEST(Ops, SwigluClamps) {
  std::vector<float> g{20.0f, -3.0f, 1.0f}, up{-50.0f, 2.0f, 30.0f}, h(3);
  std::vector<float> rw{0.5f};
  ops().swiglu(g.data(), up.data(), 1, 3, 10.0f, rw.data(), false, h.data());
  auto silu = [](float v) { return v / (1.0f + std::exp(-v)); };
  EXPECT_NEAR(h[0], 0.5f * silu(10.0f) * -10.0f, 1e-5);
  EXPECT_NEAR(h[1], 0.5f * silu(-3.0f) * 2.0f, 1e-6);
  EXPECT_NEAR(h[2], 0.5f * silu(1.0f) * 10.0f, 1e-6);
  ops().swiglu(g.data(), up.data(), 1, 3, 0.0f, nullptr, true, h.data());  // no limit
  EXPECT_EQ(h[0], round_to_bf16(silu(20.0f) * -50.0f));
}

}  // namespace
}  // namespace dsv4

namespace dsv4 {
namespace {

// FP4 expert weight [rows, cols] of random codes and E8M0 scales near 1 (owned bytes + view).
struct Fp4Weight {
  std::vector<uint8_t> w, s;
  WeightView v;
};
Fp4Weight fp4_weight(int64_t rows, int64_t cols, uint32_t seed) {
  Fp4Weight f;
  std::mt19937 rng(seed);
  f.w.resize(size_t(rows * cols / 2));
  for (auto& b : f.w) b = uint8_t(rng());
  f.s.resize(size_t(rows * (cols / 32)));
  for (auto& b : f.s) b = uint8_t(120 + rng() % 4);
  f.v = WeightView{GemmFormat::fp4, f.w.data(), f.s.data(), false, rows, cols, 1, 32};
  return f;
}

TEST(Ops, LinearPairIsTheTwoLinears) {
  // wq_a / wkv-like: one x, two weights of the same K and different rows; each output bitwise its own linear()
  const int64_t K = 256;
  const Fp4Weight a = fp4_weight(96, K, 71), b = fp4_weight(32, K, 72), c = fp4_weight(32, 2 * K, 73);
  const LinearOpts q = quantized_linear_opts(Numerics::reference);
  for (int64_t n : {1, 5}) {
    std::vector<float> x = randv(size_t(n * K), 80 + uint32_t(n));
    std::vector<float> ya(size_t(n * 96), -1.0f), yb(size_t(n * 32), -1.0f), wa(ya.size()), wb(yb.size());
    ops().linear_pair(a.v, b.v, x.data(), n, ya.data(), yb.data(), q);
    ops().linear(a.v, x.data(), n, wa.data(), q);
    ops().linear(b.v, x.data(), n, wb.data(), q);
    EXPECT_EQ(0, std::memcmp(ya.data(), wa.data(), ya.size() * 4)) << n;
    EXPECT_EQ(0, std::memcmp(yb.data(), wb.data(), yb.size() * 4)) << n;
  }
  // different K, or a row range that is not the whole of both: an internal error, nothing computed
  std::vector<float> x(2 * K), ya(96), yb(32);
  EXPECT_THROW(ops().linear_pair(a.v, c.v, x.data(), 1, ya.data(), yb.data(), q), Error);
  LinearOpts part = q;
  part.row_end = 32;
  EXPECT_THROW(ops().linear_pair(a.v, b.v, x.data(), 1, ya.data(), yb.data(), part), Error);
}

TEST(Ops, MoeIndependentOfThreadCount) {
  // Decode (1 token: 3 items with rows) and a small prefill, on 1 thread (items and products sequential), 2 threads
  // (items in parallel) and more threads than items (items one after the other, each product on the whole pool:
  // the experts' products are big enough to fork): bitwise the same output. Small experts (D 128, I 64: a demo
  // model's decode) run their items on the calling thread whatever the pool: the same output again.
  for (const auto& [D, I] : {std::pair<int64_t, int64_t>{2048, 1024}, std::pair<int64_t, int64_t>{128, 64}}) {
    const int64_t E = 4, k = 2;
    std::vector<Fp4Weight> keep;
    std::vector<ExpertView> ev(size_t(E + 1));
    for (int64_t e = 0; e <= E; ++e) {
      keep.push_back(fp4_weight(I, D, uint32_t(10 * e + 1)));
      ev[size_t(e)].w1 = keep.back().v;
      keep.push_back(fp4_weight(D, I, uint32_t(10 * e + 2)));
      ev[size_t(e)].w2 = keep.back().v;
      keep.push_back(fp4_weight(I, D, uint32_t(10 * e + 3)));
      ev[size_t(e)].w3 = keep.back().v;
    }
    MoeWeights mw;
    mw.experts = ev.data();
    mw.n_experts = E;
    mw.shared = &ev[size_t(E)];
    const LinearOpts q = quantized_linear_opts(Numerics::reference);
    const int saved = omp_get_max_threads();
    for (int64_t n : {1, 3}) {
      std::vector<float> x = randv(size_t(n * D), 40 + uint32_t(n));
      for (float& v : x) v = round_to_bf16(v);
      std::vector<int32_t> ids(size_t(n * k));
      std::vector<float> wts(size_t(n * k));
      for (int64_t i = 0; i < n * k; ++i) {
        ids[size_t(i)] = int32_t((i * 3 + i / k) % E);
        wts[size_t(i)] = 0.25f + 0.125f * float(i);
      }
      std::vector<std::vector<float>> ys;
      for (int th : {1, 2, 2 * omp_get_num_procs() + 5}) {
        omp_set_num_threads(th);
        std::vector<float> y(size_t(n * D), -1.0f);
        ops().moe(mw, x.data(), n, ids.data(), wts.data(), k, 10.0f, q, true, y.data());
        ys.push_back(y);
      }
      omp_set_num_threads(saved);
      {  // the op's definition, expert by expert on one thread: every pair's expert output (linear / swiglu / linear,
         // the routing weight inside swiglu), summed per token in ascending (expert id, pair) order, + shared, bf16
        omp_set_num_threads(1);
        auto expert = [&](const ExpertView& ev1, const float* xt, const float* rw) {
          std::vector<float> g(static_cast<size_t>(I)), u(static_cast<size_t>(I)), o(static_cast<size_t>(D));
          linear(ev1.w1, xt, 1, g.data(), q);
          linear(ev1.w3, xt, 1, u.data(), q);
          ops().swiglu(g.data(), u.data(), 1, I, 10.0f, rw, true, g.data());
          linear(ev1.w2, g.data(), 1, o.data(), q);
          return o;
        };
        std::vector<float> want(size_t(n * D), 0.0f);
        for (int64_t t = 0; t < n; ++t) {
          float* yt = want.data() + t * D;
          for (int64_t e = 0; e < E; ++e)
            for (int64_t i = 0; i < k; ++i)
              if (ids[size_t(t * k + i)] == e) {
                const std::vector<float> o = expert(ev[size_t(e)], x.data() + t * D, &wts[size_t(t * k + i)]);
                for (int64_t d = 0; d < D; ++d) yt[d] += o[size_t(d)];
              }
          const std::vector<float> o = expert(ev[size_t(E)], x.data() + t * D, nullptr);
          for (int64_t d = 0; d < D; ++d) yt[d] = round_to_bf16(yt[d] + o[size_t(d)]);
        }
        omp_set_num_threads(saved);
        EXPECT_EQ(0, std::memcmp(want.data(), ys[0].data(), want.size() * 4)) << "D " << D << " n_tok " << n;
      }
      bool nonzero = false;
      for (float v : ys[0]) nonzero = nonzero || v != 0.0f;
      EXPECT_TRUE(nonzero) << n;
      for (size_t i = 1; i < ys.size(); ++i)
        EXPECT_EQ(0, std::memcmp(ys[0].data(), ys[i].data(), ys[0].size() * 4))
            << "D " << D << " n_tok " << n << " run " << i;
    }
  }
}

}  // namespace
}  // namespace dsv4
