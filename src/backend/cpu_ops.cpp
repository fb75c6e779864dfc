// CPU ops of the DeepSeek V4 forward pass (see ops.h for the contract, spec §4/§5 for the math).
#include "backend/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/act_quant.h"
#include "backend/exp_array.h"
#include "backend/gemm.h"
#include "backend/parallel.h"
#include "core/error.h"
#include "format/numeric.h"
#include "format/row_format.h"

namespace dsv4 {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kMaxHc = 16;                        // hc_mult bound of the fixed-size per-token arrays
constexpr int kMaxMix = (2 + kMaxHc) * kMaxHc;

// Parallelize a loop only when it carries enough work to amortize the OpenMP fork/join (tiny models, decode). With
// sleeping workers (OMP_WAIT_POLICY=passive, what a server sharing its cores wants) a fork is a futex wake and a
// context switch on each side: ~40 us of CPU per region in the kernel on a 2-vCPU VM, more than the loops of a small
// model's batch of 8 decodes (the demo: 30 regions per step at a bar of 2^16, 9 at 2^18; 9% more tokens per
// CPU-second at 8 clients). Results do not depend on it: every output element is computed by one thread in a fixed
// order either way.
inline bool par(int64_t work) { return work >= (int64_t(1) << 18); }

inline float bf(float x) { return round_to_bf16(x); }
inline float maybe_bf(float x, bool b) { return b ? round_to_bf16(x) : x; }

// round_to_bf16 without a branch (NaN: the quiet bit set, the rest RNE on the bit pattern, as float_to_bf16_rne), so
// that loops of it vectorize; bitwise round_to_bf16.
inline float bf_nb(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  const uint32_t r = (b & 0x7FFFFFFFu) > 0x7F800000u ? (b | 0x00400000u) : (b + 0x7FFFu + ((b >> 16) & 1u));
  const uint32_t o = r & 0xFFFF0000u;
  float y;
  std::memcpy(&y, &o, 4);
  return y;
}

// Hot loops of the attention ops, compiled twice (AVX2 and the baseline ISA, chosen at load time): the same separate
// multiplies and adds per element in the same order (no FMA contraction: the build is ISO C++), only wider vectors,
// so results are bitwise those of the baseline build.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DSV4_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DSV4_CLONES
#endif

// Dot product with 8 fixed partial sums (deterministic, vectorizable).
DSV4_CLONES float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// 8 floats as one value (GCC vector extension): lane-wise multiplies and adds, each the scalar operation of its lane
// (no contraction: ISO C++), so the vector loops below equal their scalar forms bitwise.
// (-Wpsabi: these helpers are always inlined into their callers' ISA, so the by-value vector ABI never applies.)
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v8f __attribute__((vector_size(32)));
inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }
inline float reduce8(const float* a) { return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])); }

// dot()'s end for an accumulator of columns [0, i): the tail columns [i, n) into lanes 0.., then its reduction.
inline float dot_finish(v8f acc, const float* a, const float* b, int64_t i, int64_t n) {
  float s[8];
  store8(s, acc);
  for (int64_t l = 0; i < n; ++i, ++l) s[l] += a[i] * b[i];
  return reduce8(s);
}

// out[r] = dot(a, b[r], n) for r < 4: the four rows interleaved (independent accumulators), each in dot()'s order.
DSV4_CLONES void dot4(const float* a, const float* const* b, int64_t n, float* out) {
  const float *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3];
  v8f c0 = {}, c1 = {}, c2 = {}, c3 = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const v8f x = load8(a + i);
    c0 += x * load8(b0 + i);
    c1 += x * load8(b1 + i);
    c2 += x * load8(b2 + i);
    c3 += x * load8(b3 + i);
  }
  out[0] = dot_finish(c0, a, b0, i, n);
  out[1] = dot_finish(c1, a, b1, i, n);
  out[2] = dot_finish(c2, a, b2, i, n);
  out[3] = dot_finish(c3, a, b3, i, n);
}

// out[r] = dot(a, b[r], n) for r < n_rows (rows in groups of four).
void dot_rows(const float* a, const float* const* b, int64_t n_rows, int64_t n, float* out) {
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4) dot4(a, b + r, n, out + r);
  for (; r < n_rows; ++r) out[r] = dot(a, b[r], n);
}

// out0[r] = dot(a0, b[r], n) and out1[r] = dot(a1, b[r], n) for r < 4: each row loaded once for both (two heads of
// one token), eight independent accumulators, each in dot()'s order.
DSV4_CLONES void dot2x4(const float* a0, const float* a1, const float* const* b, int64_t n, float* out0,
                        float* out1) {
  const float *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3];
  v8f c00 = {}, c01 = {}, c02 = {}, c03 = {}, c10 = {}, c11 = {}, c12 = {}, c13 = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const v8f x0 = load8(a0 + i), x1 = load8(a1 + i);
    const v8f w0 = load8(b0 + i), w1 = load8(b1 + i), w2 = load8(b2 + i), w3 = load8(b3 + i);
    c00 += x0 * w0;
    c10 += x1 * w0;
    c01 += x0 * w1;
    c11 += x1 * w1;
    c02 += x0 * w2;
    c12 += x1 * w2;
    c03 += x0 * w3;
    c13 += x1 * w3;
  }
  out0[0] = dot_finish(c00, a0, b0, i, n);
  out0[1] = dot_finish(c01, a0, b1, i, n);
  out0[2] = dot_finish(c02, a0, b2, i, n);
  out0[3] = dot_finish(c03, a0, b3, i, n);
  out1[0] = dot_finish(c10, a1, b0, i, n);
  out1[1] = dot_finish(c11, a1, b1, i, n);
  out1[2] = dot_finish(c12, a1, b2, i, n);
  out1[3] = dot_finish(c13, a1, b3, i, n);
}

// dot_rows for two vectors a0, a1 against the same rows.
void dot_rows2(const float* a0, const float* a1, const float* const* b, int64_t n_rows, int64_t n, float* out0,
               float* out1) {
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4) dot2x4(a0, a1, b + r, n, out0 + r, out1 + r);
  for (; r < n_rows; ++r) {
    out0[r] = dot(a0, b[r], n);
    out1[r] = dot(a1, b[r], n);
  }
}

