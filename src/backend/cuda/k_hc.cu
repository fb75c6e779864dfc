// Hyper-connection kernels of CudaOps (spec §5.3; semantics: backend/ops.h; reference: CpuOps::hc_pre / hc_post /
// hc_head in backend/cpu_ops.cpp). All three are bitwise equal to the CPU for every input.
//
// hc_pre / hc_head run in two kernels:
//  A. hc_dot_kernel: the mix dot products dot[t, m] = fn[m, :] . X[t, :] in the exact order of CpuOps' dot(): 8
//     partial sums, chain l accumulating the elements k = l, l+8, l+16, ... sequentially (acc = acc + fn*x, product
//     and sum rounded separately, no FMA; the CPU's tail loop also puts element k into chain k % 8), combined as
//     ((0+1)+(2+3))+((4+5)+(6+7)) by a xor butterfly over the 8 lanes of a chain group. A thread owns chain l of a
//     register tile of TT tokens x MM mix rows; the CTA (256 threads, all of them loading) streams X and fn through
//     double-buffered shared memory in chunks of KC columns (a multiple of 8, so a chain stays a chain; the last
//     chunk is zero-padded: acc + (+0) == acc exactly, acc is never -0). The tile shape is picked by n_tok (decode:
//     one token x one mix row per CTA, 8 chains; prefill: wider tiles) -- every shape performs the same operations
//     on every dot product, so the result never depends on n_tok (batch invariant). The dots go to u[t, 0..mix)
//     (the launchers have no scratch; kernel B reads them before it overwrites u[t]); when mix > dim they do not fit
//     and kernel B computes them itself, in the same order.
//  B. hc_finish_kernel: one CTA per token. The sum of squares in double, see below; then the CPU's exact sequence of
//     fp32 operations: r = 1 / sqrt(sum_sq / width + eps), mix = dot * r, pre / post through sigmoid
//     1 / (1 + exp(-x)), the row softmax of C + hc_eps and the Sinkhorn normalizations (one lane per element of C:
//     the rows / columns of one normalization are independent, sums in index order), exp = glibc's expf
//     (glibc_math.cuh); finally u[t, d] = sum_j pre_j x[j, d] in the CPU's order (bf16 when bf16).
//  Sum of squares: the CPU adds double(x)^2 sequentially (products exact in double) and rounds the double sum to
//  float. Kernel B first sums in a tree (per thread, warp butterfly, warps in order; depth <= n/256 + 12). Both
//  double sums are within gamma_{n-1}*S resp. gamma_{n/256+12}*S of the exact sum S (nonnegative terms), so the CPU's
//  sum lies in [S_tree - E, S_tree + E] with E = (2n + 64) 2^-53 S_tree (a 2x margin, also covering the rounding of
//  the interval ends). If both ends round to the same float, float(S_cpu) == float(S_tree) (rounding is monotone);
//  otherwise (probability ~1e-4 per token: the interval holds a float rounding boundary; also any inf / NaN) one
//  thread recomputes the CPU's sequential sum exactly (~16k dependent double adds, ~70 us for that CTA).
// hc_post is elementwise per (token, d) with the CPU's operation order.
// Fast mode (the default; not deterministic(), gemm_path.h): decode calls (n_tok <= 32) compute the dots with
// hc_dot_fast_kernel (one CTA per (token, dot, slice of the width): fma chains, fixed-order reductions, the slices'
// partial sums added by kernel B in slice order; the slice count depends on the width only), kernel B keeps its
// tree sum of squares and runs the Sinkhorn normalizations with butterfly sums and reciprocal multiplies (hc = 4);
// everything else as above. Deterministic and batch invariant, within fp32 rounding of the CPU. Kernel B can also
// apply the sublayer's rmsnorm to its collapse (hc_pre_norm): the same operations in the same order as
// rmsnorm_vec_kernel<256, 8> on the stored u (k_elementwise.cu), so the fused result equals hc_pre + rmsnorm bitwise.
//
// Cost estimate (H200, hc 4 x dim 4096 = width 16384, mix 24): the floor is the CPU's dependency chain -- 2048
// sequential fp32 adds per chain (~4 cycles each). n_tok = 1: 24 CTAs of 8 chains, ~11k cycles ~ 6 us for kernel A,
// ~2-3 us for kernel B (Sinkhorn latency). n_tok = 2048: 256 CTAs of 8 tokens x 24 rows, issue-bound at 2 fp32
// instructions (FMUL + FADD, no FMA allowed) per product: ~75-85 us for kernel A, ~5 us for kernel B.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/device_pdl.cuh"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/glibc_math.cuh"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

constexpr int kMaxHc = 16;  // as CpuOps
constexpr int kMaxMix = (2 + kMaxHc) * kMaxHc;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChains = 8;  // CpuOps dot(): 8 partial sums
constexpr int kMaxSlices = 8;  // slices of the width hc_dot_fast_kernel splits a dot into (dot_slices)

// Tile shape of kernel A by n_tok (results do not depend on it).
constexpr int64_t kDecodeMaxTok = 32;   // n_tok <= this: one (token, mix row) per CTA
constexpr int64_t kLargeMinTok = 1536;  // hc_pre, n_tok >= this: 8 tokens x 24 rows per CTA, 6 dots per thread

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// The CPU's combination of the 8 partial sums held by 8 consecutive lanes (lane l = chain l):
// ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)) (fp32 addition is commutative, so every lane of the group ends with it).
// Called by full warps.
__device__ __forceinline__ float combine8(float a) {
  a = __fadd_rn(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
  a = __fadd_rn(a, __shfl_xor_sync(0xFFFFFFFFu, a, 2));
  a = __fadd_rn(a, __shfl_xor_sync(0xFFFFFFFFu, a, 4));
  return a;
}

// CpuOps' sigmoidf: 1.0f / (1.0f + std::exp(-x)).
__device__ __forceinline__ float sigmoid_f(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf_glibc(-x))); }

