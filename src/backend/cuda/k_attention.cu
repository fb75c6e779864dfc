// Sparse attention with a per-head sink (spec §4.8; semantics: Ops::sparse_attention in backend/ops.h; reference:
// CpuOps::sparse_attention in backend/cpu_ops.cpp).
//
// Exactness: every operation of the CPU reference is reproduced in the same order, so the result is bitwise equal to
// the CPU's:
// * the score dot product uses the CPU's 8 fixed partial sums (lane l accumulates elements l, l+8, ... sequentially,
//   products and sums rounded separately, no FMA), combined by the same tree ((0+1)+(2+3))+((4+5)+(6+7));
// * the online softmax runs over the CPU's blocks of 64 entries of the concatenated window + compressed list, with
//   the running max / rescale / sequential sum of the CPU, P rounded to bf16 for the PV product when bf16;
// * the PV accumulation of every (head, dim) element is sequential in list order (__fadd_rn(acc, __fmul_rn(p, v)));
// * exp is expf_glibc (backend/cuda/glibc_math.cuh): glibc's expf algorithm (the one CpuOps calls through std::exp)
//   transcribed in double arithmetic; checked bitwise against glibc libm expf for all 2^32 float inputs (both the FMA
//   and the non-FMA code paths of glibc give the same bits, so the CPU's ifunc choice does not matter).
// Batch invariance: the arithmetic of one (token, head) does not depend on n_tok or on how heads are grouped into
// CTAs (the group size G only changes which threads do the work).
//
// Structure: one CTA (256 threads) per (token, group of G heads). K = V is one row shared by all heads of a token,
// so each block of 64 rows is staged in shared memory once and serves the G heads:
//   1. the 64 row pointers of the block are resolved from the index lists (-1 -> invalid);
//   2. QK: the rows are staged 128 columns at a time ([64][128] tile) and every thread advances the lane chains of
//      its (head, row) micro tile; the chains continue across column chunks, so the CPU's element order is kept;
//   3. softmax: one warp per head computes the block max, the rescale factor, P and the sequential sum;
//   4. PV: the rows are staged again as [64/NCH rows][all columns] tiles (no re-staging when dim <= 128) and every
//      thread accumulates its (head, column) elements in row order.
// Shared memory: G x dim (q) + 64 x 136 (row tile) floats + small, 77 KiB at G = 16, dim = 512.
// The above is the deterministic mode's kernel (and the fast mode's for odd shapes and dense numerics' prefill); in
// the default (fast) mode decode calls (<= 256 tokens) run attn_decode_fast_kernel (below), which keeps the CPU's
// blocks of 64 and its online-softmax steps but sums in its own order (fp32 rounding; CUDA's expf), and prefill
// chunks with bf16 rows attn_prefill_tc_kernel (bf16 tensor cores, as the reference kernel).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/device_pdl.cuh"
#include "backend/cuda/device_rope.cuh"
#include "backend/cuda/fused_kernels.h"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/glibc_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/cuda_backend.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlock = 64;               // entries per online-softmax block (CpuOps::sparse_attention's kBlock)
constexpr int kChunk = 128;              // columns per QK staging chunk
constexpr int kRowStride = kChunk + 8;   // floats per staged row of a QK chunk (bank-conflict padding)
constexpr float kNegInf = -__builtin_huge_valf();

// ---- the kernel ------------------------------------------------------------------------------------------------
struct AttnArgs {
  const float* q;
  int64_t n_heads, dim;
  const float* ring;
  int64_t n_ring;
  const float* fresh;
  const float* comp;
  const int32_t* win_idx;
  int64_t k_win;
  const int32_t* comp_idx;
  int64_t k_comp;
  const float* sink;
  float scale;
  bool bf16;
  bool vec;  // dim % 4 == 0 and every row base 16-byte aligned: float4 global loads
  float* out;
  // fast decode kernel, split mode: split blockIdx.y covers entries [y * kSplit, (y + 1) * kSplit) and leaves its
  // unnormalized acc[dim], running max and sum in part[((t * H + h) * n_split + y) * (dim + 2) ...]
  float* part;
  float* scores;
  float* bmax;
  int64_t n_split;
};

template <int G, int NCH>
struct AttnCfg {
  static constexpr int DPAD = NCH * kChunk;       // staged columns (dim rounded up, zero padded)
  static constexpr int QS = DPAD + 4;             // q row stride (floats); == 4 mod 32: conflict-free head reads
  static constexpr int RPT = kBlock / NCH;        // rows per PV tile
  static constexpr int PS = DPAD + 8;             // PV tile row stride (== kRowStride when NCH == 1)
  // QK micro tile: HT heads x JT rows x LS lane chains per thread; NU threads share one dot product's 8 lanes.
  static constexpr int LS = G >= 4 ? 8 : (G == 2 ? 4 : 2);
  static constexpr int HT = G >= 8 ? 2 : 1;
  static constexpr int JT = G >= 16 ? 2 : 1;
  static constexpr int NU = 8 / LS;
  static constexpr int NHI = G / HT;
  static constexpr int NRI = kBlock / JT;
  static_assert(NU * NHI * NRI == kThreads, "QK mapping must cover the CTA");
  // PV: every thread owns HPT heads x VW consecutive columns.
  static constexpr int TOT = G * DPAD;
  static constexpr int APT = TOT >= kThreads ? TOT / kThreads : 1;
  static constexpr int VW = APT >= 4 ? 4 : APT;
  static constexpr int CG = DPAD / VW;            // column groups
  static_assert(CG <= kThreads && kThreads % CG == 0, "PV mapping");
  static constexpr int HG = kThreads / CG;        // head groups
  static constexpr int HPT = (G + HG - 1) / HG;
  static constexpr int NHW = (G + 7) / 8;         // heads per softmax warp
  static_assert(RPT * PS <= kBlock * kRowStride, "PV tile must fit the row buffer");
  // shared memory: row pointers, q, row tile, scores, P, per-head alpha / den / flags
  static constexpr size_t kSmem =
      kBlock * sizeof(const float*) +
      sizeof(float) * (size_t(G) * QS + size_t(kBlock) * kRowStride + 2 * G * kBlock + 2 * G) + sizeof(int) * G;
};

template <int N>
__device__ __forceinline__ void lds(const float* p, float (&v)[N]) {
  if constexpr (N == 8) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else if constexpr (N == 4) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else if constexpr (N == 2) {
    const float2 a = *reinterpret_cast<const float2*>(p);
    v[0] = a.x, v[1] = a.y;
  } else {
    v[0] = p[0];
  }
}

