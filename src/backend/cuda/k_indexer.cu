// Lightning indexer scores + exact top-k (spec §5.6; semantics: Ops::indexer_topk in backend/ops.h; reference:
// CpuOps::indexer_topk in backend/cpu_ops.cpp).
//
// Keys are paged (PagedRows): logical key row j of token t lives at pool row pages[table[t] + j / page_rows] *
// page_rows + j % page_rows (pages == nullptr: row j). Scores and the selection work on logical indices j; only the
// key loads and the final write (pool row ids) go through the page table.
//
// Two kernels per chunk of tokens:
// 1. indexer_score_kernel: score[t, j] = maybe_bf(Σ_h maybe_bf(relu(maybe_bf(q[t,h]·key_t(j))) · w[t,h])) for
//    j < n_visible[t], written to scratch as an order-preserving uint32 (-0.0 mapped to +0.0). A CTA takes 16 tokens
//    x 128 keys (4 x 128 or 1 x 256 for fewer tokens): the key tile stays in shared memory for all heads, q is staged
//    2 heads at a time; every thread owns 4 (or 1) tokens x 2 keys. Tokens of a tile that belong to different
//    sequences (different page tables) are handled as consecutive segments, each with its own key tile; every token
//    is accumulated in exactly one segment, so its arithmetic does not depend on its neighbours. The launcher picks
//    the tile shape from the tokens per sequence (PagedRows::max_run). The arithmetic is the CPU's, in the CPU's order:
//    the dot uses the CPU's 8 fixed partial sums (lane l accumulates elements l, l+8, ... with separately rounded
//    products and sums, combined as ((0+1)+(2+3))+((4+5)+(6+7))), the head sum runs in ascending h, no FMA anywhere.
//    The scores, hence the selections, are therefore bitwise those of the CPU.
// 2. indexer_select_kernel (one CTA per token): the exact top min(topk, n_visible) by (score descending, index
//    ascending). Every (score, j) becomes the distinct 64-bit key (ordered score << 32) | (0xFFFFFFFF - j), so "larger
//    key" is exactly the CPU's order; an MSB-first radix select (8-bit digits, warp-aggregated shared-memory
//    histograms) finds the k-th largest key K, the keys >= K (exactly k of them) are collected and sorted
//    descending by a bitonic sort in shared memory, and their indices are written, padded with -1.
// Tokens are processed in chunks so that the fp32 score scratch stays <= 256 MiB (chunk = 2^26 / max_visible tokens,
// at least 16); the results do not depend on the chunking. Nothing depends on n_tok: batch invariant.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/device_pdl.cuh"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kHC = 2;   // heads of q staged at a time
constexpr int64_t kScoreBudget = int64_t(1) << 26;  // fp32 scores per chunk (256 MiB)
constexpr int kMaxTopkPow2 = 16384;                  // sort buffer bound (128 KiB of shared memory)

__host__ __device__ constexpr int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

int64_t chunk_tokens(int64_t n_tok, int64_t max_visible) {
  int64_t ch = max_visible > 0 ? kScoreBudget / max_visible : n_tok;
  ch = std::max<int64_t>(ch, 16);
  ch = std::min<int64_t>(ch, int64_t(65535) * 16);  // grid.y <= 65535 token tiles of <= 16
  return std::max<int64_t>(1, std::min(ch, n_tok));
}

__device__ __forceinline__ uint32_t order_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0;  // -0.0 == +0.0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Four consecutive elements of a row from global memory starting at column col (zero beyond dim or for no row).
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

__device__ __forceinline__ void lds8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// ---- 1. scores ---------------------------------------------------------------------------------------------------
struct ScoreArgs {
  const float* q;  // chunk base [n, H, dim]
  int64_t n, H, dim;
  const float* keys;         // key pool
  const int32_t* pages;      // page tables, or nullptr (contiguous keys)
  const int32_t* table;      // chunk base [n]: start of each token's page table (with pages)
  int64_t page_rows;
  const int32_t* n_visible;  // chunk base [n]
  int64_t max_visible;
  const float* w;  // chunk base [n, H]
  bool bf16;
  bool vec;          // dim % 4 == 0 and q, keys 16-byte aligned: float4 loads
  uint32_t* scores;  // [n, max_visible]
};