// ---- kernel A: the mix dot products in the CPU's order -----------------------------------------------------------
// Threads: tid = 8 g + l (l: chain); group g = tg * RG + rg (rg: row group, tg: token group). A thread accumulates
// chain l of the tokens tg*TT + q (q < TT) and the mix rows rg + RG*mm (mm < MM) of the CTA's tile. The 4 groups of
// a warp share tg (RG % 4 == 0) or are one group (RG = TG = 1): X reads are broadcasts, fn reads hit 4 consecutive
// rows, conflict-free with the row stride KC + 8 (= 8 mod 32 banks).
template <int TT, int MM, int RG, int TG, int KC>
struct DotTile {
  static constexpr int kBT = TT * TG;          // tokens per CTA
  static constexpr int kBM = MM * RG;          // mix rows per CTA
  static constexpr int kRows = kBT + kBM;      // staged rows: X rows, then fn rows
  static constexpr int kKS = KC + 8;           // staged row stride (floats)
  static constexpr int kNC = kChains * RG * TG;  // compute threads
  static constexpr int kNV = kRows * KC / 4 / kThreads;  // float4 loads per thread per chunk
  static_assert(KC % 32 == 0 && (kRows * KC) % (4 * kThreads) == 0, "chunk shape");
  static_assert(kNC <= kThreads && (RG % 4 == 0 || (RG == 1 && TG == 1)), "thread layout");
  static_assert(2 * kRows * kKS * 4 <= 48 * 1024, "static shared memory");
};

template <int TT, int MM, int RG, int TG, int KC>
__global__ void __launch_bounds__(kThreads) hc_dot_kernel(const float* X, int64_t n_tok, int64_t width,
                                                          const float* fn, int mix, bool vec, int64_t out_stride,
                                                          float* out) {
  using T = DotTile<TT, MM, RG, TG, KC>;
  __shared__ __align__(16) float sm[2][T::kRows * T::kKS];
  const int tid = threadIdx.x;
  const int64_t t0 = int64_t(blockIdx.x) * T::kBT;
  const int m0 = int(blockIdx.y) * T::kBM;
  const int64_t n_chunks = (width + KC - 1) / KC;

  // staging: slot s = tid + kThreads * i of a chunk is (row s / (KC/4), columns 4 * (s % (KC/4)) .. +3)
  float4 st[T::kNV];
  auto load = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < T::kNV; ++i) {
      const int s = tid + kThreads * i, r = s / (KC / 4);
      const int64_t k = k0 + 4 * (s % (KC / 4));
      const float* src = nullptr;
      if (r < T::kBT) {
        if (t0 + r < n_tok) src = X + (t0 + r) * width;
      } else if (m0 + r - T::kBT < mix) {
        src = fn + int64_t(m0 + r - T::kBT) * width;
      }
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (src != nullptr) {
        if (vec) {  // width % 4 == 0: the float4 is entirely inside or entirely outside the row
          if (k < width) v = *reinterpret_cast<const float4*>(src + k);
        } else {
          if (k < width) v.x = src[k];
          if (k + 1 < width) v.y = src[k + 1];
          if (k + 2 < width) v.z = src[k + 2];
          if (k + 3 < width) v.w = src[k + 3];
        }
      }
      st[i] = v;
    }
  };
  auto store = [&](int b) {
#pragma unroll
    for (int i = 0; i < T::kNV; ++i) {
      const int s = tid + kThreads * i, r = s / (KC / 4), c = 4 * (s % (KC / 4));
      *reinterpret_cast<float4*>(&sm[b][r * T::kKS + c]) = st[i];
    }
  };

  const int l = tid % kChains, g = tid / kChains, rg = g % RG, tg = g / RG;
  const bool computes = tid < T::kNC;
  float acc[TT][MM];
#pragma unroll
  for (int q = 0; q < TT; ++q)
#pragma unroll
    for (int mm = 0; mm < MM; ++mm) acc[q][mm] = 0.0f;

  load(0);
  store(0);
  __syncthreads();
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int b = int(c & 1);
    const bool more = c + 1 < n_chunks;
    if (more) load((c + 1) * KC);  // in flight during the compute below
    if (computes) {
      const float* xs = &sm[b][(tg * TT) * T::kKS + l];
      const float* fs = &sm[b][(T::kBT + rg) * T::kKS + l];
#pragma unroll 16
      for (int i = 0; i < KC / kChains; ++i) {  // element k = 8 i + l of the chunk
        float xv[TT], fv[MM];
#pragma unroll
        for (int q = 0; q < TT; ++q) xv[q] = xs[q * T::kKS + kChains * i];
#pragma unroll
        for (int mm = 0; mm < MM; ++mm) fv[mm] = fs[mm * RG * T::kKS + kChains * i];
#pragma unroll
        for (int q = 0; q < TT; ++q)
#pragma unroll
          for (int mm = 0; mm < MM; ++mm) acc[q][mm] = __fadd_rn(acc[q][mm], __fmul_rn(fv[mm], xv[q]));
      }
    }
    // buffer b ^ 1 was last read in iteration c - 1, before the barrier that ended it
    if (more) store(b ^ 1);
    __syncthreads();
  }

  if (tid < (T::kNC + 31) / 32 * 32) {  // whole warps (the shuffles); lanes past kNC hold zeros and write nothing
#pragma unroll
    for (int q = 0; q < TT; ++q)
#pragma unroll
      for (int mm = 0; mm < MM; ++mm) {
        const float v = combine8(acc[q][mm]);
        const int64_t t = t0 + tg * TT + q;
        const int m = m0 + rg + RG * mm;
        if (computes && l == 0 && t < n_tok && m < mix) out[t * out_stride + m] = v;
      }
  }
}