// Four consecutive row elements from global memory starting at column col (zero beyond dim).
__device__ __forceinline__ float4 load4(const float* p, int col, int64_t dim, bool vec) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (p == nullptr || col >= dim) return v;
  if (vec) return *reinterpret_cast<const float4*>(p + col);
  v.x = p[col];
  if (col + 1 < dim) v.y = p[col + 1];
  if (col + 2 < dim) v.z = p[col + 2];
  if (col + 3 < dim) v.w = p[col + 3];
  return v;
}

template <int G, int NCH>
__global__ void __launch_bounds__(kThreads) sparse_attention_kernel(AttnArgs a) {
  using C = AttnCfg<G, NCH>;
  extern __shared__ float4 smem4[];
  const float** rp = reinterpret_cast<const float**>(smem4);            // [64] row of each block entry or nullptr
  float* qs = reinterpret_cast<float*>(rp + kBlock);                    // [G][QS]
  float* rows = qs + G * C::QS;                                         // [64][kRowStride] or [RPT][PS]
  float* ss = rows + kBlock * kRowStride;                               // [G][64] scores of the block
  float* pvs = ss + G * kBlock;                                         // [G][64] P (bf16 when bf16)
  float* alpha_s = pvs + G * kBlock;                                    // [G]
  float* den_s = alpha_s + G;                                           // [G]
  int* skip_s = reinterpret_cast<int*>(den_s + G);                      // [G] head skips this block / zero output

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t H = a.n_heads, dim = a.dim;
  const int64_t n_hb = (H + G - 1) / G;
  const int64_t t = int64_t(blockIdx.x) / n_hb;
  const int64_t h0 = (int64_t(blockIdx.x) % n_hb) * G;
  const int gv = int(std::min<int64_t>(G, H - h0));  // valid heads in this group

  // q of the G heads, zero padded to DPAD columns and G heads
  for (int i = tid; i < G * C::DPAD; i += kThreads) {
    const int g = i / C::DPAD, col = i % C::DPAD;
    qs[g * C::QS + col] = (g < gv && col < dim) ? a.q[((t * H + h0 + g) * dim) + col] : 0.0f;
  }

  // QK mapping
  const int u = tid % C::NU, hi = (tid / C::NU) % C::NHI, ri = tid / (C::NU * C::NHI);
  // PV mapping
  const int cg = tid % C::CG, hg = tid / C::CG;
  float acc[C::HPT][C::VW];
#pragma unroll
  for (int x = 0; x < C::HPT; ++x)
#pragma unroll
    for (int v = 0; v < C::VW; ++v) acc[x][v] = 0.0f;
  // softmax state of the heads this warp owns (heads warp + 8 i)
  float m_r[C::NHW], sum_r[C::NHW];
#pragma unroll
  for (int i = 0; i < C::NHW; ++i) m_r[i] = kNegInf, sum_r[i] = 0.0f;

  const int64_t k = a.k_win + a.k_comp;
  const int64_t n_blk = (k + kBlock - 1) / kBlock;
  for (int64_t b = 0; b < n_blk; ++b) {
    __syncthreads();  // the previous block is done with rp / rows / pvs (and q is staged)
    const float* p = nullptr;
    if (tid < kBlock) {
      const int64_t j = b * kBlock + tid;
      if (j < k) {
        if (j < a.k_win) {
          const int64_t i = a.win_idx[t * a.k_win + j];
          if (i >= 0) p = i < a.n_ring ? a.ring + i * dim : a.fresh + (i - a.n_ring) * dim;
        } else {
          const int64_t i = a.comp_idx[t * a.k_comp + (j - a.k_win)];
          if (i >= 0) p = a.comp + i * dim;
        }
      }
      rp[tid] = p;
    }
    if (!__syncthreads_or(p != nullptr)) continue;  // no valid entry in this block: the CPU skips it

    // ---- QK: lane chains over column chunks ----
    float ch[C::HT][C::JT][C::LS];
#pragma unroll
    for (int x = 0; x < C::HT; ++x)
#pragma unroll
      for (int y = 0; y < C::JT; ++y)
#pragma unroll
        for (int l = 0; l < C::LS; ++l) ch[x][y][l] = 0.0f;
    for (int c = 0; c < NCH; ++c) {
      if (c > 0) __syncthreads();  // previous chunk consumed
      for (int i = tid; i < kBlock * (kChunk / 4); i += kThreads) {
        const int jr = i / (kChunk / 4), c4 = i % (kChunk / 4);
        *reinterpret_cast<float4*>(rows + jr * kRowStride + c4 * 4) = load4(rp[jr], c * kChunk + c4 * 4, dim, a.vec);
      }
      __syncthreads();
      const float* qb = qs + c * kChunk;
#pragma unroll 4
      for (int st = 0; st < kChunk / 8; ++st) {
        const int col = st * 8 + u * C::LS;
        float qv[C::HT][C::LS], rv[C::JT][C::LS];
#pragma unroll
        for (int x = 0; x < C::HT; ++x) lds(qb + (hi + C::NHI * x) * C::QS + col, qv[x]);
#pragma unroll
        for (int y = 0; y < C::JT; ++y) lds(rows + (ri + C::NRI * y) * kRowStride + col, rv[y]);
#pragma unroll
        for (int x = 0; x < C::HT; ++x)
#pragma unroll
          for (int y = 0; y < C::JT; ++y)
#pragma unroll
            for (int l = 0; l < C::LS; ++l) ch[x][y][l] = __fadd_rn(ch[x][y][l], __fmul_rn(qv[x][l], rv[y][l]));
      }
    }
    // combine the 8 lanes: ((0+1)+(2+3))+((4+5)+(6+7)), in-thread first, then across the NU threads of a dot
#pragma unroll
    for (int x = 0; x < C::HT; ++x)
#pragma unroll
      for (int y = 0; y < C::JT; ++y) {
        float v;
        if constexpr (C::LS == 8)
          v = __fadd_rn(__fadd_rn(__fadd_rn(ch[x][y][0], ch[x][y][1]), __fadd_rn(ch[x][y][2], ch[x][y][3])),
                        __fadd_rn(__fadd_rn(ch[x][y][4], ch[x][y][5]), __fadd_rn(ch[x][y][6], ch[x][y][7])));
        else if constexpr (C::LS == 4)
          v = __fadd_rn(__fadd_rn(ch[x][y][0], ch[x][y][1]), __fadd_rn(ch[x][y][2], ch[x][y][3]));
        else
          v = __fadd_rn(ch[x][y][0], ch[x][y][1]);
#pragma unroll
        for (int off = 1; off < C::NU; off <<= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
        if (u == 0) ss[(hi + C::NHI * x) * kBlock + ri + C::NRI * y] = __fmul_rn(v, a.scale);
      }
    __syncthreads();

    // ---- softmax: one warp per head ----
#pragma unroll
    for (int i = 0; i < C::NHW; ++i) {
      const int h = warp + 8 * i;
      if (h >= G) break;  // warp-uniform
      const bool v0 = rp[lane] != nullptr, v1 = rp[lane + 32] != nullptr;
      const float s0 = ss[h * kBlock + lane], s1 = ss[h * kBlock + lane + 32];
      float bm = kNegInf;
      if (v0) bm = fmaxf(bm, s0);
      if (v1) bm = fmaxf(bm, s1);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, off));
      if (bm == kNegInf) {  // every valid score is -inf (or NaN): the CPU skips the block for this head
        if (lane == 0) skip_s[h] = 1;
        continue;
      }
      const float m = m_r[i];
      const float m_new = m < bm ? bm : m;  // std::max(m, bm)
      const float alpha = m == kNegInf ? 0.0f : expf_glibc(__fsub_rn(m, m_new));
      const float p0 = v0 ? expf_glibc(__fsub_rn(s0, m_new)) : 0.0f;
      const float p1 = v1 ? expf_glibc(__fsub_rn(s1, m_new)) : 0.0f;
      // sequential sum in list order; invalid entries have p == +0 and sum is never -0, so adding them is exact
      // (the CPU skips them)
      float sum = __fmul_rn(sum_r[i], alpha);
#pragma unroll
      for (int j = 0; j < 32; ++j) sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, p0, j));