// Score tile of a CTA: TG token groups x KP key pairs (TG * KP = 256 threads); a thread owns TPT tokens x 2 keys
// (kp and kp + KP; KPT = 1: key kp only), so a CTA covers TT = TG * TPT tokens and TJ = KPT * KP keys.
// <4, 4>: 16 x 128 (prefill), <4, 1>: 4 x 128, <1, 1, 1, 8>: 1 x 256 (decode). A warp shares its tokens (q reads are broadcasts); key rows are read
// with a stride of KS = 4 mod 32 floats (conflict-free).
// KPT: keys per thread (2, or 1: the single-token tile 1 x 256); HC: heads of q staged at a time (kHC, or 8 for the
// single-token tile: a quarter of the stage barriers and q loads). Neither changes any score's arithmetic.
template <int TG, int TPT, int KPT = 2, int HC = kHC>
struct ScoreCfg {
  static constexpr int KP = kThreads / TG, TT = TG * TPT, TJ = KPT * KP;
  static size_t smem(int64_t dim) {
    return sizeof(float) * (size_t(TJ + TT * HC) * size_t(round8(dim) + 4) + TT * HC) + sizeof(int) * (2 * TT);
  }
};

// Pool row of logical key row j for a token whose page table starts at tb (contiguous keys: j).
__device__ __forceinline__ int64_t key_pool_row(const int32_t* pages, int64_t page_rows, int tb, int64_t j) {
  if (pages == nullptr) return j;
  return int64_t(pages[int64_t(tb) + j / page_rows]) * page_rows + j % page_rows;
}