// add_scaled_rows into two accumulators (acc0 with weights p0, acc1 with p1) over the same rows, each row loaded once.
DSV4_CLONES void add_scaled_rows2(float* acc0, float* acc1, const float* p0, const float* p1,
                                  const float* const* rows, int64_t n_rows, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v8f a0 = load8(acc0 + i), a1 = load8(acc0 + i + 8), b0 = load8(acc1 + i), b1 = load8(acc1 + i + 8);
    for (int64_t j = 0; j < n_rows; ++j) {
      const float* r = rows[j] + i;
      const v8f w0 = load8(r), w1 = load8(r + 8);
      const float x = p0[j], y = p1[j];
      a0 += x * w0;
      a1 += x * w1;
      b0 += y * w0;
      b1 += y * w1;
    }
    store8(acc0 + i, a0);
    store8(acc0 + i + 8, a1);
    store8(acc1 + i, b0);
    store8(acc1 + i + 8, b1);
  }
  for (; i < n; ++i) {
    float s0 = acc0[i], s1 = acc1[i];
    for (int64_t j = 0; j < n_rows; ++j) {
      s0 += p0[j] * rows[j][i];
      s1 += p1[j] * rows[j][i];
    }
    acc0[i] = s0;
    acc1[i] = s1;
  }
}

// acc[i] += p[j] * rows[j][i] for j = 0 .. n_rows-1 in turn (one multiply, one add each): the order of n_rows
// add_scaled calls, with acc kept in registers across the rows (32 columns at a time).
DSV4_CLONES void add_scaled_rows(float* acc, const float* p, const float* const* rows, int64_t n_rows, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    v8f a0 = load8(acc + i), a1 = load8(acc + i + 8), a2 = load8(acc + i + 16), a3 = load8(acc + i + 24);
    for (int64_t j = 0; j < n_rows; ++j) {
      const float* r = rows[j] + i;
      const float pj = p[j];
      a0 += pj * load8(r);
      a1 += pj * load8(r + 8);
      a2 += pj * load8(r + 16);
      a3 += pj * load8(r + 24);
    }
    store8(acc + i, a0);
    store8(acc + i + 8, a1);
    store8(acc + i + 16, a2);
    store8(acc + i + 24, a3);
  }
  for (; i < n; ++i) {
    float s = acc[i];
    for (int64_t j = 0; j < n_rows; ++j) s += p[j] * rows[j][i];
    acc[i] = s;
  }
}

// t[i] = term(x[i]) for i < n (vectorized: each term is one exact operation sequence per element).
DSV4_CLONES void square_terms(const float* x, int64_t n, bool bf_sq, double* t) {
  if (bf_sq)
    for (int64_t i = 0; i < n; ++i) t[i] = double(bf_nb(x[i] * x[i]));
  else
    for (int64_t i = 0; i < n; ++i) t[i] = double(x[i]) * double(x[i]);
}
// out[r] = sum_i term(x[r * stride + i]) for rows r < m, i ascending in one double chain per row: term(v) =
// double(v) * double(v) (exact), or with bf_sq double(bf16(v * v)). Eight (or four) rows' chains side by side
// (independent latency chains) over the terms of kSqCols columns at a time (square_terms); per row the sequence of
// sum_sq.
constexpr int64_t kSqCols = 256;
template <int R>
void square_sums_rows(const float* x, int64_t stride, int64_t n, bool bf_sq, double* out) {
  double t[R][kSqCols], s[R] = {};
  for (int64_t c0 = 0; c0 < n; c0 += kSqCols) {
    const int64_t nc = std::min(kSqCols, n - c0);
    for (int r = 0; r < R; ++r) square_terms(x + r * stride + c0, nc, bf_sq, t[r]);
    for (int64_t i = 0; i < nc; ++i)
      for (int r = 0; r < R; ++r) s[r] += t[r][i];
  }
  for (int r = 0; r < R; ++r) out[r] = s[r];
}
template <bool BfSq>
void square_sums(const float* x, int64_t stride, int64_t m, int64_t n, double* out) {
  int64_t r = 0;
  for (; r + 8 <= m; r += 8) square_sums_rows<8>(x + r * stride, stride, n, BfSq, out + r);
  for (; r + 4 <= m; r += 4) square_sums_rows<4>(x + r * stride, stride, n, BfSq, out + r);
  for (; r < m; ++r) square_sums_rows<1>(x + r * stride, stride, n, BfSq, out + r);
}

// y[i] = bf16?(w[i] * (x[i] * s)) (w null: bf16?(x[i] * s)): rmsnorm's output row (vectorized; per element the
// scalar sequence).
DSV4_CLONES void scale_row(const float* x, int64_t n, float s, const float* w, bool bf16, float* y) {
  if (w) {
    if (bf16)
      for (int64_t i = 0; i < n; ++i) y[i] = bf_nb(w[i] * (x[i] * s));
    else
      for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * s);
  } else {
    if (bf16)
      for (int64_t i = 0; i < n; ++i) y[i] = bf_nb(x[i] * s);
    else
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
  }
}

// One vector of rope: pairs (v[2i], v[2i+1]) for i < half rotated by (c, s) = (cs[2i], +-cs[2i+1]), bf16-rounded
// when asked (per pair the scalar sequence).
DSV4_CLONES void rope_vec(float* v, const float* cs, int64_t half, bool inverse, bool bf16) {
  for (int64_t i = 0; i < half; ++i) {
    const float c = cs[2 * i], s = inverse ? -cs[2 * i + 1] : cs[2 * i + 1];
    const float a = v[2 * i], b = v[2 * i + 1];
    const float re = a * c - b * s;
    const float im = a * s + b * c;
    v[2 * i] = bf16 ? bf_nb(re) : re;
    v[2 * i + 1] = bf16 ? bf_nb(im) : im;
  }
}