#pragma unroll
      for (int j = 0; j < 32; ++j) sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, p1, j));
      sum_r[i] = sum;
      m_r[i] = m_new;
      pvs[h * kBlock + lane] = maybe_bf16(p0, a.bf16);
      pvs[h * kBlock + lane + 32] = maybe_bf16(p1, a.bf16);
      if (lane == 0) {
        alpha_s[h] = alpha;
        skip_s[h] = 0;
      }
    }
    __syncthreads();

    // ---- PV ----
    bool hon[C::HPT];
#pragma unroll
    for (int x = 0; x < C::HPT; ++x) {
      const int h = hg + C::HG * x;
      hon[x] = h < G && skip_s[h] == 0;
      if (hon[x]) {
        const float al = alpha_s[h];
#pragma unroll
        for (int v = 0; v < C::VW; ++v) acc[x][v] = __fmul_rn(acc[x][v], al);
      }
    }
    for (int r = 0; r < NCH; ++r) {
      if constexpr (NCH > 1) {
        if (r > 0) __syncthreads();  // previous tile consumed
        constexpr int C4 = C::DPAD / 4;
        for (int i = tid; i < C::RPT * C4; i += kThreads) {
          const int jr = i / C4, c4 = i % C4;
          *reinterpret_cast<float4*>(rows + jr * C::PS + c4 * 4) = load4(rp[r * C::RPT + jr], c4 * 4, dim, a.vec);
        }
        __syncthreads();
      }
      for (int jl = 0; jl < C::RPT; ++jl) {
        const int j = r * C::RPT + jl;
        if (rp[j] == nullptr) continue;  // CTA-uniform
        float rv[C::VW];
        lds(rows + jl * C::PS + cg * C::VW, rv);
#pragma unroll
        for (int x = 0; x < C::HPT; ++x) {
          if (!hon[x]) continue;
          const float pj = pvs[(hg + C::HG * x) * kBlock + j];
#pragma unroll
          for (int v = 0; v < C::VW; ++v) acc[x][v] = __fadd_rn(acc[x][v], __fmul_rn(pj, rv[v]));
        }
      }
    }
  }

  // ---- output: acc / (sum + exp(sink - m)), zero for a head without any valid entry ----
  __syncthreads();  // every thread has read skip_s of the last block
#pragma unroll
  for (int i = 0; i < C::NHW; ++i) {
    const int h = warp + 8 * i;
    if (h < G && lane == 0) {
      const bool empty = m_r[i] == kNegInf;
      skip_s[h] = empty ? 1 : 0;
      den_s[h] = (empty || h >= gv) ? 1.0f : __fadd_rn(sum_r[i], expf_glibc(__fsub_rn(a.sink[h0 + h], m_r[i])));
    }
  }
  __syncthreads();
#pragma unroll
  for (int x = 0; x < C::HPT; ++x) {
    const int h = hg + C::HG * x;
    if (h >= gv) continue;
    const bool empty = skip_s[h] != 0;
    const float den = den_s[h];
    float* o = a.out + (t * H + h0 + h) * dim;
#pragma unroll
    for (int v = 0; v < C::VW; ++v) {
      const int col = cg * C::VW + v;
      if (col < dim) o[col] = empty ? 0.0f : maybe_bf16(__fdiv_rn(acc[x][v], den), a.bf16);
    }
  }
}

// ---- fast decode kernel (the default for n_tok <= kFastMaxTok; not the CPU's order) ------------------------------
// One CTA (256 threads) per (token, group of kFG = 4 heads); the same blocks of 64 entries and online softmax as the
// CPU, computed in parallel: QK -- warp w takes entries w, w + 8, ... of the block, every lane holds 4 float4 of q per
// head (dim % 128 == 0, dim <= 512) and of the row, fma chains + xor butterfly; softmax -- warp h (< 4) takes head
// h (block max, exp, the sum by a butterfly); PV -- thread i owns columns 2i, 2i + 1 of each head, rows in list order
// (fma). exp is CUDA's expf. Deterministic and batch invariant; fp32 rounding differs from the CPU's.
constexpr int kFG = 4;
constexpr int64_t kFastMaxTok = 256;
constexpr int64_t kSplit = kBlock;  // entries per split of the split mode (one online-softmax block)