template <int TG, int TPT, int KPT = 2, int HC = kHC>
__global__ void __launch_bounds__(kThreads, 2) indexer_score_kernel(ScoreArgs a) {
  using C = ScoreCfg<TG, TPT, KPT, HC>;
  constexpr int TT = C::TT, TJ = C::TJ, KP = C::KP;
  extern __shared__ float4 smem4[];
  const int DP = int(round8(a.dim)), KS = DP + 4;
  float* ks = reinterpret_cast<float*>(smem4);  // [TJ][KS] key tile
  float* qs = ks + TJ * KS;                     // [TT][HC][KS] q of the staged heads
  float* ws = qs + TT * HC * KS;               // [TT][HC]
  int* nv_s = reinterpret_cast<int*>(ws + TT * HC);  // [TT] visible keys per token
  int* tb_s = nv_s + TT;                              // [TT] page-table start per token (-1: past the chunk)
  pdl_wait();
  pdl_launch_dependents();

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t j0 = int64_t(blockIdx.x) * TJ, t0 = int64_t(blockIdx.y) * TT;
  if (tid < TT) {
    int64_t nv = 0;
    int tb = -1;
    if (t0 + tid < a.n) {
      nv = std::min<int64_t>(std::max<int32_t>(a.n_visible[t0 + tid], 0), a.max_visible);
      tb = a.pages ? a.table[t0 + tid] : 0;
    }
    nv_s[tid] = int(nv);
    tb_s[tid] = tb;
  }
  __syncthreads();

  const int kp = tid % KP, tg = tid / KP;  // keys kp, kp + KP; tokens TPT tg .. TPT tg + TPT - 1
  float s[TPT][KPT];
#pragma unroll
  for (int x = 0; x < TPT; ++x)
#pragma unroll
    for (int y = 0; y < KPT; ++y) s[x][y] = 0.0f;

  // Segments: runs of consecutive tokens with one page table (CTA-uniform: computed by every thread from shared
  // memory). Tokens past the chunk (tb -1) come last.
  for (int seg0 = 0; seg0 < TT && tb_s[seg0] >= 0;) {
    const int tb = tb_s[seg0];
    int seg1 = seg0 + 1, nvmax = nv_s[seg0];
    while (seg1 < TT && tb_s[seg1] == tb) nvmax = max(nvmax, nv_s[seg1++]);
    if (j0 < nvmax) {  // some token of the segment sees these keys
      __syncthreads();  // the previous segment's key tile and q stage are consumed
      // key tile (rows >= nvmax and columns >= dim are zero); one warp per row
      for (int r = warp; r < TJ; r += kThreads / 32) {
        const int64_t j = j0 + r;
        const float* src = j < nvmax ? a.keys + key_pool_row(a.pages, a.page_rows, tb, j) * a.dim : nullptr;
        for (int col = lane * 4; col < DP; col += 128)
          *reinterpret_cast<float4*>(ks + r * KS + col) = load4(src, col, a.dim, a.vec);
      }

      for (int64_t hc0 = 0; hc0 < a.H; hc0 += HC) {
        __syncthreads();  // previous q stage consumed (and the key tile written)
        for (int r = warp; r < TT * HC; r += kThreads / 32) {  // one warp per (token, head) row
          const int64_t t = t0 + r / HC, h = hc0 + r % HC;
          const float* src = (t < a.n && h < a.H) ? a.q + (t * a.H + h) * a.dim : nullptr;
          for (int col = lane * 4; col < DP; col += 128)
            *reinterpret_cast<float4*>(qs + r * KS + col) = load4(src, col, a.dim, a.vec);
        }
        if (tid < TT * HC) {
          const int64_t tt = tid / HC, hh = tid % HC, t = t0 + tt, h = hc0 + hh;
          ws[tid] = (t < a.n && h < a.H) ? a.w[t * a.H + h] : 0.0f;
        }
        __syncthreads();
        const int nh = int(std::min<int64_t>(HC, a.H - hc0));
        for (int hh = 0; hh < nh; ++hh) {
          float ch[TPT][KPT][8];
#pragma unroll
          for (int x = 0; x < TPT; ++x)
#pragma unroll
            for (int y = 0; y < KPT; ++y)
#pragma unroll
              for (int l = 0; l < 8; ++l) ch[x][y][l] = 0.0f;
          const float* k0p = ks + kp * KS;
          const float* k1p = ks + (KPT > 1 ? kp + KP : kp) * KS;
          const float* qp = qs + (tg * TPT * HC + hh) * KS;
#pragma unroll 2
          for (int c = 0; c < DP; c += 8) {
            float k0[8], k1[8];
            lds8(k0p + c, k0);
            if constexpr (KPT > 1) lds8(k1p + c, k1);
#pragma unroll
            for (int x = 0; x < TPT; ++x) {
              float qv[8];
              lds8(qp + x * HC * KS + c, qv);
#pragma unroll
              for (int l = 0; l < 8; ++l) {
                ch[x][0][l] = __fadd_rn(ch[x][0][l], __fmul_rn(qv[l], k0[l]));
                if constexpr (KPT > 1) ch[x][KPT - 1][l] = __fadd_rn(ch[x][KPT - 1][l], __fmul_rn(qv[l], k1[l]));
              }
            }
          }
#pragma unroll
          for (int x = 0; x < TPT; ++x) {
            const int tt = tg * TPT + x;
            if (tt < seg0 || tt >= seg1) continue;  // another segment's token: accumulated with its own keys
            const float wv = ws[tt * HC + hh];
#pragma unroll
            for (int y = 0; y < KPT; ++y) {
              const float* c8 = ch[x][y];
              float d = __fadd_rn(__fadd_rn(__fadd_rn(c8[0], c8[1]), __fadd_rn(c8[2], c8[3])),
                                  __fadd_rn(__fadd_rn(c8[4], c8[5]), __fadd_rn(c8[6], c8[7])));
              d = maybe_bf16(d, a.bf16);
              d = d > 0.0f ? d : 0.0f;
              s[x][y] = __fadd_rn(s[x][y], maybe_bf16(__fmul_rn(d, wv), a.bf16));
            }
          }
        }
      }
    }
    seg0 = seg1;
  }

#pragma unroll
  for (int x = 0; x < TPT; ++x) {
    const int tt = tg * TPT + x;
    const int64_t t = t0 + tt;
    if (t >= a.n) continue;
#pragma unroll
    for (int y = 0; y < KPT; ++y) {
      const int64_t j = j0 + kp + KP * y;
      if (j < nv_s[tt]) a.scores[t * a.max_visible + j] = order_bits(maybe_bf16(s[x][y], a.bf16));
    }
  }
}

// ---- 2. exact top-k ----------------------------------------------------------------------------------------------
__device__ __forceinline__ uint64_t make_key(uint32_t ordered, int64_t j) {
  return (uint64_t(ordered) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(j));
}