// One row of the Walsh-Hadamard transform (dim a power of two): the butterflies h = 1, 2, 4, ... in order, then
// v[i] = bf16?(v[i] * scale).
DSV4_CLONES void hadamard_row(float* v, int64_t dim, float scale, bool bf16) {
  for (int64_t h = 1; h < dim; h *= 2)
    for (int64_t i = 0; i < dim; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
  if (bf16)
    for (int64_t i = 0; i < dim; ++i) v[i] = bf_nb(v[i] * scale);
  else
    for (int64_t i = 0; i < dim; ++i) v[i] = v[i] * scale;
}

// The indexer's scores of n keys from their head dots d [n_heads][n] (lanes = keys; per key the scalar sequence):
// score[j] = bf16?( sum_h bf16?( relu(bf16?(d[h][j])) * w[h] ) ), h ascending from s = 0.
DSV4_CLONES void index_scores(const float* d, int64_t n, int64_t n_heads, const float* w, bool bf16, float* score) {
  std::fill(score, score + n, 0.0f);
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* dh = d + h * n;
    const float wh = w[h];
    if (bf16) {
      for (int64_t j = 0; j < n; ++j) {
        float v = bf_nb(dh[j]);
        v = v > 0.0f ? v : 0.0f;
        score[j] += bf_nb(v * wh);
      }
    } else {
      for (int64_t j = 0; j < n; ++j) {
        const float v = dh[j] > 0.0f ? dh[j] : 0.0f;
        score[j] += v * wh;
      }
    }
  }
  if (bf16)
    for (int64_t j = 0; j < n; ++j) score[j] = bf_nb(score[j]);
}

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// u[d] = sum_j w[j] * x[j * dim + d] (j ascending from 0), bf16-rounded when asked: u [dim], x [hc][dim].
// (8 columns per vector; per column the scalar sequence.)
DSV4_CLONES void hc_weighted_sum(const float* w, const float* x, int hc, int64_t dim, bool bf16, float* u) {
  int64_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    v8f s = {};
    for (int j = 0; j < hc; ++j) s += w[j] * load8(x + j * dim + d);
    store8(u + d, s);
  }
  for (; d < dim; ++d) {
    float s = 0;
    for (int j = 0; j < hc; ++j) s += w[j] * x[j * dim + d];
    u[d] = s;
  }
  if (bf16)
    for (d = 0; d < dim; ++d) u[d] = bf_nb(u[d]);
}

// One token of hc_post: o[k][d] = post[k] * f[d] + sum_j C[j][k] * x[j][d] (j ascending), bf16-rounded when asked;
// o, x [hc][dim], C [hc][hc]. (8 columns per vector; per column the scalar sequence.)
DSV4_CLONES void hc_post_token(const float* f, const float* x, const float* post, const float* C, int hc,
                               int64_t dim, bool bf16, float* o) {
  for (int k = 0; k < hc; ++k) {
    const float pk = post[k];
    float* ok = o + k * dim;
    int64_t d = 0;
    for (; d + 8 <= dim; d += 8) {
      v8f s = {};
      for (int j = 0; j < hc; ++j) s += C[j * hc + k] * load8(x + j * dim + d);
      store8(ok + d, pk * load8(f + d) + s);
    }
    for (; d < dim; ++d) {
      float s = 0;
      for (int j = 0; j < hc; ++j) s += C[j * hc + k] * x[j * dim + d];
      ok[d] = pk * f[d] + s;
    }
    if (bf16)
      for (d = 0; d < dim; ++d) ok[d] = bf_nb(ok[d]);
  }
}

// Sinkhorn normalization of kSinkLanes comb matrices at once, C [hc*hc][kSinkLanes] (lane l: token l's C[j][k] at
// (j*hc + k) * kSinkLanes + l): one column normalization, then (iters - 1) times rows then columns, each sum over
// j (or k) ascending and each element divided by (sum + eps) — per lane the scalar sequence, bitwise.
constexpr int64_t kSinkLanes = 8;
DSV4_CLONES void sinkhorn_lanes(float* C, int hc, int iters, float eps) {
  v8f c[kMaxHc * kMaxHc];
  for (int e = 0; e < hc * hc; ++e) c[e] = load8(C + e * kSinkLanes);
  auto col_norm = [&] {
    for (int k = 0; k < hc; ++k) {
      v8f s = {};
      for (int j = 0; j < hc; ++j) s += c[j * hc + k];
      for (int j = 0; j < hc; ++j) c[j * hc + k] /= (s + eps);
    }
  };
  auto row_norm = [&] {
    for (int j = 0; j < hc; ++j) {
      v8f s = {};
      for (int k = 0; k < hc; ++k) s += c[j * hc + k];
      for (int k = 0; k < hc; ++k) c[j * hc + k] /= (s + eps);
    }
  };
  col_norm();
  for (int it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
  for (int e = 0; e < hc * hc; ++e) store8(C + e * kSinkLanes, c[e]);
}

// One row of swiglu: h[i] = w * ((g' / (1 + exp(-g'))) * u') (w only with has_w), bf16-rounded when asked, where
// g' = min(g, limit), u' = clamp(u, -limit, limit) if limit > 0 (std::min / std::max semantics). The exponentials
// first (scratch e [dim], exp_array), then the rest 8 columns per vector. h may be g (each element read before it is
// written).
DSV4_CLONES void swiglu_row(const float* g, const float* up, int64_t dim, float limit, bool has_w, float w, bool bf16,
                            float* e, float* h) {
  const bool clamp = limit > 0;
  for (int64_t i = 0; i < dim; ++i) e[i] = -(clamp ? std::min(g[i], limit) : g[i]);
  exp_array(e, dim, e);
  int64_t i = 0;
  const v8f lim = {limit, limit, limit, limit, limit, limit, limit, limit}, nlim = -lim;
  for (; i + 8 <= dim; i += 8) {
    v8f gv = load8(g + i), uv = load8(up + i);
    if (clamp) {
      uv = uv < nlim ? nlim : uv;  // std::max(uv, -limit)
      uv = lim < uv ? lim : uv;    // std::min(., limit)
      gv = lim < gv ? lim : gv;    // std::min(gv, limit)
    }
    v8f v = (gv / (1.0f + load8(e + i))) * uv;
    if (has_w) v = w * v;
    store8(h + i, v);
  }
  for (; i < dim; ++i) {
    float gv = g[i], uv = up[i];
    if (clamp) {
      uv = std::min(std::max(uv, -limit), limit);
      gv = std::min(gv, limit);
    }
    float v = (gv / (1.0f + e[i])) * uv;
    if (has_w) v = w * v;
    h[i] = v;
  }
  if (bf16)
    for (i = 0; i < dim; ++i) h[i] = bf_nb(h[i]);
}

// 1 when any of x[0, n) is NaN or inf (exponent bits all ones), else 0: branch-free, so that it vectorizes (a logits
// row is 129,280 wide; with AVX2 ~3x faster than the baseline build).
DSV4_CLONES uint32_t any_nonfinite(const float* x, int64_t n) {
  uint32_t b = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    b |= uint32_t((u & 0x7F800000u) == 0x7F800000u);
  }
  return b;
}