// MODE: kWhole (every entry, the output), kScores (split y: its block's scores and score max into the scratch),
// kPartial (split y: from those scores, its block's P V with the running max the sequential pass has there).
constexpr int kWhole = 0, kScores = 1, kPartial = 2;
template <int NQ, int MODE>
__global__ void __launch_bounds__(kThreads) attn_decode_fast_kernel(AttnArgs a) {
  __shared__ const float* rp[kBlock];
  __shared__ float sc[kFG][kBlock];
  __shared__ float alpha_s[kFG], den_s[kFG];
  __shared__ int empty_s[kFG];
  pdl_wait();
  pdl_launch_dependents();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t H = a.n_heads, dim = a.dim;
  const int64_t n_hb = (H + kFG - 1) / kFG;
  const int64_t t = int64_t(blockIdx.x) / n_hb;
  const int64_t h0 = (int64_t(blockIdx.x) % n_hb) * kFG;
  const int gv = int(std::min<int64_t>(kFG, H - h0));

  float4 qv[kFG][NQ];
#pragma unroll
  for (int h = 0; h < kFG; ++h)
#pragma unroll
    for (int i = 0; i < NQ; ++i)
      qv[h][i] = h < gv ? *reinterpret_cast<const float4*>(a.q + (t * H + h0 + h) * dim + 4 * (lane + 32 * i))
                        : make_float4(0.f, 0.f, 0.f, 0.f);
  const int c0 = 2 * tid;  // PV columns c0, c0 + 1 (c0 < dim: dim <= 512)
  const bool pv_on = c0 < dim;
  float acc[kFG][2];
#pragma unroll
  for (int h = 0; h < kFG; ++h) acc[h][0] = acc[h][1] = 0.0f;
  float m_h = kNegInf, sum_h = 0.0f;  // softmax state of head `warp` (warps 0..3)

  const int64_t k = a.k_win + a.k_comp;
  const int64_t e0 = MODE != kWhole ? int64_t(blockIdx.y) * kSplit : 0;
  const int64_t e1 = MODE != kWhole ? std::min(k, e0 + kSplit) : k;
  // split scratch: scores [n_tok, H, k], block score maxima [n_tok, H, n_split], partial states (AttnArgs::part)
  float* sc_g = a.scores + (t * H + h0) * k;
  float* bm_g = a.bmax + (t * H + h0) * a.n_split;
  for (int64_t b0 = e0; b0 < e1; b0 += kBlock) {
    __syncthreads();  // the previous block is done with rp / sc
    const float* p = nullptr;
    if (tid < kBlock) {
      const int64_t j = b0 + tid;
      if (j < e1) {
        if (j < a.k_win) {
          const int64_t i = a.win_idx[t * a.k_win + j];
          if (i >= 0) p = i < a.n_ring ? a.ring + i * dim : a.fresh + (i - a.n_ring) * dim;
        } else {
          const int64_t i = a.comp_idx[t * a.k_comp + (j - a.k_win)];
          if (i >= 0) p = a.comp + i * dim;
        }
      }
      rp[tid] = p;
    }
    if (!__syncthreads_or(p != nullptr)) {  // no valid entry in this block (as the CPU)
      if (MODE == kScores && warp < kFG && lane == 0 && warp < gv) bm_g[warp * a.n_split + blockIdx.y] = kNegInf;
      continue;
    }
    if constexpr (MODE == kPartial) {  // the scores of kScores
      for (int i = tid; i < kFG * kBlock; i += kThreads) {
        const int h = i / kBlock, j = i % kBlock;
        sc[h][j] = (h < gv && b0 + j < e1) ? sc_g[h * k + b0 + j] : kNegInf;
      }
    }
    // QK
    for (int j = warp; MODE != kPartial && j < kBlock; j += kThreads / 32) {
      const float* r = rp[j];
      if (r == nullptr) {  // warp-uniform
        if (lane < kFG) sc[lane][j] = kNegInf;
        continue;
      }
      float4 rv[NQ];
#pragma unroll
      for (int i = 0; i < NQ; ++i) rv[i] = __ldg(reinterpret_cast<const float4*>(r + 4 * (lane + 32 * i)));
#pragma unroll
      for (int h = 0; h < kFG; ++h) {
        float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
        for (int i = 0; i < NQ; ++i) {
          d0 = __fmaf_rn(qv[h][i].x, rv[i].x, d0);
          d1 = __fmaf_rn(qv[h][i].y, rv[i].y, d1);
          d0 = __fmaf_rn(qv[h][i].z, rv[i].z, d0);
          d1 = __fmaf_rn(qv[h][i].w, rv[i].w, d1);
        }
        float d = __fadd_rn(d0, d1);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) d = __fadd_rn(d, __shfl_xor_sync(0xffffffffu, d, o));
        if (lane == 0) sc[h][j] = __fmul_rn(d, a.scale);
      }
    }
    __syncthreads();
    // softmax: warp h updates head h
    if (warp < kFG) {
      const int h = warp;
      const bool v0 = rp[lane] != nullptr, v1 = rp[lane + 32] != nullptr;
      const float s0 = sc[h][lane], s1 = sc[h][lane + 32];
      float bm = kNegInf;
      if (v0) bm = fmaxf(bm, s0);
      if (v1) bm = fmaxf(bm, s1);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, o));
      if constexpr (MODE == kScores) {  // scores and block max out; nothing else
        if (h < gv) {
          for (int j = lane; j < kBlock; j += 32)
            if (b0 + j < e1) sc_g[h * k + b0 + j] = rp[j] != nullptr ? sc[h][j] : kNegInf;
          if (lane == 0) bm_g[h * a.n_split + blockIdx.y] = bm;
        }
        continue;
      }
      if constexpr (MODE == kPartial) {  // the running max of the sequential pass after this block
        float run = kNegInf;
        if (h < gv)
          for (int64_t c = lane; c <= int64_t(blockIdx.y); c += 32) run = fmaxf(run, bm_g[h * a.n_split + c]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) run = fmaxf(run, __shfl_xor_sync(0xffffffffu, run, o));
        m_h = run;  // (acc and sum start at 0: alpha is irrelevant; the block's P use m_new = run below)
      }
      if (bm == kNegInf) {  // every valid score -inf (or NaN): the block is skipped for this head
        sc[h][lane] = 0.0f;
        sc[h][lane + 32] = 0.0f;
        if (lane == 0) alpha_s[h] = 1.0f;
      } else {
        const float m_new = fmaxf(m_h, bm);
        const float alpha = m_h == kNegInf ? 0.0f : expf(__fsub_rn(m_h, m_new));
        const float p0 = v0 ? expf(__fsub_rn(s0, m_new)) : 0.0f;
        const float p1 = v1 ? expf(__fsub_rn(s1, m_new)) : 0.0f;
        float s = __fadd_rn(p0, p1);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
        sum_h = __fmaf_rn(sum_h, alpha, s);
        m_h = m_new;
        sc[h][lane] = maybe_bf16(p0, a.bf16);
        sc[h][lane + 32] = maybe_bf16(p1, a.bf16);
        if (lane == 0) alpha_s[h] = alpha;
      }
    }
    if constexpr (MODE == kScores) continue;
    __syncthreads();
    // PV
    if (pv_on) {
#pragma unroll
      for (int h = 0; h < kFG; ++h) {
        const float al = alpha_s[h];
        acc[h][0] = __fmul_rn(acc[h][0], al);
        acc[h][1] = __fmul_rn(acc[h][1], al);
      }
#pragma unroll 8
      for (int j = 0; j < kBlock; ++j) {
        const float* r = rp[j];
        if (r == nullptr) continue;
        const float2 v = __ldg(reinterpret_cast<const float2*>(r + c0));
#pragma unroll
        for (int h = 0; h < kFG; ++h) {
          const float pj = sc[h][j];
          acc[h][0] = __fmaf_rn(pj, v.x, acc[h][0]);
          acc[h][1] = __fmaf_rn(pj, v.y, acc[h][1]);
        }
      }
    }
  }
  if constexpr (MODE == kScores) return;
  if constexpr (MODE == kPartial) {  // split mode: the partial state; attn_combine_kernel finishes
    const int64_t W = dim + 2;
    __shared__ float ms_s[kFG], ls_s[kFG];
    if (warp < kFG && lane == 0) ms_s[warp] = m_h, ls_s[warp] = sum_h;
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kFG; ++h) {
      if (h >= gv) continue;
      float* pp = a.part + ((t * H + h0 + h) * a.n_split + blockIdx.y) * W;
      if (pv_on) pp[c0] = acc[h][0], pp[c0 + 1] = acc[h][1];
      if (tid == 0) pp[dim] = ms_s[h], pp[dim + 1] = ls_s[h];
    }
    return;
  }
  // output: acc / (sum + exp(sink - m)); zero for a head without any valid entry
  if (warp < kFG && lane == 0) {
    const int h = warp;
    empty_s[h] = m_h == kNegInf ? 1 : 0;
    den_s[h] = (m_h == kNegInf || h >= gv) ? 1.0f : __fadd_rn(sum_h, expf(__fsub_rn(a.sink[h0 + h], m_h)));
  }
  __syncthreads();
  if (pv_on) {
#pragma unroll
    for (int h = 0; h < kFG; ++h) {
      if (h >= gv) continue;
      float* o = a.out + (t * H + h0 + h) * dim + c0;
      const bool empty = empty_s[h] != 0;
      o[0] = empty ? 0.0f : maybe_bf16(__fdiv_rn(acc[h][0], den_s[h]), a.bf16);
      o[1] = empty ? 0.0f : maybe_bf16(__fdiv_rn(acc[h][1], den_s[h]), a.bf16);
    }
  }
}