__global__ void __launch_bounds__(kThreads) indexer_select_kernel(const uint32_t* scores, int64_t stride,
                                                                  const int32_t* n_visible, int64_t max_visible,
                                                                  int64_t topk, const int32_t* pages,
                                                                  const int32_t* table, int64_t page_rows,
                                                                  int32_t* sel) {
  extern __shared__ unsigned long long list[];  // [next_pow2(min(topk, max_visible))]
  __shared__ uint32_t hist[kThreads / 32][256];
  __shared__ uint32_t sh_digit, sh_above, sh_count, sh_n;
  pdl_wait();
  pdl_launch_dependents();

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t = blockIdx.x;
  const int64_t nv = std::min<int64_t>(std::max<int32_t>(n_visible[t], 0), max_visible);
  const int64_t kk = std::min(topk, nv);
  int32_t* st = sel + t * topk;
  if (kk == 0) {
    for (int64_t i = tid; i < topk; i += kThreads) st[i] = -1;
    return;
  }
  const uint32_t* row = scores + t * stride;

  // k-th largest key (0 when every visible key is selected)
  uint64_t thr = 0;
  if (kk < nv) {
    uint64_t prefix = 0, mask = 0;
    uint32_t krem = uint32_t(kk);
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int i = tid; i < (kThreads / 32) * 256; i += kThreads) (&hist[0][0])[i] = 0;
      __syncthreads();
      for (int64_t base = 0; base < nv; base += kThreads) {
        const int64_t j = base + tid;
        const bool act = j < nv;
        const uint64_t key = act ? make_key(row[j], j) : 0;
        const bool match = act && (key & mask) == prefix;
        const uint32_t digit = match ? uint32_t(key >> shift) & 0xFFu : 256u;
        const unsigned peers = __match_any_sync(0xffffffffu, digit);
        if (match && lane == __ffs(peers) - 1) atomicAdd(&hist[warp][digit], uint32_t(__popc(peers)));
      }
      __syncthreads();
      {
        uint32_t tot = 0;
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) tot += hist[w][tid];
        __syncthreads();
        hist[0][tid] = tot;
      }
      __syncthreads();
      if (warp == 0) {
        // lane l holds bins 8l .. 8l+7; find the digit d where the count of keys with digits > d is < krem and
        // the count with digits >= d is >= krem
        uint32_t c[8], local = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) c[i] = hist[0][lane * 8 + i], local += c[i];
        uint32_t suf = local;  // Σ over lanes >= lane
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const uint32_t v = __shfl_down_sync(0xffffffffu, suf, off);
          if (lane + off < 32) suf += v;
        }
        uint32_t cum = suf - local;  // keys in bins above this lane's
#pragma unroll
        for (int i = 7; i >= 0; --i) {
          if (cum < krem && cum + c[i] >= krem) {
            sh_digit = uint32_t(lane * 8 + i);
            sh_above = cum;
            sh_count = c[i];
          }
          cum += c[i];
        }
      }
      __syncthreads();
      const uint32_t d = sh_digit, above = sh_above, cnt = sh_count;
      krem -= above;
      prefix |= uint64_t(d) << shift;
      mask |= uint64_t(0xFF) << shift;
      __syncthreads();  // everyone has read sh_*
      if (cnt == krem) break;  // the whole bucket is selected: keys >= prefix are exactly the top kk
    }
    thr = prefix;
  }

  // collect the kk keys >= thr (in any order), then sort them descending
  if (tid == 0) sh_n = 0;
  __syncthreads();
  int64_t p2 = 1;
  while (p2 < kk) p2 <<= 1;
  for (int64_t base = 0; base < nv; base += kThreads) {
    const int64_t j = base + tid;
    const bool act = j < nv;
    const uint64_t key = act ? make_key(row[j], j) : 0;
    const bool take = act && key >= thr;
    const unsigned bal = __ballot_sync(0xffffffffu, take);
    if (bal == 0) continue;  // warp-uniform
    uint32_t pos0 = 0;
    if (lane == __ffs(bal) - 1) pos0 = atomicAdd(&sh_n, uint32_t(__popc(bal)));
    pos0 = __shfl_sync(0xffffffffu, pos0, __ffs(bal) - 1);
    if (take) {
      const uint32_t pos = pos0 + uint32_t(__popc(bal & ((1u << lane) - 1u)));
      if (pos < uint32_t(p2)) list[pos] = key;
    }
  }
  __syncthreads();
  const int64_t n_sel = std::min<int64_t>(sh_n, p2);  // == kk
  for (int64_t i = n_sel + tid; i < p2; i += kThreads) list[i] = 0;  // 0 is below every real key
  __syncthreads();
  const int n2 = int(p2);
  for (int k = 2; k <= n2; k <<= 1) {
    for (int jj = k >> 1; jj > 0; jj >>= 1) {
      for (int i = tid; i < n2; i += kThreads) {
        const int ixj = i ^ jj;
        if (ixj > i) {
          const unsigned long long x = list[i], y = list[ixj];
          const bool desc = (i & k) == 0;
          if (desc ? (x < y) : (x > y)) {
            list[i] = y;
            list[ixj] = x;
          }
        }
      }
      __syncthreads();
    }
  }
  const int tb = pages ? table[t] : 0;
  for (int64_t i = tid; i < topk; i += kThreads) {
    if (i >= kk) {
      st[i] = -1;
      continue;
    }
    const int64_t j = int64_t(0xFFFFFFFFu - uint32_t(list[i] & 0xFFFFFFFFull));
    st[i] = int32_t(key_pool_row(pages, page_rows, tb, j));
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Opt-in shared memory per block of the current device (cached per device).
size_t max_smem_optin() {
  static std::atomic<int> cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 99 * 1024;
  int n = cached[dev].load(std::memory_order_relaxed);
  if (n <= 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || n <= 0)
      n = 99 * 1024;
    cached[dev].store(n, std::memory_order_relaxed);
  }
  return size_t(n);
}