// rsqrt(mean(x²) + eps) of a token's fp32 streams from its square sum ss (square_sums over width elements).
inline float hc_rsqrt(double ss, int64_t width, float norm_eps) {
  return 1.0f / std::sqrt(float(ss) / float(width) + norm_eps);
}

// Mixing coefficients of one token from the fp32 streams x [hc*dim] (spec §5.3): mix = (fn @ x) * r with
// r = rsqrt(mean(x²)+eps) (hc_rsqrt).
void hc_mix(const float* x, int64_t width, const float* fn, int64_t n_mix, float r, float* mix) {
  const float* rows[kMaxMix];
  for (int64_t m = 0; m < n_mix; ++m) rows[m] = fn + m * width;
  dot_rows(x, rows, n_mix, width, mix);  // dot(x, row) == dot(row, x): the products commute
  for (int64_t m = 0; m < n_mix; ++m) mix[m] = mix[m] * r;
}

}  // namespace

void CpuOps::linear(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o) const {
  dsv4::linear(W, x, n_tok, y, o);
}

void CpuOps::linear_check_finite(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o,
                                 int32_t* bad) const {
  const LinearJob job{W, x, n_tok, y, o, bad};
  linear_batch(std::span<const LinearJob>(&job, 1));
}

void CpuOps::fill(float* x, int64_t n, float value) const { std::fill(x, x + n, value); }

void CpuOps::round_bf16(float* x, int64_t n) const { round_bf16_inplace(x, n); }

void CpuOps::scale(float* x, int64_t n, float alpha, bool bf16) const {
  for (int64_t i = 0; i < n; ++i) x[i] = maybe_bf(x[i] * alpha, bf16);
}

void CpuOps::embed(const WeightView& table, const int32_t* ids, int64_t n_tok, int copies, float* out) const {
  const int64_t dim = table.cols;
  const int64_t rb = table.row_bytes();
#pragma omp parallel for schedule(static) if (par(n_tok * dim))
  for (int64_t t = 0; t < n_tok; ++t) {
    const uint8_t* row = table.w + int64_t(ids[t]) * rb;
    float* o = out + t * copies * dim;
    if (table.fmt == GemmFormat::bf16) {
      for (int64_t i = 0; i < dim; ++i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        o[i] = bf16_to_float(h);
      }
    } else {
      std::memcpy(o, row, size_t(dim) * 4);
    }
    for (int c = 1; c < copies; ++c) std::memcpy(o + c * dim, o, size_t(dim) * 4);
  }
}

void CpuOps::rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16,
                     float* y) const {
  const int64_t n_grp = (n_rows + 7) / 8;  // rows in groups of eight (square_sums)
#pragma omp parallel for schedule(static) if (par(n_rows * dim))
  for (int64_t g = 0; g < n_grp; ++g) {
    const int64_t r0 = g * 8, m = std::min<int64_t>(8, n_rows - r0);
    double ss[8];
    square_sums<false>(x + r0 * dim, dim, m, dim, ss);
    for (int64_t r = r0; r < r0 + m; ++r) {
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      const float var = float(ss[r - r0]) / float(dim);
      const float s = 1.0f / std::sqrt(var + eps);
      scale_row(xr, dim, s, w, bf16, yr);
    }
  }
}

void CpuOps::head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16) const {
  const int64_t n_grp = (n_rows + 7) / 8;  // rows in groups of eight (square_sums)
#pragma omp parallel for schedule(static) if (par(n_rows * dim))
  for (int64_t g = 0; g < n_grp; ++g) {
    const int64_t r0 = g * 8, m = std::min<int64_t>(8, n_rows - r0);
    double ss[8];
    if (bf16)
      square_sums<true>(x + r0 * dim, dim, m, dim, ss);
    else
      square_sums<false>(x + r0 * dim, dim, m, dim, ss);
    for (int64_t r = r0; r < r0 + m; ++r) {
      float* xr = x + r * dim;
      const double s = ss[r - r0];
      if (bf16) {
        // q.square() -> bf16; .mean() -> fp32 accumulation rounded to bf16; + eps -> bf16; rsqrt -> bf16; q * r -> bf16
        const float mean = bf(float(s / double(dim)));
        const float t = bf(mean + eps);
        const float rs = bf(1.0f / std::sqrt(t));
        scale_row(xr, dim, rs, nullptr, true, xr);
      } else {
        const float rs = 1.0f / std::sqrt(float(s) / float(dim) + eps);
        scale_row(xr, dim, rs, nullptr, false, xr);
      }
    }
  }
}

void CpuOps::rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin,
                  bool inverse, bool bf16) const {
  const int64_t half = rd / 2, off = head_dim - rd;
#pragma omp parallel for schedule(static) if (par(n_tok * n_heads * rd))
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* cs = cos_sin + t * rd;
    for (int64_t h = 0; h < n_heads; ++h) rope_vec(x + (t * n_heads + h) * head_dim + off, cs, half, inverse, bf16);
  }
}

void CpuOps::fp8_sim(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block) const {
#pragma omp parallel for schedule(static) if (par(n_rows * n_cols))
  for (int64_t r = 0; r < n_rows; ++r) act_quant_fp8_inplace(x + r * row_stride, n_cols, block);
}

void CpuOps::fp4_sim(float* x, int64_t n_rows, int64_t dim) const {
#pragma omp parallel for schedule(static) if (par(n_rows * dim))
  for (int64_t r = 0; r < n_rows; ++r) fp4_act_quant_inplace(x + r * dim, dim);
}