template <int TT, int MM, int RG, int TG, int KC>
void launch_dots(const float* X, int64_t n_tok, int64_t width, const float* fn, int mix, bool vec, int64_t out_stride,
                 float* out, cudaStream_t stream) {
  using T = DotTile<TT, MM, RG, TG, KC>;
  const dim3 grid(unsigned((n_tok + T::kBT - 1) / T::kBT), unsigned((mix + T::kBM - 1) / T::kBM));
  hc_dot_kernel<TT, MM, RG, TG, KC><<<grid, kThreads, 0, stream>>>(X, n_tok, width, fn, mix, vec, out_stride, out);
}

// ---- kernel A, fast mode (decode; not the CPU's order) ---------------------------------------------------------
// One CTA per (token t, mix row m, slice z of the width): every thread sums its float4s of the slice with 4
// independent fma chains, the lanes by a xor butterfly, the 8 warps in order; the result goes to
// out[t, z (mix + 2) + m]. Row m == mix is the slice's sum of squares of X[t] instead: double accumulation in a tree,
// written as two floats (hi = float(sum), lo = float(sum - hi)) to out[t, z (mix + 2) + mix, + 1]. Kernel B adds
// the slices in order. Deterministic and batch invariant; fp32 rounding differs from the CPU's.
__global__ void __launch_bounds__(kThreads) hc_dot_fast_kernel(const float* X, int64_t width, const float* fn,
                                                               int mix, int slices, int64_t out_stride, float* out) {
  __shared__ float red[kWarps];
  __shared__ double redd[kWarps];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int m = int(blockIdx.y), z = int(blockIdx.z);
  const int64_t per = width / 4 / slices, k0 = int64_t(z) * per, k1 = k0 + per;  // this slice's float4s
  const float4* x4 = reinterpret_cast<const float4*>(X + t * width);
  float* o = out + t * out_stride + int64_t(z) * (mix + 2);
  if (m == mix) {
    double q = 0.0;
#pragma unroll 8  // the loads of 8 iterations in flight (the accumulation order is unchanged)
    for (int64_t k = k0 + threadIdx.x; k < k1; k += kThreads) {
      const float4 xv = __ldg(x4 + k);
      q = __fma_rn(double(xv.x), double(xv.x), q);
      q = __fma_rn(double(xv.y), double(xv.y), q);
      q = __fma_rn(double(xv.z), double(xv.z), q);
      q = __fma_rn(double(xv.w), double(xv.w), q);
    }
    q = warp_sum(q);
    if ((threadIdx.x & 31) == 0) redd[threadIdx.x >> 5] = q;
    __syncthreads();
    if (threadIdx.x == 0) {
      double s = redd[0];
      for (int w = 1; w < kWarps; ++w) s = __dadd_rn(s, redd[w]);
      const float hi = __double2float_rn(s);
      o[mix] = hi;
      o[mix + 1] = __double2float_rn(__dsub_rn(s, double(hi)));
    }
    return;
  }
  const float4* f4 = reinterpret_cast<const float4*>(fn + int64_t(m) * width);
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma unroll 8  // the loads of 8 iterations in flight (the accumulation order is unchanged)
  for (int64_t k = k0 + threadIdx.x; k < k1; k += kThreads) {
    const float4 xv = __ldg(x4 + k), fv = __ldg(f4 + k);
    a0 = __fmaf_rn(xv.x, fv.x, a0);
    a1 = __fmaf_rn(xv.y, fv.y, a1);
    a2 = __fmaf_rn(xv.z, fv.z, a2);
    a3 = __fmaf_rn(xv.w, fv.w, a3);
  }
  float a = __fadd_rn(__fadd_rn(a0, a1), __fadd_rn(a2, a3));
#pragma unroll
  for (int o2 = 16; o2 > 0; o2 >>= 1) a = __fadd_rn(a, __shfl_xor_sync(0xFFFFFFFFu, a, o2));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = a;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sm = red[0];
    for (int w = 1; w < kWarps; ++w) sm = __fadd_rn(sm, red[w]);
    o[m] = sm;
  }
}

// Slices of the width hc_dot_fast_kernel splits a token's dots into: the most of 8 (kMaxSlices), 4, 2 that divide the
// width's float4s and leave every thread at least one of them (a function of the width only: batch invariance).
int dot_slices(int64_t width) {
  const int64_t w4 = width / 4;
  for (int z = kMaxSlices; z > 1; z /= 2)
    if (w4 % z == 0 && w4 / z >= kThreads) return z;
  return 1;
}