template <int TG, int TPT, int KPT = 2, int HC = kHC>
void launch_scores(const ScoreArgs& a, cudaStream_t stream) {
  using C = ScoreCfg<TG, TPT, KPT, HC>;
  const size_t smem = C::smem(a.dim);
  if (smem > max_smem_optin()) check(cudaErrorInvalidValue, "indexer_topk: key width too large for shared memory");
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(indexer_score_kernel<TG, TPT, KPT, HC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         int(smem));
  const dim3 grid(unsigned((a.max_visible + C::TJ - 1) / C::TJ), unsigned((a.n + C::TT - 1) / C::TT));
  launch_pdl(indexer_score_kernel<TG, TPT, KPT, HC>, grid, kThreads, smem, stream, a);
}

}  // namespace

size_t indexer_topk_scratch_bytes(int64_t n_tok, int64_t max_visible, int64_t topk) {
  if (n_tok <= 0) return 0;
  return size_t(chunk_tokens(n_tok, max_visible)) * size_t(std::max<int64_t>(max_visible, 1)) * sizeof(uint32_t);
}

void indexer_topk(const float* q, int64_t n_tok, int64_t n_heads, int64_t dim, const PagedRows& keys,
                  const int32_t* n_visible, int64_t max_visible, const float* w, int64_t topk, bool bf16,
                  int32_t* sel, void* scratch, cudaStream_t stream) {
  if (n_tok <= 0 || topk <= 0) return;
  if (max_visible < 0) max_visible = 0;
  int64_t p2 = 1;
  while (p2 < std::min(topk, std::max<int64_t>(max_visible, 1))) p2 <<= 1;
  // (dsv4::fail's fmt format check does not build under nvcc: errors go through check(), which throws dsv4::Error)
  if (p2 > kMaxTopkPow2) check(cudaErrorInvalidValue, "indexer_topk: top-k > 16384 is not supported");
  const size_t sel_smem = size_t(p2) * sizeof(unsigned long long);
  if (sel_smem > 48 * 1024)
    cudaFuncSetAttribute(indexer_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sel_smem));

  uint32_t* scores = static_cast<uint32_t*>(scratch);
  const int64_t ch = chunk_tokens(n_tok, max_visible);
  for (int64_t c0 = 0; c0 < n_tok; c0 += ch) {
    const int64_t n = std::min(ch, n_tok - c0);
    if (max_visible > 0) {
      ScoreArgs a{};
      a.q = q + c0 * n_heads * dim;
      a.n = n;
      a.H = n_heads;
      a.dim = dim;
      a.keys = keys.rows;
      a.pages = keys.pages;
      a.table = keys.pages ? keys.table + c0 : nullptr;
      a.page_rows = keys.page_rows;
      a.n_visible = n_visible + c0;
      a.max_visible = max_visible;
      a.w = w + c0 * n_heads;
      a.bf16 = bf16;
      a.vec = dim % 4 == 0 && aligned16(q) && aligned16(keys.rows);
      a.scores = scores;
      // Tile shape by the tokens that share one page table (one sequence; the results do not depend on it):
      // 16 x 128, 4 x 128 or 1 x 256 (the last only where its 137 KiB of shared memory fit). A tile spanning
      // several sequences loads one key tile per sequence.
      const int64_t run = keys.max_run > 0 ? std::min(keys.max_run, n) : n;
      if (run >= 16) launch_scores<4, 4>(a, stream);
      else if (run > 1 || ScoreCfg<1, 1, 1, 8>::smem(dim) > max_smem_optin()) launch_scores<4, 1>(a, stream);
      else launch_scores<1, 1, 1, 8>(a, stream);
    }
    launch_pdl(indexer_select_kernel, unsigned(n), kThreads, sel_smem, stream, scores, max_visible, n_visible + c0,
               max_visible, topk, keys.pages, keys.pages ? keys.table + c0 : nullptr, keys.page_rows, sel + c0 * topk);
  }
}

}  // namespace dsv4::cuda
