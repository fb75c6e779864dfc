// Hyper-connection kernels of CudaOps (spec §5.3; semantics: backend/ops.h; reference: CpuOps::hc_pre / hc_post /
// hc_head in backend/cpu_ops.cpp).
//
// hc_pre / hc_head run in two kernels:
//  A. hc_mix_partial_kernel: split-K GEMM of the mix rows with the streams. Block (token tile of kTT, K split s,
//     mix slice z) stages fn[z*kMZ.., k] and X[t, k] in shared memory in chunks of kKC and accumulates one partial
//     dot product per (token, mix row) over its split (fixed per-lane order + xor butterfly), written to
//     u[t, s*mix + m] — u doubles as the scratch of the partials (the launchers have no scratch; u is overwritten
//     by kernel B of the same call). The split plan depends only on (hc, dim): row t never depends on n_tok.
//  B. hc_finish_kernel: one block per token. Sums the partials in split order (or, for dims too small to hold the
//     partials, computes the dots itself), the sum of squares in double (tree order), then the CPU's exact sequence
//     of fp32 operations for r, pre, post and the softmax + Sinkhorn normalizations of C (one lane per element of C
//     — the rows / columns of one normalization are independent, so this is the CPU's arithmetic), and finally
//     u[t, d] = Σ_j pre_j · x[j, d] in the CPU's order.
//  Given the same mix values, B reproduces the CPU bitwise; the mix dot products differ from the CPU's 8-partial-sum
//  fp32 order (and expf may differ from glibc's by an ulp), hence tolerances in the tests.
// hc_post is elementwise per (token, d) and bitwise equal to the CPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

constexpr int kMaxHc = 16;  // as CpuOps
constexpr int kMaxMix = (2 + kMaxHc) * kMaxHc;
constexpr int kThreads = 256;
constexpr int kKC = 256;  // K chunk staged in shared memory (kernel A); a split covers a multiple of it
constexpr int kTT = 16;   // tokens per tile (kernel A)
constexpr int kMZ = 24;   // mix rows per blockIdx.z slice (kernel A)
constexpr int kWarps = kThreads / 32;
constexpr int kTPW = kTT / kWarps;  // tokens per warp (kernel A)
static_assert(kTT % kWarps == 0 && kKC % 32 == 0, "tile shape");

struct SplitPlan {
  int n_splits = 0;  // 0: no split-K (the per-token kernel computes the dots)
  int64_t kc = 0;    // K elements per split (a multiple of kKC)
};