// ---- the residual-mixing matrix C of one token (hc_pre): row softmax + hc_eps, then the Sinkhorn normalizations --
// CpuOps' order for every element: C[j, k] = (mix[2hc + j hc + k] r) scale2 + base[..]; row max (std::max, in k
// order); exp(C - max); row sum from 0 in k order; C / sum + hc_eps; then one column normalization and
// (iters - 1) x (row, column) normalizations, each element divided by (its row's / column's sum from 0 in index
// order + hc_eps), all sums of a normalization taken before any element changes.
// comb_lanes: hc * hc <= 32, one lane of warp 0 per element e = j hc + k; the sums gather their terms by shuffles
// (the same fp32 additions in the same order), so the whole chain stays in registers (HC > 0: hc known at compile
// time). comb_smem: any hc <= kMaxHc, the elements in shared memory C (row softmax by lanes < hc).
template <int HC>
__device__ __forceinline__ void comb_lanes(const float* mix_s, float r, float scale2, const float* base, int hc_rt,
                                           int iters, float hc_eps, int lane, float* comb_t) {
  const int hc = HC > 0 ? HC : hc_rt, n = hc * hc;
  const int e = lane < n ? lane : 0;  // lanes past n mirror element 0 (their values are never used or stored)
  const int j = e / hc, k = e % hc;
  const int mi = 2 * hc + e;
  float c = __fadd_rn(__fmul_rn(__fmul_rn(mix_s[mi], r), scale2), base[mi]);
  float mx = -INFINITY;
#pragma unroll
  for (int q = 0; q < (HC > 0 ? HC : kMaxHc); ++q) {
    if (HC == 0 && q >= hc) break;
    const float v = __shfl_sync(0xFFFFFFFFu, c, j * hc + q);
    mx = mx < v ? v : mx;  // std::max(mx, row[q])
  }
  c = expf_glibc(__fsub_rn(c, mx));
  float s = 0.0f;
#pragma unroll
  for (int q = 0; q < (HC > 0 ? HC : kMaxHc); ++q) {
    if (HC == 0 && q >= hc) break;
    s = __fadd_rn(s, __shfl_sync(0xFFFFFFFFu, c, j * hc + q));
  }
  c = __fadd_rn(__fdiv_rn(c, s), hc_eps);
  auto normalize = [&](bool by_row) {
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < (HC > 0 ? HC : kMaxHc); ++q) {
      if (HC == 0 && q >= hc) break;
      sum = __fadd_rn(sum, __shfl_sync(0xFFFFFFFFu, c, by_row ? j * hc + q : q * hc + k));
    }
    c = __fdiv_rn(c, __fadd_rn(sum, hc_eps));
  };
  normalize(false);
  for (int it = 1; it < iters; ++it) {
    normalize(true);
    normalize(false);
  }
  if (lane < n) comb_t[lane] = c;
}

// Fast mode, hc = 4 (comb_lanes' layout: lane e = 4 j + k holds C[j, k]): the row sums by xor butterflies over
// lanes 4 j .. 4 j + 3, the column sums over lanes k, k + 4, k + 8, k + 12, the divisions as reciprocal multiplies.
// Deterministic; within fp32 rounding of the CPU's sequence.
__device__ __forceinline__ void comb_lanes_fast4(const float* mix_s, float r, float scale2, const float* base,
                                                 int iters, float hc_eps, int lane, float* comb_t) {
  const int e = lane & 15;  // lanes 16..31 mirror 0..15 (their xor partners stay among them); only lanes < 16 store
  const int mi = 8 + e;
  float c = __fadd_rn(__fmul_rn(__fmul_rn(mix_s[mi], r), scale2), base[mi]);
  auto row = [&](float v, bool sum) {
    const float a = __shfl_xor_sync(0xFFFFFFFFu, v, 1);
    v = sum ? __fadd_rn(v, a) : fmaxf(v, a);
    const float b = __shfl_xor_sync(0xFFFFFFFFu, v, 2);
    return sum ? __fadd_rn(v, b) : fmaxf(v, b);
  };
  auto col = [&](float v) {
    v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, 4));
    return __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, 8));
  };
  c = expf_glibc(__fsub_rn(c, row(c, false)));
  c = __fadd_rn(__fmul_rn(c, __frcp_rn(row(c, true))), hc_eps);
  c = __fmul_rn(c, __frcp_rn(__fadd_rn(col(c), hc_eps)));
  for (int it = 1; it < iters; ++it) {
    c = __fmul_rn(c, __frcp_rn(__fadd_rn(row(c, true), hc_eps)));
    c = __fmul_rn(c, __frcp_rn(__fadd_rn(col(c), hc_eps)));
  }
  if (lane < 16) comb_t[lane] = c;
}

__device__ __forceinline__ void comb_smem(const float* mix_s, float r, float scale2, const float* base, int hc,
                                          int iters, float hc_eps, int lane, float* C, float* comb_t) {
  if (lane < hc) {  // softmax of row j = lane, + hc_eps
    const int j = lane;
    float* row = C + j * hc;
    float mx = -INFINITY;
    for (int k = 0; k < hc; ++k) {
      const int mi = 2 * hc + j * hc + k;
      row[k] = __fadd_rn(__fmul_rn(__fmul_rn(mix_s[mi], r), scale2), base[mi]);
      mx = mx < row[k] ? row[k] : mx;  // std::max(mx, row[k])
    }
    float s = 0.0f;
    for (int k = 0; k < hc; ++k) {
      row[k] = expf_glibc(__fsub_rn(row[k], mx));
      s = __fadd_rn(s, row[k]);
    }
    for (int k = 0; k < hc; ++k) row[k] = __fadd_rn(__fdiv_rn(row[k], s), hc_eps);
  }
  __syncwarp();
  const int n = hc * hc;
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
  for (int it = 1; it < iters; ++it) {
    normalize(true);
    normalize(false);
  }
  for (int e = lane; e < n; e += 32) comb_t[e] = C[e];
}