// Split mode's finish: one CTA per (token, head). M = max of the splits' maxima; out = sum_s acc_s e^(m_s - M) /
// (sum_s l_s e^(m_s - M) + e^(sink - M)) in split order (zero when no split saw a valid entry). rd > 0: then the
// inverse rope of the head's last rd dims (rope_kernel's arithmetic; cos_sin [n_tok, rd/2, 2]). A thread finishes
// the column pairs (2i, 2i + 1) (dim even), each column in its own split order as alone.
constexpr int64_t kMaxSplit = 1024;
__global__ void __launch_bounds__(kThreads) attn_combine_kernel(const float* part, int64_t n_split, int64_t H,
                                                               int64_t dim, const float* sink, bool bf16, float* out,
                                                               int64_t rd, const float* cos_sin) {
  __shared__ float wsp[kMaxSplit];
  __shared__ float M_s, den_s;
  pdl_wait();
  pdl_launch_dependents();
  const int64_t th = blockIdx.x, h = th % H;
  const int64_t W = dim + 2;
  const float* pp = part + th * n_split * W;
  if (threadIdx.x < 32) {
    float M = kNegInf;
    for (int64_t s = threadIdx.x; s < n_split; s += 32) M = fmaxf(M, pp[s * W + dim]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float L = 0.0f;
    for (int64_t s = threadIdx.x; s < n_split; s += 32) {
      const float m = pp[s * W + dim];
      const float w = (m == kNegInf || M == kNegInf) ? 0.0f : expf(__fsub_rn(m, M));
      wsp[s] = w;
      L = __fmaf_rn(pp[s * W + dim + 1], w, L);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) L = __fadd_rn(L, __shfl_xor_sync(0xffffffffu, L, o));
    if (threadIdx.x == 0) {
      M_s = M;
      den_s = M == kNegInf ? 1.0f : __fadd_rn(L, expf(__fsub_rn(sink[h], M)));
    }
  }
  __syncthreads();
  const bool empty = M_s == kNegInf;
  const int64_t off = dim - rd;  // first rotated column (even)
  for (int64_t c = 2 * int64_t(threadIdx.x); c < dim; c += 2 * kThreads) {
    float v[2] = {0.0f, 0.0f};
    for (int64_t s = 0; s < n_split; ++s) v[0] = __fmaf_rn(pp[s * W + c], wsp[s], v[0]);
    for (int64_t s = 0; s < n_split; ++s) v[1] = __fmaf_rn(pp[s * W + c + 1], wsp[s], v[1]);
    v[0] = empty ? 0.0f : maybe_bf16(__fdiv_rn(v[0], den_s), bf16);
    v[1] = empty ? 0.0f : maybe_bf16(__fdiv_rn(v[1], den_s), bf16);
    if (rd > 0 && c >= off) {
      const float* cs = cos_sin + (th / H) * rd + (c - off);
      rope_pair(v, cs[0], -cs[1], bf16);
    }
    out[th * dim + c] = v[0];
    out[th * dim + c + 1] = v[1];
  }
}

// ---- tensor-core prefill kernel (fast mode, reference numerics, dim 512, heads in groups of 64) -----------------
// The default for more than kFastMaxTok tokens (a prefill chunk) in the fast mode with bf16 rows: the reference
// kernel's own arithmetic (spec §4.8: bf16 MMA with fp32 accumulation for Q K^T and P V, the online softmax over
// blocks of 64 entries, P rounded to bf16 for the numerator, the fp32 denominator). In reference numerics q and the
// rows hold bf16 values, so staging them as bf16 is exact and every product is exact; sums run in the tensor cores'
// order (the fast mode's tolerance). One CTA (8 warps) per (token, group of 64 heads); per block of 64 entries:
//   1. the block's 64 rows are staged in shared memory as bf16 [64][512] (zeros for -1 entries);
//   2. S = Q K^T by mma.sync m16n8k16: warp w takes heads 16 (w % 4) .. + 16 and the dims 256 (w / 4) .. + 256 of the
//      dot products; the two halves are added in shared memory (fixed order: the result is deterministic);
//   3. the online softmax of the CPU's blocks, one warp per 8 heads (block max, alpha, P, the sum by a butterfly);
//   4. O += P V by mma.sync: warp w owns heads 16 (w % 4) .. + 16 and output dims 256 (w / 4) .. + 256 (128 fp32
//      accumulators per thread), rescaled by alpha first.
// A token's arithmetic does not depend on n_tok or on the other tokens (batch invariant among calls of this kernel).
constexpr int kTcHeads = 64, kTcDim = 512;
constexpr int kTcQS = kTcDim + 8;  // bf16 row stride of the Q and row tiles (1040 B: ldmatrix rows on distinct banks)
constexpr int kTcPS = kBlock + 8;  // bf16 row stride of P (144 B)
constexpr int kTcSS = kBlock + 4;  // fp32 row stride of the score halves
constexpr size_t kTcSmem = kBlock * sizeof(const float*) + sizeof(__nv_bfloat16) * (size_t(kTcHeads) * kTcQS +
                           size_t(kBlock) * kTcQS + size_t(kTcHeads) * kTcPS) + sizeof(float) * (2 * kTcHeads * kTcSS + kTcHeads);

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// d += a b: m16n8k16, bf16 inputs, fp32 accumulators
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// four floats to bf16 (round to nearest even) at p (8-byte aligned)
__device__ __forceinline__ void store4_bf16(__nv_bfloat16* p, float4 v) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 w;
  w.x = *reinterpret_cast<uint32_t*>(&lo);
  w.y = *reinterpret_cast<uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(p) = w;
}