void CpuOps::hadamard(float* x, int64_t n_rows, int64_t dim, bool bf16) const {
  if (dim <= 0 || (dim & (dim - 1)) != 0) fail("hadamard: dimension {} is not a power of two", dim);
  const float scale = float(1.0 / std::sqrt(double(dim)));
#pragma omp parallel for schedule(static) if (par(n_rows * dim * 8))
  for (int64_t r = 0; r < n_rows; ++r) hadamard_row(x + r * dim, dim, scale, bf16);
}

void CpuOps::check_finite(const float* x, int64_t n_rows, int64_t dim, int32_t* bad) const {
#pragma omp parallel for schedule(static) if (par(n_rows * dim / 4))
  for (int64_t r = 0; r < n_rows; ++r) bad[r] = int32_t(any_nonfinite(x + r * dim, dim));
}

void CpuOps::gather_rows(const float* a, int64_t n_a, const float* b, const int32_t* idx, int64_t n, int64_t dim,
                         float* out) const {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = idx[i];
    const float* src = j < n_a ? a + j * dim : b + (j - n_a) * dim;
    std::memcpy(out + i * dim, src, size_t(dim) * 4);
  }
}

void CpuOps::scatter_rows(const float* src, const int32_t* src_idx, float* dst, const int32_t* dst_idx, int64_t n,
                          int64_t dim) const {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(dst + int64_t(dst_idx[i]) * dim, src + int64_t(src_idx[i]) * dim, size_t(dim) * 4);
}

// add_rows, then both arrays gathered into scratch and scattered back (the sequence the op stands for).
void CpuOps::frontier_update(const float* kv, float* score, int64_t n_tok, const float* ape, const int32_t* ape_row,
                             float* state_kv, float* state_score, const int32_t* idx, const int32_t* dst, int64_t n,
                             int64_t dim) const {
  if (ape != nullptr) add_rows(score, n_tok, dim, ape, ape_row);
  std::vector<float> tmp(size_t(2 * n * dim));  // [2, n, dim]
  gather_rows(kv, n_tok, state_kv, idx, n, dim, tmp.data());
  gather_rows(score, n_tok, state_score, idx, n, dim, tmp.data() + n * dim);
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(state_kv + int64_t(dst[i]) * dim, tmp.data() + i * dim, size_t(dim) * 4);
    std::memcpy(state_score + int64_t(dst[i]) * dim, tmp.data() + (n + i) * dim, size_t(dim) * 4);
  }
}

void CpuOps::encode_rows(const float* x, int64_t n, const RowCodec& c, float* out) const {
  const int64_t w = c.words();
  int64_t inexact = -1;
#pragma omp parallel for schedule(static) if (par(n * c.dim * 8))
  for (int64_t r = 0; r < n; ++r) {
    const bool exact = encode_row(c, x + r * c.dim, out + r * w);
#ifndef NDEBUG
    if (!exact) {
#pragma omp critical
      inexact = r;
    }
#else
    (void)exact;
#endif
  }
  if (inexact >= 0)
    fail("internal: state row {} is not exactly representable as {} (reference numerics store only simulated rows)",
         inexact, row_kind_name(c.kind));
}

void CpuOps::add_rows(float* x, int64_t n, int64_t dim, const float* table, const int32_t* rows) const {
  for (int64_t t = 0; t < n; ++t) {
    const float* r = table + int64_t(rows[t]) * dim;
    float* xt = x + t * dim;
    for (int64_t d = 0; d < dim; ++d) xt[d] += r[d];
  }
}

void CpuOps::hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                    const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u,
                    float* post, float* comb) const {
  const int64_t width = int64_t(hc) * dim, n_mix = int64_t(2 + hc) * hc;
  if (hc > kMaxHc) fail("hc_pre: hc_mult {} > {}", hc, kMaxHc);
  // tokens in blocks of kSinkLanes: each token's mix, pre, post, softmax rows and u, then the Sinkhorn iterations of
  // the block's comb matrices side by side (one vector lane per token)
  const int64_t n_blk = (n_tok + kSinkLanes - 1) / kSinkLanes;
#pragma omp parallel for schedule(static) if (par(n_tok * width * 24))
  for (int64_t b = 0; b < n_blk; ++b) {
    const int64_t t0 = b * kSinkLanes, nt = std::min<int64_t>(kSinkLanes, n_tok - t0);
    double ss[kSinkLanes];
    square_sums<false>(X + t0 * width, width, nt, width, ss);
    for (int64_t t = t0; t < t0 + nt; ++t) {
      const float* x = X + t * width;
      float mix[kMaxMix], pre[kMaxHc];
      hc_mix(x, width, fn, n_mix, hc_rsqrt(ss[t - t0], width, norm_eps), mix);
      for (int j = 0; j < hc; ++j) pre[j] = sigmoidf(mix[j] * scale[0] + base[j]) + hc_eps;
      for (int j = 0; j < hc; ++j) post[t * hc + j] = 2.0f * sigmoidf(mix[hc + j] * scale[1] + base[hc + j]);
      float* C = comb + t * hc * hc;
      for (int j = 0; j < hc; ++j) {
        float* row = C + j * hc;
        float mx = kNegInf;
        for (int k = 0; k < hc; ++k) {
          row[k] = mix[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
          mx = std::max(mx, row[k]);
        }
        float s = 0;
        for (int k = 0; k < hc; ++k) {
          row[k] = std::exp(row[k] - mx);
          s += row[k];
        }
        for (int k = 0; k < hc; ++k) row[k] = row[k] / s + hc_eps;
      }
      hc_weighted_sum(pre, x, hc, dim, bf16, u + t * dim);
    }
    // lanes [hc*hc][kSinkLanes]; lanes past the last token repeat token t0 (their results are dropped)
    float lanes[kMaxHc * kMaxHc * kSinkLanes];
    for (int e = 0; e < hc * hc; ++e)
      for (int64_t l = 0; l < kSinkLanes; ++l) lanes[e * kSinkLanes + l] = comb[(t0 + (l < nt ? l : 0)) * hc * hc + e];
    sinkhorn_lanes(lanes, hc, sinkhorn_iters, hc_eps);
    for (int e = 0; e < hc * hc; ++e)
      for (int64_t l = 0; l < nt; ++l) comb[(t0 + l) * hc * hc + e] = lanes[e * kSinkLanes + l];
  }
}

void CpuOps::hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc,
                     int64_t dim, bool bf16, float* Xout) const {
  const int64_t width = int64_t(hc) * dim;
#pragma omp parallel for schedule(static) if (par(n_tok * width * 4))
  for (int64_t t = 0; t < n_tok; ++t) {
    static thread_local std::vector<float> tmp;
    tmp.resize(static_cast<size_t>(width));
    const float* x = X + t * width;
    const float* C = comb + t * hc * hc;
    hc_post_token(f + t * dim, x, post + t * hc, C, hc, dim, bf16, tmp.data());
    std::memcpy(Xout + t * width, tmp.data(), size_t(width) * 4);
  }
}