// Columns 4 d4 .. 4 d4 + 3 of the collapse u = sum_j pre_j x[j, :] of one token (x [hc, dim], float4 aligned): the
// CPU's per-element order (sum from 0 in j order, product and sum rounded separately), before any bf16 rounding.
// s += p * x per column, product and sum rounded separately (one step of the collapse in the CPU's order).
__device__ __forceinline__ void add_weighted4(float4& s, float p, const float4& x) {
  s.x = __fadd_rn(s.x, __fmul_rn(p, x.x));
  s.y = __fadd_rn(s.y, __fmul_rn(p, x.y));
  s.z = __fadd_rn(s.z, __fmul_rn(p, x.z));
  s.w = __fadd_rn(s.w, __fmul_rn(p, x.w));
}

__device__ __forceinline__ float4 collapse4(const float* x, int hc, int64_t dim, const float* pre_s, int64_t d4) {
  float4 s4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int j = 0; j < hc; ++j)
    add_weighted4(s4, pre_s[j], __ldg(reinterpret_cast<const float4*>(x + int64_t(j) * dim) + d4));
  return s4;
}

// Fast mode: hc_dot_fast_kernel leaves, per slice z of the width, the partial dots of the mix rows in
// ut[z * (mix + 2) + m] and the slice's sum of squares as (hi, lo) in ut[z * (mix + 2) + mix, + 1]. The dot of row m:
// the slices added in slice order; the sum of squares: the (hi + lo) pairs added in double in slice order, as a float.
__device__ __forceinline__ float slice_dot(const float* ut, int mix, int slices, int m) {
  float a = ut[m];
#pragma unroll
  for (int z = 1; z < kMaxSlices; ++z)
    if (z < slices) a = __fadd_rn(a, ut[z * (mix + 2) + m]);
  return a;
}
__device__ __forceinline__ float slice_sum_sq(const float* ut, int mix, int slices) {
  double q = 0.0;
#pragma unroll
  for (int z = 0; z < kMaxSlices; ++z)
    if (z < slices) q = __dadd_rn(q, __dadd_rn(double(ut[z * (mix + 2) + mix]), double(ut[z * (mix + 2) + mix + 1])));
  return __double2float_rn(q);
}
// CpuOps hc_mix's r = 1 / sqrt(sum_sq / width + norm_eps) (mix[m] = dot * r), and the coefficients from a mix row's
// dot: pre_j = sigmoid(mix scale0 + base_j) + hc_eps, post_j = 2 sigmoid(mix scale1 + base_{hc + j}).
__device__ __forceinline__ float mix_rnorm(float sum_sq, int64_t width, float norm_eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_sq, float(width)), norm_eps)));
}
__device__ __forceinline__ float pre_coef(float dot, float r, float scale0, float base, float hc_eps) {
  return __fadd_rn(sigmoid_f(__fadd_rn(__fmul_rn(__fmul_rn(dot, r), scale0), base)), hc_eps);
}
__device__ __forceinline__ float post_coef(float dot, float r, float scale1, float base) {
  return __fmul_rn(2.0f, sigmoid_f(__fadd_rn(__fmul_rn(__fmul_rn(dot, r), scale1), base)));
}

// The sublayer's rmsnorm of the collapsed row, fused (hc_pre_norm), then u written: rmsnorm_vec_kernel<256, 8>'s
// steps on this thread's columns v[j] (d4 = threadIdx.x + j kThreads, those < dim / 4): the squares summed exactly in
// double in j order, the row's sum by block_sum (row_sum<kThreads>'s order), then (w * (v * scale)), bf16 when bf16.
// So the fused result equals hc_pre + rmsnorm bitwise.
template <int NV, class BlockSum>
__device__ __forceinline__ void norm_store4(const float4 (&v)[NV], int64_t dim, float norm_eps, const float* norm_w,
                                            bool bf16, float* ut, BlockSum block_sum) {
  double ss2 = 0.0;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t d4 = threadIdx.x + int64_t(j) * kThreads;
    if (d4 >= dim / 4) continue;
    ss2 += double(v[j].x) * double(v[j].x);  // exact products
    ss2 += double(v[j].y) * double(v[j].y);
    ss2 += double(v[j].z) * double(v[j].z);
    ss2 += double(v[j].w) * double(v[j].w);
  }
  ss2 = block_sum(ss2);
  const float sc = rms_scale(ss2, dim, norm_eps);
  const float4* w4 = reinterpret_cast<const float4*>(norm_w);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t d4 = threadIdx.x + int64_t(j) * kThreads;
    if (d4 >= dim / 4) continue;
    const float4 wv = w4[d4];
    float4 o;
    o.x = maybe_bf16(__fmul_rn(wv.x, __fmul_rn(v[j].x, sc)), bf16);
    o.y = maybe_bf16(__fmul_rn(wv.y, __fmul_rn(v[j].y, sc)), bf16);
    o.z = maybe_bf16(__fmul_rn(wv.z, __fmul_rn(v[j].z, sc)), bf16);
    o.w = maybe_bf16(__fmul_rn(wv.w, __fmul_rn(v[j].w, sc)), bf16);
    reinterpret_cast<float4*>(ut)[d4] = o;
  }
}