__global__ void __launch_bounds__(kThreads, 1) attn_prefill_tc_kernel(AttnArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ float4 smem4[];
  const float** rp = reinterpret_cast<const float**>(smem4);                 // [64] row of each block entry
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(rp + kBlock);        // [64 heads][kTcQS]
  __nv_bfloat16* ks = qs + kTcHeads * kTcQS;                                 // [64 rows][kTcQS]
  __nv_bfloat16* ps = ks + kBlock * kTcQS;                                   // [64 heads][kTcPS] P as bf16
  float* sh = reinterpret_cast<float*>(ps + kTcHeads * kTcPS);               // [2][64 heads][kTcSS] score halves
  float* alpha_s = sh + 2 * kTcHeads * kTcSS;                                // [64] alpha, then the denominators

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t H = a.n_heads, n_hb = H / kTcHeads;
  const int64_t t = int64_t(blockIdx.x) / n_hb, h0 = (int64_t(blockIdx.x) % n_hb) * kTcHeads;
  for (int i = tid; i < kTcHeads * kTcDim / 4; i += kThreads) {  // q of the 64 heads as bf16
    const int h = i / (kTcDim / 4), c4 = i % (kTcDim / 4);
    store4_bf16(qs + h * kTcQS + 4 * c4, *reinterpret_cast<const float4*>(a.q + (t * H + h0 + h) * kTcDim + 4 * c4));
  }
  const int hq = warp & 3, half = warp >> 2;  // this warp's 16 heads and 256 dims
  const int gr = lane >> 2, gc = 2 * (lane & 3);  // accumulator rows gr, gr + 8 and columns gc, gc + 1 of a tile
  float o[32][4];
#pragma unroll
  for (int j = 0; j < 32; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_r[8], l_r[8];  // softmax state of heads 8 warp + i (the same in every lane)
#pragma unroll
  for (int i = 0; i < 8; ++i) m_r[i] = kNegInf, l_r[i] = 0.0f;

  const int64_t k = a.k_win + a.k_comp;
  const int64_t n_blk = (k + kBlock - 1) / kBlock;
  for (int64_t b = 0; b < n_blk; ++b) {
    __syncthreads();  // the previous block is done with rp / ks / ps / sh (and q is staged)
    const float* p = nullptr;
    if (tid < kBlock) {
      const int64_t j = b * kBlock + tid;
      if (j < k) {
        if (j < a.k_win) {
          const int64_t i = a.win_idx[t * a.k_win + j];
          if (i >= 0) p = i < a.n_ring ? a.ring + i * kTcDim : a.fresh + (i - a.n_ring) * kTcDim;
        } else {
          const int64_t i = a.comp_idx[t * a.k_comp + (j - a.k_win)];
          if (i >= 0) p = a.comp + i * kTcDim;
        }
      }
      rp[tid] = p;
    }
    if (!__syncthreads_or(p != nullptr)) continue;  // no valid entry in this block (as the CPU)
    // 1. the rows as bf16
#pragma unroll 8
    for (int i = tid; i < kBlock * kTcDim / 4; i += kThreads) {
      const int r = i / (kTcDim / 4), c4 = i % (kTcDim / 4);
      const float* src = rp[r];
      const float4 v = src != nullptr ? __ldg(reinterpret_cast<const float4*>(src) + c4) : make_float4(0.f, 0.f, 0.f, 0.f);
      store4_bf16(ks + r * kTcQS + 4 * c4, v);
    }
    __syncthreads();
    // 2. this warp's half of S for its 16 heads x 64 entries
    {
      float s[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
      const __nv_bfloat16* qa = qs + (16 * hq + (lane & 15)) * kTcQS + 256 * half + (lane >> 4) * 8;
      const __nv_bfloat16* kb = ks + ((lane & 7) + ((lane >> 4) << 3)) * kTcQS + 256 * half + ((lane >> 3) & 1) * 8;
#pragma unroll 4
      for (int kk = 0; kk < 16; ++kk) {
        uint32_t af[4];
        ldsm_x4(af, smem_u32(qa + kk * 16));
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t bf[4];
          ldsm_x4(bf, smem_u32(kb + np * 16 * kTcQS + kk * 16));
          mma_bf16(s[2 * np], af, bf[0], bf[1]);
          mma_bf16(s[2 * np + 1], af, bf[2], bf[3]);
        }
      }
      float* shw = sh + (half * kTcHeads + 16 * hq) * kTcSS;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        *reinterpret_cast<float2*>(shw + gr * kTcSS + nt * 8 + gc) = make_float2(s[nt][0], s[nt][1]);
        *reinterpret_cast<float2*>(shw + (gr + 8) * kTcSS + nt * 8 + gc) = make_float2(s[nt][2], s[nt][3]);
      }
    }
    __syncthreads();
    // 3. softmax: warp w updates heads 8 w .. 8 w + 7
    {
      const bool v0 = rp[lane] != nullptr, v1 = rp[lane + 32] != nullptr;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int h = 8 * warp + i;
        const float* s_lo = sh + h * kTcSS;
        const float* s_hi = sh + (kTcHeads + h) * kTcSS;
        const float s0 = __fmul_rn(__fadd_rn(s_lo[lane], s_hi[lane]), a.scale);
        const float s1 = __fmul_rn(__fadd_rn(s_lo[lane + 32], s_hi[lane + 32]), a.scale);
        float bm = kNegInf;
        if (v0) bm = fmaxf(bm, s0);
        if (v1) bm = fmaxf(bm, s1);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, off));
        float alpha = 1.0f, p0 = 0.0f, p1 = 0.0f;
        if (bm != kNegInf) {  // else every valid score is -inf (or NaN): the block is skipped for this head
          const float m_new = fmaxf(m_r[i], bm);
          alpha = m_r[i] == kNegInf ? 0.0f : expf(__fsub_rn(m_r[i], m_new));
          p0 = v0 ? expf(__fsub_rn(s0, m_new)) : 0.0f;
          p1 = v1 ? expf(__fsub_rn(s1, m_new)) : 0.0f;
          float sum = __fadd_rn(p0, p1);
#pragma unroll
          for (int off = 16; off > 0; off >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, off));
          l_r[i] = __fmaf_rn(l_r[i], alpha, sum);
          m_r[i] = m_new;
        }
        ps[h * kTcPS + lane] = __float2bfloat16_rn(p0);  // the reference's bf16 P (acc_s_cast)
        ps[h * kTcPS + lane + 32] = __float2bfloat16_rn(p1);
        if (lane == 0) alpha_s[h] = alpha;
      }
    }
    __syncthreads();
    // 4. O = alpha O + P V for this warp's 16 heads x 256 dims
    {
      const float al0 = alpha_s[16 * hq + gr], al1 = alpha_s[16 * hq + gr + 8];
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[j][0] = __fmul_rn(o[j][0], al0);
        o[j][1] = __fmul_rn(o[j][1], al0);
        o[j][2] = __fmul_rn(o[j][2], al1);
        o[j][3] = __fmul_rn(o[j][3], al1);
      }
      const __nv_bfloat16* pa = ps + (16 * hq + (lane & 15)) * kTcPS + (lane >> 4) * 8;
      const int mi = lane >> 3;
      const __nv_bfloat16* vb = ks + ((lane & 7) + (mi & 1) * 8) * kTcQS + 256 * half + (mi >> 1) * 8;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t af[4];
        ldsm_x4(af, smem_u32(pa + kk * 16));