void CpuOps::hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                     const float* base, float hc_eps, float norm_eps, bool bf16, float* u) const {
  const int64_t width = int64_t(hc) * dim;
  if (hc > kMaxHc) fail("hc_head: hc_mult {} > {}", hc, kMaxHc);
#pragma omp parallel for schedule(static) if (par(n_tok * width * 4))
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* x = X + t * width;
    float mix[kMaxHc];
    double ss;
    square_sums<false>(x, width, 1, width, &ss);
    hc_mix(x, width, fn, hc, hc_rsqrt(ss, width, norm_eps), mix);
    for (int j = 0; j < hc; ++j) mix[j] = sigmoidf(mix[j] * scale[0] + base[j]) + hc_eps;
    hc_weighted_sum(mix, x, hc, dim, bf16, u + t * dim);
  }
}

void CpuOps::sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv,
                              const int32_t* win_idx, int64_t k_win, const int32_t* comp_idx, int64_t k_comp,
                              const float* sink, float scale, bool bf16, float* out) const {
  const int64_t dim = kv.dim, k = k_win + k_comp;
  constexpr int64_t kBlock = 64;
  const bool packed = kv.stored.compact();
  const int64_t rb = packed ? kv.stored.bytes() : dim * 4;  // bytes per ring / comp row as stored
  const auto* ring = reinterpret_cast<const unsigned char*>(kv.ring);
  const auto* comp = reinterpret_cast<const unsigned char*>(kv.comp);
  // entry j of token t's concatenated candidate list -> its stored row (ring / comp) or fresh fp32 row, or nullptr
  // when unused; `fresh` tells which
  auto stored_of = [&](int64_t t, int64_t j, bool& fresh) -> const void* {
    fresh = false;
    if (j < k_win) {
      const int32_t i = win_idx[t * k_win + j];
      if (i < 0) return nullptr;
      if (i < kv.n_ring) return ring + int64_t(i) * rb;
      fresh = true;
      return kv.fresh + (int64_t(i) - kv.n_ring) * dim;
    }
    const int32_t i = comp_idx[t * k_comp + (j - k_win)];
    return i < 0 ? nullptr : comp + int64_t(i) * rb;
  };
  // (a decode step's few heads: waking the pool costs more than the rows; 8x par()'s bar)
  const bool go_par = par(n_tok * n_heads * k * dim / 8);
#pragma omp parallel if (go_par)
  {
    // compact rows: decoded once per thread and call into a per-thread cache (consecutive tokens share most of
    // their window and compressed rows; the heads of a token are consecutive iterations). Slot h of dec [cap][dim]
    // holds the row with key tag[h] (ring row i: 2i, compressed row i: 2i + 1; slot = key mod cap), last used by
    // token stamp[h]; a row whose slot the same token already uses goes to the overflow rows dec [cap + j]. Tags
    // are reset per call (the stored rows change between calls); decoding is exact, so results do not depend on it.
    static thread_local std::vector<float> dec;
    static thread_local std::vector<int64_t> tag, stamp;
    static thread_local std::vector<const float*> rows;
    int64_t cap = 1;
    while (cap < 2 * k) cap <<= 1;
    if (packed) {
      if (dec.size() < size_t((cap + k) * dim)) dec.resize(size_t((cap + k) * dim));
      tag.assign(size_t(cap), -1);
      stamp.assign(size_t(cap), -1);
    }
    if (rows.size() < size_t(k)) rows.resize(size_t(k));
    int64_t dec_t = -1;
    // items: (token, pair of consecutive heads); the two heads share every row load
    const int64_t n_pairs = (n_heads + 1) / 2;
#pragma omp for schedule(static)
    for (int64_t tp = 0; tp < n_tok * n_pairs; ++tp) {
      const int64_t t = tp / n_pairs, h0 = (tp % n_pairs) * 2, nh = std::min<int64_t>(2, n_heads - h0);
      if (t != dec_t) {
        for (int64_t j = 0; j < k; ++j) {
          bool fresh = false;
          const void* p = stored_of(t, j, fresh);
          if (!p || fresh || !packed) {
            rows[size_t(j)] = static_cast<const float*>(p);
            continue;
          }
          const auto* pb = static_cast<const unsigned char*>(p);
          const int64_t key = j < k_win ? (pb - ring) / rb * 2 : (pb - comp) / rb * 2 + 1;
          const size_t sl = size_t(key & (cap - 1));
          float* slot = dec.data() + int64_t(sl) * dim;
          if (tag[sl] != key) {
            if (stamp[sl] == t) {
              slot = dec.data() + (cap + j) * dim;  // the slot holds another row of this token
            } else {
              tag[sl] = key;
              stamp[sl] = t;
            }
            decode_row(kv.stored, p, slot);
          } else {
            stamp[sl] = t;
          }
          rows[size_t(j)] = slot;
        }
        dec_t = t;
      }
      static thread_local std::vector<float> acc;
      acc.assign(static_cast<size_t>(2 * dim), 0.0f);  // [nh][dim]
      const float* qv[2] = {q + (t * n_heads + h0) * dim, q + (t * n_heads + h0 + nh - 1) * dim};
      float* av[2] = {acc.data(), acc.data() + dim};
      // per block: the used rows r_blk [nb] in candidate order, per head their scores s_blk and weights p_blk
      float s_blk[2][kBlock], p_blk[2][kBlock];
      const float* r_blk[kBlock];
      float m[2] = {kNegInf, kNegInf}, sum[2] = {0.0f, 0.0f};
      for (int64_t b0 = 0; b0 < k; b0 += kBlock) {
        const int64_t b1 = std::min(k, b0 + kBlock);
        int64_t nb = 0;
        for (int64_t j = b0; j < b1; ++j)
          if (rows[size_t(j)]) r_blk[nb++] = rows[size_t(j)];
        if (nh == 2)
          dot_rows2(qv[0], qv[1], r_blk, nb, dim, s_blk[0], s_blk[1]);
        else
          dot_rows(qv[0], r_blk, nb, dim, s_blk[0]);
        bool live[2] = {false, false};  // the head has a finite score in the block
        for (int64_t hh = 0; hh < nh; ++hh) {
          float* sb = s_blk[hh];
          float bm = kNegInf;
          for (int64_t j = 0; j < nb; ++j) {
            sb[j] = sb[j] * scale;
            bm = std::max(bm, sb[j]);
          }
          if (bm == kNegInf) continue;
          live[hh] = true;
          const float m_new = std::max(m[hh], bm);
          const float alpha = m[hh] == kNegInf ? 0.0f : std::exp(m[hh] - m_new);
          if (alpha != 1.0f)
            for (int64_t d = 0; d < dim; ++d) av[hh][d] *= alpha;
          sum[hh] *= alpha;
          float p[kBlock];
          for (int64_t j = 0; j < nb; ++j) p[j] = sb[j] - m_new;
          exp_array(p, nb, p);
          for (int64_t j = 0; j < nb; ++j) {
            sum[hh] += p[j];
            p_blk[hh][j] = maybe_bf(p[j], bf16);
          }
          m[hh] = m_new;
        }
        if (live[0] && live[1]) {
          add_scaled_rows2(av[0], av[1], p_blk[0], p_blk[1], r_blk, nb, dim);
        } else {
          for (int64_t hh = 0; hh < nh; ++hh)
            if (live[hh]) add_scaled_rows(av[hh], p_blk[hh], r_blk, nb, dim);
        }
      }
      for (int64_t hh = 0; hh < nh; ++hh) {
        const int64_t h = h0 + hh;
        float* o = out + (t * n_heads + h) * dim;
        if (m[hh] == kNegInf) {
          std::fill(o, o + dim, 0.0f);
          continue;
        }
        const float den = sum[hh] + std::exp(sink[h] - m[hh]);
        for (int64_t d = 0; d < dim; ++d) o[d] = maybe_bf(av[hh][d] / den, bf16);
      }
    }
  }
}