// ---- kernel B: per-token coefficients, Sinkhorn and collapse ---------------------------------------------------
// HEAD: hc_head (mix = hc rows, pre only). Else hc_pre (mix = (2+hc)*hc; pre, post, comb). have_dots: kernel A left
// the dot products in u[t, 0..mix).
template <bool HEAD>
__global__ void __launch_bounds__(kThreads) hc_finish_kernel(const float* X, int hc, int64_t dim, const float* fn,
                                                             const float* scale, const float* base, int sinkhorn_iters,
                                                             float hc_eps, float norm_eps, bool bf16, bool have_dots,
                                                             int mix, bool exact_ss, int slices, const float* norm_w,
                                                             float* u, float* post, float* comb) {
  __shared__ double red[kWarps];
  __shared__ double ss_seq;
  __shared__ float mix_s[kMaxMix];
  __shared__ float pre_s[kMaxHc];
  __shared__ float C[kMaxHc * kMaxHc];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x, width = int64_t(hc) * dim;
  const float* x = X + t * width;
  float* ut = u + t * dim;

  // 1. dot products (read from u[t] before the barriers that precede any write of u[t]; or computed here, in the
  //    CPU's order: 32 rows at a time, 8 chain lanes per row)
  if (have_dots && !exact_ss) {  // fast mode: the slices' partial dots, added in slice order
    for (int m = threadIdx.x; m < mix; m += kThreads) mix_s[m] = slice_dot(ut, mix, slices, m);
  } else if (have_dots) {
    for (int m = threadIdx.x; m < mix; m += kThreads) mix_s[m] = ut[m];
  } else {
    const int l = threadIdx.x % kChains, g = threadIdx.x / kChains;
    for (int mb = 0; mb < mix; mb += kThreads / kChains) {  // uniform trip count (the shuffles)
      const int m = mb + g;
      float a = 0.0f;
      if (m < mix) {
        const float* fr = fn + int64_t(m) * width;
        for (int64_t k = l; k < width; k += kChains) a = __fadd_rn(a, __fmul_rn(fr[k], x[k]));
      }
      a = combine8(a);
      if (l == 0 && m < mix) mix_s[m] = a;
    }
  }

  // fast mode (!exact_ss): kernel A left each slice's sum of squares as (hi, lo) in u[t, z (mix + 2) + mix, + 1]
  const float ss_fast = exact_ss ? 0.0f : slice_sum_sq(ut, mix, slices);
  // 2. sum of squares in double: tree order, exact CPU (sequential) sum where the float rounding could differ
  double ss = 0.0;
  if (exact_ss) {
    for (int64_t k = threadIdx.x; k < width; k += kThreads) {
      const double v = double(x[k]);
      ss = __dadd_rn(ss, __dmul_rn(v, v));
    }
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    __syncthreads();  // red and mix_s complete
    ss = 0.0;
    for (int w = 0; w < kWarps; ++w) ss = __dadd_rn(ss, red[w]);  // every thread: the same value
    const double err = __dmul_rn(ss, double(2 * width + 64) * 0x1p-53);
    if (!(__double2float_rn(__dsub_rn(ss, err)) == __double2float_rn(__dadd_rn(ss, err)))) {  // uniform branch
      if (threadIdx.x == 0) {
        double s = 0.0;
        for (int64_t k = 0; k < width; ++k) {
          const double v = double(x[k]);
          s = __dadd_rn(s, __dmul_rn(v, v));
        }
        ss_seq = s;
      }
      __syncthreads();
      ss = ss_seq;
    }
  } else {
    __syncthreads();  // mix_s complete
  }
  // CpuOps hc_mix: r = 1 / sqrt(sum_sq / width + norm_eps); mix[m] = dot * r
  const float r = mix_rnorm(exact_ss ? __double2float_rn(ss) : ss_fast, width, norm_eps);

  // 3. coefficients (warp 0)
  if (warp == 0) {
    if (lane < hc) {
      pre_s[lane] = pre_coef(mix_s[lane], r, scale[0], base[lane], hc_eps);
      if (!HEAD) post[t * hc + lane] = post_coef(mix_s[hc + lane], r, scale[1], base[hc + lane]);
    }
    if (!HEAD) {
      if (hc == 4 && !exact_ss) comb_lanes_fast4(mix_s, r, scale[2], base, sinkhorn_iters, hc_eps, lane, comb + t * 16);
      else if (hc == 4) comb_lanes<4>(mix_s, r, scale[2], base, hc, sinkhorn_iters, hc_eps, lane, comb + t * 16);
      else if (hc * hc <= 32)
        comb_lanes<0>(mix_s, r, scale[2], base, hc, sinkhorn_iters, hc_eps, lane, comb + t * hc * hc);
      else
        comb_smem(mix_s, r, scale[2], base, hc, sinkhorn_iters, hc_eps, lane, C, comb + t * hc * hc);
    }
  }
  __syncthreads();  // pre_s ready; every read of the dots in u[t] is done

  // 4. collapse: u[d] = sum_j pre_j x[j, d] (CPU order), bf16 when bf16; fast mode: 4 columns per float4 load
  //    (the same operations per element)
  if (norm_w != nullptr) {  // fast mode, 1024 < dim <= 8192, dim % 4 == 0: then rmsnorm_vec_kernel<256, 8>'s steps
    constexpr int NV = 8;
    float4 v[NV];
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int64_t d4 = threadIdx.x + int64_t(j) * kThreads;
      if (d4 >= dim / 4) continue;
      const float4 s4 = collapse4(x, hc, dim, pre_s, d4);
      v[j] = make_float4(maybe_bf16(s4.x, bf16), maybe_bf16(s4.y, bf16), maybe_bf16(s4.z, bf16),
                         maybe_bf16(s4.w, bf16));
    }
    // (red: the sum-of-squares scratch, free by now)
    norm_store4(v, dim, norm_eps, norm_w, bf16, ut, [&](double q) { return row_sum<kThreads>(q, red); });
    return;
  }
  if (!exact_ss && dim % 4 == 0) {
#pragma unroll 4
    for (int64_t d4 = threadIdx.x; d4 < dim / 4; d4 += kThreads) {
      const float4 s4 = collapse4(x, hc, dim, pre_s, d4);
      float* o = ut + 4 * d4;
      o[0] = maybe_bf16(s4.x, bf16), o[1] = maybe_bf16(s4.y, bf16), o[2] = maybe_bf16(s4.z, bf16),
      o[3] = maybe_bf16(s4.w, bf16);
    }
    return;
  }
  for (int64_t d = threadIdx.x; d < dim; d += kThreads) {
    float s = 0.0f;
    for (int j = 0; j < hc; ++j) s = __fadd_rn(s, __fmul_rn(pre_s[j], x[int64_t(j) * dim + d]));
    ut[d] = maybe_bf16(s, bf16);
  }
}