// As many splits of kKC as the width allows, at most dim / mix (the partials of a token live in its u row).
SplitPlan plan_splits(int64_t width, int64_t dim, int64_t mix) {
  SplitPlan p;
  const int64_t want = (width + kKC - 1) / kKC, cap = dim / mix;
  int64_t ns = std::min(want, cap);
  if (ns <= 0) return p;
  p.kc = ((width + ns - 1) / ns + kKC - 1) / kKC * kKC;
  p.n_splits = int((width + p.kc - 1) / p.kc);
  return p;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// CpuOps' sigmoidf: 1 / (1 + exp(-x)).
__device__ __forceinline__ float sigmoid_f(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

// ---- kernel A: split-K partial dot products ----------------------------------------------------------------------
// grid: x = token tiles, y = splits, z = mix slices. part[t * dim + s * mix + m] = Σ_{k in split s} fn[m, k] x[t, k].
__global__ void __launch_bounds__(kThreads) hc_mix_partial_kernel(const float* X, int64_t n_tok, int64_t width,
                                                                  const float* fn, int mix, int64_t kc, int64_t dim,
                                                                  float* part) {
  __shared__ float fn_s[kMZ][kKC];
  __shared__ float x_s[kTT][kKC];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t0 = int64_t(blockIdx.x) * kTT;
  const int s = blockIdx.y;
  const int m0 = blockIdx.z * kMZ, nm = min(kMZ, mix - m0);
  const int64_t k_begin = int64_t(s) * kc, k_end = k_begin + kc < width ? k_begin + kc : width;

  float acc[kTPW][kMZ];
#pragma unroll
  for (int q = 0; q < kTPW; ++q)
#pragma unroll
    for (int m = 0; m < kMZ; ++m) acc[q][m] = 0.0f;

  for (int64_t k0 = k_begin; k0 < k_end; k0 += kKC) {
    const int len = k_end - k0 < kKC ? int(k_end - k0) : kKC;
    for (int e = threadIdx.x; e < kMZ * kKC; e += kThreads) {
      const int m = e / kKC, k = e % kKC;
      fn_s[m][k] = (m < nm && k < len) ? fn[int64_t(m0 + m) * width + k0 + k] : 0.0f;
    }
    for (int e = threadIdx.x; e < kTT * kKC; e += kThreads) {
      const int tt = e / kKC, k = e % kKC;
      const int64_t t = t0 + tt;
      x_s[tt][k] = (t < n_tok && k < len) ? X[t * width + k0 + k] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kTPW; ++q) {
      const int tt = warp * kTPW + q;
#pragma unroll
      for (int i = 0; i < kKC / 32; ++i) {
        const float xv = x_s[tt][lane + 32 * i];
#pragma unroll
        for (int m = 0; m < kMZ; ++m) acc[q][m] = __fmaf_rn(fn_s[m][lane + 32 * i], xv, acc[q][m]);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int q = 0; q < kTPW; ++q) {
    const int64_t t = t0 + warp * kTPW + q;
#pragma unroll
    for (int m = 0; m < kMZ; ++m) {
      const float v = warp_sum(acc[q][m]);
      if (lane == 0 && t < n_tok && m < nm) part[t * dim + int64_t(s) * mix + m0 + m] = v;
    }
  }
}

// ---- kernel B: per-token coefficients, Sinkhorn and collapse ---------------------------------------------------
// HEAD: hc_head (mix = hc rows, pre only). Else hc_pre (mix = (2+hc)*hc; pre, post, comb).
template <bool HEAD>
__global__ void __launch_bounds__(kThreads) hc_finish_kernel(const float* X, int hc, int64_t dim, const float* fn,
                                                             const float* scale, const float* base, int sinkhorn_iters,
                                                             float hc_eps, float norm_eps, bool bf16, int n_splits,
                                                             int mix, float* u, float* post, float* comb) {
  __shared__ double red[kWarps];
  __shared__ float mix_s[kMaxMix];
  __shared__ float pre_s[kMaxHc];
  __shared__ float C[kMaxHc * kMaxHc];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x, width = int64_t(hc) * dim;
  const float* x = X + t * width;
  float* ut = u + t * dim;

  // 1. dot products (the partials are read here, before the barrier that precedes any write of u[t])
  if (n_splits > 0) {
    for (int m = threadIdx.x; m < mix; m += kThreads) {
      float s = 0.0f;
      for (int sp = 0; sp < n_splits; ++sp) s = __fadd_rn(s, ut[int64_t(sp) * mix + m]);
      mix_s[m] = s;
    }
  } else {
    for (int m = warp; m < mix; m += kWarps) {
      const float* fr = fn + int64_t(m) * width;
      float a = 0.0f;
      for (int64_t k = lane; k < width; k += 32) a = __fmaf_rn(fr[k], x[k], a);
      a = warp_sum(a);
      if (lane == 0) mix_s[m] = a;
    }
  }

  // 2. sum of squares in double (products exact), tree order
  double ss = 0.0;
  for (int64_t k = threadIdx.x; k < width; k += kThreads) {
    const double v = double(x[k]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  if (lane == 0) red[warp] = ss;
  __syncthreads();  // red and mix_s complete
  ss = 0.0;
  for (int w = 0; w < kWarps; ++w) ss += red[w];
  // CpuOps hc_mix: r = 1 / sqrt(sum_sq / width + norm_eps); mix[m] = dot * r
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(__double2float_rn(ss), float(width)), norm_eps)));

  // 3. coefficients (warp 0)
  if (warp == 0) {
    if (lane < hc) {
      const float mj = __fmul_rn(mix_s[lane], r);
      pre_s[lane] = __fadd_rn(sigmoid_f(__fadd_rn(__fmul_rn(mj, scale[0]), base[lane])), hc_eps);
      if (!HEAD) {
        const float mp = __fmul_rn(mix_s[hc + lane], r);
        post[t * hc + lane] = __fmul_rn(2.0f, sigmoid_f(__fadd_rn(__fmul_rn(mp, scale[1]), base[hc + lane])));
        // softmax of row j = lane, + hc_eps
        const int j = lane;
        float* row = C + j * hc;
        float mx = -INFINITY;
        for (int k = 0; k < hc; ++k) {
          const int mi = 2 * hc + j * hc + k;
          row[k] = __fadd_rn(__fmul_rn(__fmul_rn(mix_s[mi], r), scale[2]), base[mi]);
          mx = mx < row[k] ? row[k] : mx;  // std::max(mx, row[k])
        }
        float s = 0.0f;
        for (int k = 0; k < hc; ++k) {
          row[k] = expf(__fsub_rn(row[k], mx));
          s = __fadd_rn(s, row[k]);
        }
        for (int k = 0; k < hc; ++k) row[k] = __fadd_rn(__fdiv_rn(row[k], s), hc_eps);
      }
    }
    if (!HEAD) {
      __syncwarp();
      const int n = hc * hc;
      // One normalization: every element divided by (its row's / column's sum + hc_eps), sums in index order.
      auto normalize = [&](bool by_row) {
        float sums[(kMaxHc * kMaxHc + 31) / 32];
#pragma unroll
        for (int i = 0; i < (kMaxHc * kMaxHc + 31) / 32; ++i) {
          const int e = lane + 32 * i;
          if (e < n) {
            const int j = e / hc, k = e % hc;
            float s = 0.0f;
            for (int q = 0; q < hc; ++q) s = __fadd_rn(s, by_row ? C[j * hc + q] : C[q * hc + k]);
            sums[i] = s;
          }
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < (kMaxHc * kMaxHc + 31) / 32; ++i) {
          const int e = lane + 32 * i;
          if (e < n) C[e] = __fdiv_rn(C[e], __fadd_rn(sums[i], hc_eps));
        }
        __syncwarp();
      };
      normalize(false);
      for (int it = 1; it < sinkhorn_iters; ++it) {
        normalize(true);
        normalize(false);
      }
      for (int e = lane; e < n; e += 32) comb[t * n + e] = C[e];
    }
  }
  __syncthreads();  // pre_s ready; every read of the partials in u[t] is done

  // 4. collapse: u[d] = Σ_j pre_j x[j, d] (CPU order), bf16 when bf16
  for (int64_t d = threadIdx.x; d < dim; d += kThreads) {
    float s = 0.0f;
    for (int j = 0; j < hc; ++j) s = __fadd_rn(s, __fmul_rn(pre_s[j], x[int64_t(j) * dim + d]));
    ut[d] = maybe_bf16(s, bf16);
  }
}

template <bool HEAD>
void hc_collapse(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                 const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u, float* post,
                 float* comb, cudaStream_t stream) {
  if (n_tok <= 0 || hc <= 0 || hc > kMaxHc || dim <= 0) return;
  const int64_t width = int64_t(hc) * dim;
  const int mix = HEAD ? hc : (2 + hc) * hc;
  const SplitPlan p = plan_splits(width, dim, mix);
  if (p.n_splits > 0) {
    const dim3 grid(unsigned((n_tok + kTT - 1) / kTT), unsigned(p.n_splits), unsigned((mix + kMZ - 1) / kMZ));
    hc_mix_partial_kernel<<<grid, kThreads, 0, stream>>>(X, n_tok, width, fn, mix, p.kc, dim, u);
  }
  hc_finish_kernel<HEAD><<<unsigned(n_tok), kThreads, 0, stream>>>(X, hc, dim, fn, scale, base, sinkhorn_iters,
                                                                   hc_eps, norm_eps, bf16, p.n_splits, mix, u, post,
                                                                   comb);
}

// ---- hc_post -----------------------------------------------------------------------------------------------------
// Block (token t, chunk c of kPostThreads vectors). Each thread loads X[t, j, d] for every j before writing
// Xout[t, k, d] (Xout may alias X; no other thread touches these elements).
constexpr int kPostThreads = 128;

__device__ __forceinline__ float vget(const float& v, int) { return v; }
__device__ __forceinline__ float vget(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
__device__ __forceinline__ void vset(float& v, int, float a) { v = a; }
__device__ __forceinline__ void vset(float4& v, int i, float a) {
  if (i == 0) v.x = a;
  else if (i == 1) v.y = a;
  else if (i == 2) v.z = a;
  else v.w = a;
}

template <class V, int MAXHC>
__global__ void __launch_bounds__(kPostThreads) hc_post_kernel(const float* f, const float* X, const float* post,
                                                               const float* comb, int hc, int64_t dim, int64_t chunks,
                                                               bool bf16, float* Xout) {
  constexpr int L = sizeof(V) / sizeof(float);
  __shared__ float C_s[MAXHC * MAXHC];
  __shared__ float p_s[MAXHC];
  const int64_t t = blockIdx.x / chunks, c = blockIdx.x % chunks;
  for (int e = threadIdx.x; e < hc * hc; e += kPostThreads) C_s[e] = comb[t * hc * hc + e];
  for (int e = threadIdx.x; e < hc; e += kPostThreads) p_s[e] = post[t * hc + e];
  __syncthreads();
  const int64_t dimv = dim / L, dv = c * kPostThreads + threadIdx.x;
  if (dv >= dimv) return;
  const V* xt = reinterpret_cast<const V*>(X + t * hc * dim);
  V xv[MAXHC];
#pragma unroll
  for (int j = 0; j < MAXHC; ++j)
    if (j < hc) xv[j] = xt[j * dimv + dv];
  const V fv = reinterpret_cast<const V*>(f + t * dim)[dv];
  V* ot = reinterpret_cast<V*>(Xout + t * hc * dim);
#pragma unroll
  for (int k = 0; k < MAXHC; ++k) {
    if (k >= hc) break;
    V o;
#pragma unroll
    for (int l = 0; l < L; ++l) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < MAXHC; ++j)
        if (j < hc) s = __fadd_rn(s, __fmul_rn(C_s[j * hc + k], vget(xv[j], l)));
      vset(o, l, maybe_bf16(__fadd_rn(__fmul_rn(p_s[k], vget(fv, l)), s), bf16));
    }
    ot[k * dimv + dv] = o;
  }
}

template <class V>
void launch_hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc,
                    int64_t dim, bool bf16, float* Xout, cudaStream_t stream) {
  const int64_t dimv = dim / int64_t(sizeof(V) / sizeof(float));
  const int64_t chunks = (dimv + kPostThreads - 1) / kPostThreads;
  const unsigned grid = unsigned(n_tok * chunks);
  if (hc <= 4)
    hc_post_kernel<V, 4><<<grid, kPostThreads, 0, stream>>>(f, X, post, comb, hc, dim, chunks, bf16, Xout);
  else
    hc_post_kernel<V, kMaxHc><<<grid, kPostThreads, 0, stream>>>(f, X, post, comb, hc, dim, chunks, bf16, Xout);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
            const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u, float* post,
            float* comb, cudaStream_t stream) {
  hc_collapse<false>(X, n_tok, hc, dim, fn, scale, base, sinkhorn_iters, hc_eps, norm_eps, bf16, u, post, comb,
                     stream);
}

void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc, int64_t dim,
             bool bf16, float* Xout, cudaStream_t stream) {
  if (n_tok <= 0 || hc <= 0 || hc > kMaxHc || dim <= 0) return;
  if (dim % 4 == 0 && aligned16(f) && aligned16(X) && aligned16(Xout))
    launch_hc_post<float4>(f, X, post, comb, n_tok, hc, dim, bf16, Xout, stream);
  else
    launch_hc_post<float>(f, X, post, comb, n_tok, hc, dim, bf16, Xout, stream);
}

void hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
             const float* base, float hc_eps, float norm_eps, bool bf16, float* u, cudaStream_t stream) {
  hc_collapse<true>(X, n_tok, hc, dim, fn, scale, base, 1, hc_eps, norm_eps, bf16, u, nullptr, nullptr, stream);
}

}  // namespace dsv4::cuda