#pragma unroll
        for (int np = 0; np < 16; ++np) {
          uint32_t bf[4];
          ldsm_x4_t(bf, smem_u32(vb + kk * 16 * kTcQS + np * 16));
          mma_bf16(o[2 * np], af, bf[0], bf[1]);
          mma_bf16(o[2 * np + 1], af, bf[2], bf[3]);
        }
      }
    }
  }
  // output: O / (sum + exp(sink - m)) as bf16; zero for a head without any valid entry
  __syncthreads();  // every warp has read alpha_s
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int h = 8 * warp + i;
      alpha_s[h] = m_r[i] == kNegInf ? 0.0f : __fadd_rn(l_r[i], expf(__fsub_rn(a.sink[h0 + h], m_r[i])));
    }
  }
  __syncthreads();
  const float d0 = alpha_s[16 * hq + gr], d1 = alpha_s[16 * hq + gr + 8];
  float* out0 = a.out + (t * H + h0 + 16 * hq + gr) * kTcDim + 256 * half + gc;
  float* out1 = out0 + 8 * kTcDim;
#pragma unroll
  for (int nt = 0; nt < 32; ++nt) {
    const float2 v0 = d0 == 0.0f ? make_float2(0.f, 0.f)
                                 : make_float2(round_bf16(__fdiv_rn(o[nt][0], d0)), round_bf16(__fdiv_rn(o[nt][1], d0)));
    const float2 v1 = d1 == 0.0f ? make_float2(0.f, 0.f)
                                 : make_float2(round_bf16(__fdiv_rn(o[nt][2], d1)), round_bf16(__fdiv_rn(o[nt][3], d1)));
    *reinterpret_cast<float2*>(out0 + nt * 8) = v0;
    *reinterpret_cast<float2*>(out1 + nt * 8) = v1;
  }
#endif
}

}  // namespace