// ---- kernel B, fast mode, hc = 4 (decode calls): the same operations as hc_finish_kernel's fast path ----------
// One CTA per token of 8 collapse warps (+ 1 coefficient warp for hc_pre). hc_finish_kernel runs its steps one after
// the other behind block-wide barriers (dots -> r -> pre, post and the Sinkhorn in warp 0 -> collapse), ~23 us per
// call on an H100 for one token, almost all of it latency. Here every collapse thread loads its columns of x first,
// then sums the slices' dots of the 4 pre rows and the sum of squares itself (the same values in the same order as
// hc_finish_kernel), so those loads are in flight together; one barrier (after which u[t], which holds the dots, may
// be overwritten); then the collapse warps collapse (and normalize, with their own named barrier) while the
// coefficient warp computes post and the Sinkhorn (comb_lanes_fast4). Bitwise the results of hc_finish_kernel's
// fast path. (The Sinkhorn with the whole 4 x 4 matrix in each lane's registers, no shuffles, was tried: 32 us per
// call instead of 23: one thread then does 16 lanes' divisions in sequence.) NV: float4 columns per thread
// (dim / 4 <= NV * kThreads).
__device__ __forceinline__ void bar_named(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// row_sum<kThreads> of the collapse warps (0..7) with named barrier 1 (the coefficient warp does not take part).
__device__ __forceinline__ double collapse_row_sum(double v, double* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  bar_named(1, kThreads);
  double s = 0;
  for (int w = 0; w < kWarps; ++w) s += smem[w];
  bar_named(1, kThreads);
  return s;
}

template <bool HEAD, int NV>
__global__ void __launch_bounds__(kThreads + 32) hc_finish_fast4_kernel(const float* X, int64_t dim, const float* scale,
                                                                        const float* base, int sinkhorn_iters,
                                                                        float hc_eps, float norm_eps, bool bf16,
                                                                        int mix, int slices, const float* norm_w,
                                                                        float* u, float* post, float* comb) {
  constexpr int HC = 4;
  __shared__ double red[kWarps];
  __shared__ float mix_s[32];
  pdl_wait();
  pdl_launch_dependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x, width = int64_t(HC) * dim, d4n = dim / 4;
  const float* x = X + t * width;
  float* ut = u + t * dim;
  if (!HEAD && warp == kWarps) {  // the coefficient warp: post and comb
    if (lane < mix) mix_s[lane] = slice_dot(ut, mix, slices, lane);
    const float r = mix_rnorm(slice_sum_sq(ut, mix, slices), width, norm_eps);
    bar_named(2, kThreads + 32);  // (the collapse warps' barrier below: every read of the dots in u[t] is done)
    if (lane < HC) post[t * HC + lane] = post_coef(mix_s[HC + lane], r, scale[1], base[HC + lane]);
    comb_lanes_fast4(mix_s, r, scale[2], base, sinkhorn_iters, hc_eps, lane, comb + t * 16);
    return;
  }
  float4 xv[NV][HC];  // this thread's columns d4 = threadIdx.x + j kThreads of the 4 streams
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t d4 = threadIdx.x + int64_t(j) * kThreads;
#pragma unroll
    for (int h = 0; h < HC; ++h)
      xv[j][h] = d4 < d4n ? __ldg(reinterpret_cast<const float4*>(x + int64_t(h) * dim) + d4) : float4{};
  }
  float pre[HC];
  {
    float dv[HC];
#pragma unroll
    for (int h = 0; h < HC; ++h) dv[h] = slice_dot(ut, mix, slices, h);
    const float r = mix_rnorm(slice_sum_sq(ut, mix, slices), width, norm_eps);
#pragma unroll
    for (int h = 0; h < HC; ++h) pre[h] = pre_coef(dv[h], r, scale[0], base[h], hc_eps);
  }
  // every read of the dots in u[t] is done (the coefficient warp's too): u[t] may be written
  if constexpr (HEAD) __syncthreads();
  else bar_named(2, kThreads + 32);
  // the collapse u[d] = sum_j pre_j x[j, d] (CPU order per element), bf16 when bf16
  float4 v[NV];
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    float4 s4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int h = 0; h < HC; ++h) add_weighted4(s4, pre[h], xv[j][h]);
    v[j] = make_float4(maybe_bf16(s4.x, bf16), maybe_bf16(s4.y, bf16), maybe_bf16(s4.z, bf16), maybe_bf16(s4.w, bf16));
  }
  if (norm_w == nullptr) {
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int64_t d4 = threadIdx.x + int64_t(j) * kThreads;
      if (d4 < d4n) reinterpret_cast<float4*>(ut)[d4] = v[j];
    }
    return;
  }
  // the sublayer's rmsnorm, as hc_finish_kernel (the coefficient warp takes no part in the block sum)
  norm_store4(v, dim, norm_eps, norm_w, bf16, ut, [&](double q) {
    if constexpr (HEAD) return row_sum<kThreads>(q, red);
    else return collapse_row_sum(q, red);
  });
}