void CpuOps::compress_pool(const float* kv, const float* score, int64_t n_tok, const float* state_kv,
                           const float* state_score, const int32_t* cand, int64_t n_emit, int64_t n_cand, int coff,
                           int64_t c, float* out) const {
  const int64_t width = int64_t(coff) * c, half = n_cand / 2;
#pragma omp parallel for schedule(static) if (n_emit > 1 && par(n_emit * n_cand * c * 4))
  for (int64_t e = 0; e < n_emit; ++e) {
    const int32_t* ce = cand + e * n_cand;
    static thread_local std::vector<const float*> rk, rs;
    rk.assign(static_cast<size_t>(n_cand), nullptr);
    rs.assign(static_cast<size_t>(n_cand), nullptr);
    for (int64_t j = 0; j < n_cand; ++j) {
      const int64_t i = ce[j];
      if (i < 0) continue;
      const int64_t col = (coff == 2 && j >= half) ? c : 0;
      rk[size_t(j)] = (i < n_tok ? kv + i * width : state_kv + (i - n_tok) * width) + col;
      rs[size_t(j)] = (i < n_tok ? score + i * width : state_score + (i - n_tok) * width) + col;
    }
    // per column d: mx = max_j score, sum = sum_j exp(score - mx), o = sum_j kv * (exp(score - mx) / sum) over the
    // candidates j in order (a missing candidate scores -inf); the loops run over j outside, d inside, with the
    // exponentials ex [n_cand][c] computed once
    static thread_local std::vector<float> mx, sum, ex;
    mx.assign(static_cast<size_t>(c), kNegInf);
    sum.assign(static_cast<size_t>(c), 0.0f);
    ex.resize(static_cast<size_t>(n_cand * c));
    float* o = out + e * c;
    std::fill(o, o + c, 0.0f);
    for (int64_t j = 0; j < n_cand; ++j) {
      const float* sj = rs[size_t(j)];
      if (!sj) continue;  // std::max(m, -inf) == m
      for (int64_t d = 0; d < c; ++d) mx[size_t(d)] = std::max(mx[size_t(d)], sj[d]);
    }
    for (int64_t j = 0; j < n_cand; ++j) {
      const float* sj = rs[size_t(j)];
      float* xj = ex.data() + j * c;
      if (!sj) {
        // exp(-inf - mx) is +0 (sum unchanged: it is never -0) unless mx is -inf or NaN (then NaN)
        for (int64_t d = 0; d < c; ++d)
          if (!(mx[size_t(d)] > kNegInf)) sum[size_t(d)] += std::exp(kNegInf - mx[size_t(d)]);
        continue;
      }
      for (int64_t d = 0; d < c; ++d) xj[d] = sj[d] - mx[size_t(d)];
      exp_array(xj, c, xj);
      for (int64_t d = 0; d < c; ++d) sum[size_t(d)] += xj[d];
    }
    for (int64_t j = 0; j < n_cand; ++j) {
      const float* sj = rs[size_t(j)];
      if (!sj) continue;
      const float* kj = rk[size_t(j)];
      const float* xj = ex.data() + j * c;
      for (int64_t d = 0; d < c; ++d)
        if (sj[d] != kNegInf) o[d] += kj[d] * (xj[d] / sum[size_t(d)]);
    }
  }
}