// (kernels.h)
int sm_count() {
  static std::atomic<int> cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  int n = cached[dev].load(std::memory_order_relaxed);
  if (n <= 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
    cached[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

namespace {

template <int G, int NCH>
void launch(const AttnArgs& a, int64_t n_tok, cudaStream_t stream) {
  using C = AttnCfg<G, NCH>;
  const int64_t n_hb = (a.n_heads + G - 1) / G;
  const int64_t grid = n_tok * n_hb;
  if (grid > 0x7fffffff)
    check(cudaErrorInvalidConfiguration, "sparse_attention: too many tokens x head groups for one grid");
  const size_t smem = C::kSmem;
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(sparse_attention_kernel<G, NCH>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  sparse_attention_kernel<G, NCH><<<unsigned(grid), kThreads, smem, stream>>>(a);
}

template <int G>
void launch_g(const AttnArgs& a, int64_t n_tok, cudaStream_t stream) {
  if (a.dim <= 128) launch<G, 1>(a, n_tok, stream);
  else if (a.dim <= 256) launch<G, 2>(a, n_tok, stream);
  else launch<G, 4>(a, n_tok, stream);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

std::atomic<int64_t> g_tc_calls{0};

// Whether attn_prefill_tc_kernel runs on the current device: built for sm_80 or newer (mma.sync bf16) and its
// shared memory (~174 KiB) granted; cached per device.
bool prefill_tc_ok() {
  static std::atomic<int> cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  int c = cached[dev].load(std::memory_order_relaxed);
  if (c == 0) {
    cudaFuncAttributes fa{};
    const bool ok = cudaFuncGetAttributes(&fa, attn_prefill_tc_kernel) == cudaSuccess && fa.binaryVersion >= 80 &&
                    cudaFuncSetAttribute(attn_prefill_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(kTcSmem)) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();
    c = ok ? 1 : 2;
    cached[dev].store(c, std::memory_order_relaxed);
  }
  return c == 1;
}

}  // namespace

int64_t sparse_attention_tc_calls() { return g_tc_calls.load(std::memory_order_relaxed); }

size_t attention_split_bytes(int64_t n_tok, int64_t n_heads, int64_t dim, int64_t k) {
  const int64_t n_split = (std::max<int64_t>(k, 0) + kSplit - 1) / kSplit;
  if (n_tok <= 0 || n_heads <= 0 || dim <= 0 || n_split <= 1) return 0;
  return size_t(n_tok * n_heads * (n_split * (dim + 2) + k + n_split)) * sizeof(float);
}

void sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv, const int32_t* win_idx,
                      int64_t k_win, const int32_t* comp_idx, int64_t k_comp, const float* sink, float scale,
                      bool bf16, float* out, void* split_scratch, size_t split_bytes, cudaStream_t stream) {
  sparse_attention_rope(q, n_tok, n_heads, kv, win_idx, k_win, comp_idx, k_comp, sink, scale, bf16, 0, nullptr, out,
                        split_scratch, split_bytes, stream);
}

void sparse_attention_rope(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv, const int32_t* win_idx,
                           int64_t k_win, const int32_t* comp_idx, int64_t k_comp, const float* sink, float scale,
                           bool bf16, int64_t rd, const float* cos_sin, float* out, void* split_scratch,
                           size_t split_bytes, cudaStream_t stream) {
  if (n_tok <= 0 || n_heads <= 0 || kv.dim <= 0) return;
  if (cos_sin == nullptr) rd = 0;
  // the rope after the attention's kernels (the paths that do not rotate inside)
  auto rope_after = [&] {
    if (rd > 0) rope(out, n_tok, n_heads, kv.dim, rd, cos_sin, true, bf16, stream);
  };
  // (dsv4::fail's fmt format check does not build under nvcc: errors go through check(), which throws dsv4::Error)
  if (kv.dim > 4 * kChunk) check(cudaErrorInvalidValue, "sparse_attention: row width > 512 is not supported");
  if (k_win < 0) k_win = 0;
  if (k_comp < 0) k_comp = 0;
  AttnArgs a{};
  a.q = q;
  a.n_heads = n_heads;
  a.dim = kv.dim;
  a.ring = kv.ring;
  a.n_ring = kv.n_ring;
  a.fresh = kv.fresh;
  a.comp = kv.comp;
  a.win_idx = win_idx;
  a.k_win = k_win;
  a.comp_idx = comp_idx;
  a.k_comp = k_comp;
  a.sink = sink;
  a.scale = scale;
  a.bf16 = bf16;
  a.vec = kv.dim % 4 == 0 && aligned16(kv.ring) && aligned16(kv.fresh) && aligned16(kv.comp);
  a.out = out;
  // prefill chunks in the fast mode with bf16 rows: the tensor-core kernel (the reference kernel's arithmetic)
  if (!deterministic() && bf16 && n_tok > kFastMaxTok && kv.dim == kTcDim && n_heads % kTcHeads == 0 && a.vec &&
      aligned16(q) && aligned16(out) && prefill_tc_ok()) {
    const int64_t grid = n_tok * (n_heads / kTcHeads);
    if (grid > 0x7fffffff) check(cudaErrorInvalidConfiguration, "sparse_attention: too many tokens for one grid");
    attn_prefill_tc_kernel<<<unsigned(grid), kThreads, kTcSmem, stream>>>(a);
    g_tc_calls.fetch_add(1, std::memory_order_relaxed);
    return rope_after();
  }
  // the fast decode kernel (fast mode: not deterministic(), gemm_path.h)
  if (!deterministic() && n_tok <= kFastMaxTok && a.vec && kv.dim % 128 == 0 && aligned16(q) && aligned16(out)) {
    const int64_t grid = n_tok * ((n_heads + kFG - 1) / kFG);
    // split the entries in fixed pieces of kSplit (more CTAs for the few tokens of a decode step; the pieces depend
    // on the entry count alone, so a token's result does not depend on n_tok) when the partial states fit the scratch
    const int64_t n_split = (k_win + k_comp + kSplit - 1) / kSplit;
    if (split_scratch != nullptr && n_split > 1 && n_split <= kMaxSplit &&
        attention_split_bytes(n_tok, n_heads, kv.dim, k_win + k_comp) <= split_bytes) {
      const int64_t kk = k_win + k_comp;
      a.part = static_cast<float*>(split_scratch);
      a.scores = a.part + n_tok * n_heads * n_split * (kv.dim + 2);
      a.bmax = a.scores + n_tok * n_heads * kk;
      a.n_split = n_split;
      const dim3 g{unsigned(grid), unsigned(n_split), 1u};
      switch (kv.dim / 128) {
        case 1: launch_pdl(attn_decode_fast_kernel<1, kScores>, g, kThreads, 0, stream, a);
                launch_pdl(attn_decode_fast_kernel<1, kPartial>, g, kThreads, 0, stream, a); break;
        case 2: launch_pdl(attn_decode_fast_kernel<2, kScores>, g, kThreads, 0, stream, a);
                launch_pdl(attn_decode_fast_kernel<2, kPartial>, g, kThreads, 0, stream, a); break;
        case 3: launch_pdl(attn_decode_fast_kernel<3, kScores>, g, kThreads, 0, stream, a);
                launch_pdl(attn_decode_fast_kernel<3, kPartial>, g, kThreads, 0, stream, a); break;
        default: launch_pdl(attn_decode_fast_kernel<4, kScores>, g, kThreads, 0, stream, a);
                 launch_pdl(attn_decode_fast_kernel<4, kPartial>, g, kThreads, 0, stream, a); break;
      }
      // (the fast path's dim is a multiple of 128: even, as the combine's column pairs need)
      const bool rope_in = rd > 0 && rd <= kv.dim && rd % 2 == 0;
      launch_pdl(attn_combine_kernel, unsigned(n_tok * n_heads), kThreads, 0, stream, a.part, n_split, n_heads, kv.dim,
                 sink, bf16, out, rope_in ? rd : int64_t(0), cos_sin);
      if (!rope_in) rope_after();
      return;
    }
    const unsigned g = unsigned(grid);
    switch (kv.dim / 128) {
      case 1: launch_pdl(attn_decode_fast_kernel<1, kWhole>, g, kThreads, 0, stream, a); break;
      case 2: launch_pdl(attn_decode_fast_kernel<2, kWhole>, g, kThreads, 0, stream, a); break;
      case 3: launch_pdl(attn_decode_fast_kernel<3, kWhole>, g, kThreads, 0, stream, a); break;
      default: launch_pdl(attn_decode_fast_kernel<4, kWhole>, g, kThreads, 0, stream, a); break;
    }
    return rope_after();
  }
  // Heads per CTA: as many as keep the GPU filled (each CTA stages its rows once for all its heads). The results do
  // not depend on the choice.
  const int64_t sms = sm_count();
  if (n_heads >= 16 && n_tok * ((n_heads + 15) / 16) >= 2 * sms) launch_g<16>(a, n_tok, stream);
  else if (n_heads >= 4 && n_tok * ((n_heads + 3) / 4) >= sms) launch_g<4>(a, n_tok, stream);
  else launch_g<1>(a, n_tok, stream);
  rope_after();
}

}  // namespace dsv4::cuda