template <bool HEAD, int NV>
void launch_fast4(int64_t n_tok, const float* X, int64_t dim, const float* scale, const float* base, int iters,
                  float hc_eps, float norm_eps, bool bf16, int mix, int slices, const float* norm_w, float* u,
                  float* post, float* comb, cudaStream_t stream) {
  launch_pdl(hc_finish_fast4_kernel<HEAD, NV>, unsigned(n_tok), kThreads + (HEAD ? 0 : 32), 0, stream, X, dim, scale,
             base, iters, hc_eps, norm_eps, bf16, mix, slices, norm_w, u, post, comb);
}

// Whether hc_collapse's fast path can apply rmsnorm_vec_kernel<256, 8>'s normalization itself (rmsnorm() takes that
// kernel for these widths; norm_w 16-byte aligned like u).
bool fusable_norm(int64_t dim, const float* norm_w) {
  return dim % 4 == 0 && dim > 1024 && dim <= 4 * 8 * int64_t(kThreads) && aligned16(norm_w);
}

// Returns whether norm_w (may be nullptr) was applied to u.
template <bool HEAD>
bool hc_collapse(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                 const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, const float* norm_w,
                 float* u, float* post, float* comb, cudaStream_t stream) {
  if (n_tok <= 0 || hc <= 0 || hc > kMaxHc || dim <= 0) return true;
  const int64_t width = int64_t(hc) * dim;
  const int mix = HEAD ? hc : (2 + hc) * hc;
  const bool have_dots = mix <= dim;  // the dots fit in u[t]
  const bool vec = width % 4 == 0 && aligned16(X) && aligned16(fn);
  // fast mode (not deterministic(), gemm_path.h): decode calls take the fast dot kernel and skip the exact
  // sequential sum-of-squares fallback (results differ from the CPU by fp32 rounding)
  const int slices = dot_slices(width);
  const bool fast =
      !deterministic() && n_tok <= kDecodeMaxTok && int64_t(slices) * (mix + 2) <= dim && vec && aligned16(u);
  if (fast) {  // mix dot rows + the sum-of-squares row, per slice of the width
    launch_pdl(hc_dot_fast_kernel, dim3(unsigned(n_tok), unsigned(mix + 1), unsigned(slices)), kThreads, 0, stream, X,
               width, fn, mix, slices, dim, u);
  } else if (have_dots) {
    if (n_tok <= kDecodeMaxTok)
      launch_dots<1, 1, 1, 1, 2048>(X, n_tok, width, fn, mix, vec, dim, u, stream);  // 1 token x 1 row
    else if (HEAD)
      launch_dots<1, 1, 4, 8, 256>(X, n_tok, width, fn, mix, vec, dim, u, stream);  // 8 tokens x 4 rows
    else if (n_tok < kLargeMinTok)
      launch_dots<1, 1, 8, 4, 256>(X, n_tok, width, fn, mix, vec, dim, u, stream);  // 4 tokens x 8 rows
    else
      launch_dots<2, 3, 8, 4, 128>(X, n_tok, width, fn, mix, vec, dim, u, stream);  // 8 tokens x 24 rows
  }
  const bool fuse = fast && norm_w != nullptr && fusable_norm(dim, norm_w);
  const int64_t d4n = dim / 4;
  if (fast && hc == 4 && dim % 4 == 0 && d4n <= 8 * kThreads) {  // hc_finish_fast4_kernel
    const float* nw = fuse ? norm_w : nullptr;
    auto go = [&](auto launch) {
      launch(n_tok, X, dim, scale, base, sinkhorn_iters, hc_eps, norm_eps, bf16, mix, slices, nw, u, post, comb,
             stream);
    };
    if (d4n <= kThreads)
      go(launch_fast4<HEAD, 1>);
    else if (d4n <= 2 * kThreads)
      go(launch_fast4<HEAD, 2>);
    else if (d4n <= 4 * kThreads)
      go(launch_fast4<HEAD, 4>);
    else
      go(launch_fast4<HEAD, 8>);
    return fuse || norm_w == nullptr;
  }
  hc_finish_kernel<HEAD><<<unsigned(n_tok), kThreads, 0, stream>>>(X, hc, dim, fn, scale, base, sinkhorn_iters,
                                                                   hc_eps, norm_eps, bf16, have_dots, mix, !fast,
                                                                   slices, fuse ? norm_w : nullptr, u, post, comb);
  return fuse || norm_w == nullptr;
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
  pdl_wait();
  pdl_launch_dependents();
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
    launch_pdl(hc_post_kernel<V, 4>, grid, kPostThreads, 0, stream, f, X, post, comb, hc, dim, chunks, bf16, Xout);
  else
    launch_pdl(hc_post_kernel<V, kMaxHc>, grid, kPostThreads, 0, stream, f, X, post, comb, hc, dim, chunks, bf16, Xout);
}

}  // namespace

void hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
            const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u, float* post,
            float* comb, cudaStream_t stream) {
  hc_collapse<false>(X, n_tok, hc, dim, fn, scale, base, sinkhorn_iters, hc_eps, norm_eps, bf16, nullptr, u, post,
                     comb, stream);
}

bool hc_pre_norm(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                 const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, const float* norm_w,
                 float* u, float* post, float* comb, cudaStream_t stream) {
  return hc_collapse<false>(X, n_tok, hc, dim, fn, scale, base, sinkhorn_iters, hc_eps, norm_eps, bf16, norm_w, u,
                            post, comb, stream);
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
  hc_collapse<true>(X, n_tok, hc, dim, fn, scale, base, 1, hc_eps, norm_eps, bf16, nullptr, u, nullptr, nullptr,
                    stream);
}

}  // namespace dsv4::cuda