void CpuOps::indexer_topk(const float* q, int64_t n_tok, int64_t n_heads, int64_t dim, const PagedRows& keys,
                          const int32_t* n_visible, int64_t max_visible, const float* w, int64_t topk, bool bf16,
                          int32_t* sel) const {
  // pool row of token t's logical key row j
  auto pool_row = [&](int64_t t, int64_t j) -> int64_t {
    if (!keys.pages) return j;
    const int64_t pr = keys.page_rows;
    return int64_t(keys.pages[int64_t(keys.table[t]) + j / pr]) * pr + j % pr;
  };
  const bool packed = keys.stored.compact();
  const int64_t rb = packed ? keys.stored.bytes() : dim * 4;  // bytes per key row as stored
#pragma omp parallel if (n_tok > 1 && par(n_tok * n_heads * dim * 64))
  {
  // compact key rows: decoded (exactly) into this thread's cache kdec [j][dim], slot j tagged with its pool row
  // kdec_row; the thread's next token of the same sequence finds its rows there (the tags are reset per call: only
  // the capacity is kept across calls)
  static thread_local std::vector<float> kdec;
  static thread_local std::vector<int64_t> kdec_row;
  std::fill(kdec_row.begin(), kdec_row.end(), int64_t(-1));
#pragma omp for schedule(static)
  for (int64_t t = 0; t < n_tok; ++t) {
    const int64_t nv = std::max<int64_t>(n_visible[t], 0);
    static thread_local std::vector<float> score;
    static thread_local std::vector<int32_t> order;
    score.resize(static_cast<size_t>(nv));
    const float* qt = q + t * n_heads * dim;
    const float* wt = w + t * n_heads;
    static thread_local std::vector<const float*> qh;
    static thread_local std::vector<float> dots, dh;
    if (packed && kdec.size() < size_t(nv * dim)) kdec.resize(size_t(nv * dim));
    if (packed && kdec_row.size() < size_t(nv)) kdec_row.resize(size_t(nv), -1);
    qh.resize(size_t(n_heads));
    dots.resize(size_t(n_heads));
    for (int64_t h = 0; h < n_heads; ++h) qh[size_t(h)] = qt + h * dim;
    // key row j (decoded into the cache when compact)
    auto key_row = [&](int64_t j) -> const float* {
      const int64_t pr = pool_row(t, j);
      if (!packed) return keys.rows + pr * dim;
      float* kj = kdec.data() + j * dim;
      if (kdec_row[size_t(j)] != pr) {
        decode_row(keys.stored, reinterpret_cast<const unsigned char*>(keys.rows) + pr * rb, kj);
        kdec_row[size_t(j)] = pr;
      }
      return kj;
    };
    // keys in pairs: both against the same heads (each head row loaded once for two keys); dot(k, q_h) ==
    // dot(q_h, k): the products commute. The dots go to dh [n_heads][nv] (head-major), then index_scores over all
    // keys at once (lanes = keys, each key's sum over the heads in order).
    dots.resize(size_t(2 * n_heads));
    dh.resize(size_t(n_heads * nv));
    int64_t j = 0;
    for (; j + 2 <= nv; j += 2) {
      const float* k0 = key_row(j);
      const float* k1 = key_row(j + 1);
      dot_rows2(k0, k1, qh.data(), n_heads, dim, dots.data(), dots.data() + n_heads);
      for (int64_t h = 0; h < n_heads; ++h) {
        dh[size_t(h * nv + j)] = dots[size_t(h)];
        dh[size_t(h * nv + j + 1)] = dots[size_t(n_heads + h)];
      }
    }
    for (; j < nv; ++j) {
      dot_rows(key_row(j), qh.data(), n_heads, dim, dots.data());
      for (int64_t h = 0; h < n_heads; ++h) dh[size_t(h * nv + j)] = dots[size_t(h)];
    }
    index_scores(dh.data(), nv, n_heads, wt, bf16, score.data());
    const int64_t kk = std::min(topk, nv);
    order.resize(static_cast<size_t>(nv));
    std::iota(order.begin(), order.end(), 0);
    auto better = [&](int32_t a, int32_t b) {
      return score[size_t(a)] > score[size_t(b)] || (score[size_t(a)] == score[size_t(b)] && a < b);
    };
    std::partial_sort(order.begin(), order.begin() + kk, order.end(), better);
    int32_t* st = sel + t * topk;
    for (int64_t i = 0; i < topk; ++i) st[i] = i < kk ? int32_t(pool_row(t, order[size_t(i)])) : -1;
  }
  }
}

void CpuOps::route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias,
                   const int32_t* tid2eid, const int32_t* tokens, float route_scale, int32_t* ids_out,
                   float* w_out) const {
#pragma omp parallel for schedule(static) if (par(n_tok * n_experts * 8))
  for (int64_t t = 0; t < n_tok; ++t) {
    static thread_local std::vector<float> sc, sel;
    static thread_local std::vector<int32_t> order;
    sc.resize(static_cast<size_t>(n_experts));
    sel.resize(static_cast<size_t>(n_experts));
    for (int64_t e = 0; e < n_experts; ++e) {
      const float l = logits[t * n_experts + e];
      const float sp = l > 20.0f ? l : std::log1p(std::exp(l));
      sc[size_t(e)] = std::sqrt(sp);
      sel[size_t(e)] = bias ? sc[size_t(e)] + bias[e] : sc[size_t(e)];
    }
    int32_t* ids = ids_out + t * k;
    if (tid2eid) {
      for (int64_t i = 0; i < k; ++i) ids[i] = tid2eid[int64_t(tokens[t]) * k + i];
    } else {
      order.resize(static_cast<size_t>(n_experts));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return sel[size_t(a)] > sel[size_t(b)] || (sel[size_t(a)] == sel[size_t(b)] && a < b);
      });
      for (int64_t i = 0; i < k; ++i) ids[i] = order[size_t(i)];
    }
    float* wt = w_out + t * k;
    float s = 0;
    for (int64_t i = 0; i < k; ++i) s += sc[size_t(ids[i])];
    for (int64_t i = 0; i < k; ++i) wt[i] = (sc[size_t(ids[i])] / s) * route_scale;
  }
}

void CpuOps::swiglu(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit, const float* row_w,
                    bool bf16, float* h) const {
#pragma omp parallel for schedule(static) if (par(n_rows * dim * 8))
  for (int64_t r = 0; r < n_rows; ++r) {
    static thread_local std::vector<float> e;
    e.resize(static_cast<size_t>(dim));
    swiglu_row(g + r * dim, up + r * dim, dim, limit, row_w != nullptr, row_w ? row_w[r] : 0.0f, bf16, e.data(),
               h + r * dim);
  }
}

}  // namespace dsv4
