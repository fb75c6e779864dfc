// Prefill MoE on Hopper's warpgroup MMA (wgmma, sm_90a only): the same products as moe_tc_big_kernel (k_moe_tc.cu,
// whose file comment gives the values, the summation contract and the column order), for the same calls: the
// launcher moe_tc_big takes this kernel instead where it runs (wgmma_ok: its sm_90a code is in the binary and the
// device has compute capability 9.0; set_moe_big_kernel(MoeBigKernel::mma) keeps the old one).
//
// Summation, per output (as k_moe_tc.cu's contract): per 128-column block kb, acc = acc * (sa[kb - 1] / sa[kb]), then
//   fast block (every E8M0 code of the block's 4 groups in [104, 128] for all 256 weight rows of the CTA): 8 chained
//     k16 wgmmas onto acc (the f16 weights with the scale folded in);
//   other block: per 32-column group G, d = 2 k16 wgmmas from 0 on the bare E2M1 values (m64n32, a quarter of the
//     warpgroup's columns at a time: 16 more registers, not 64), acc = fma(d, 2^(e - 127), acc) (code 0 as 0, 255
//     as infinity);
// the output is acc * sa[last block] (bf16 if out_bf16; kW13: SwiGLU of the w1 and w3 outputs).
//
// A CTA = 256 threads = 2 warpgroups for one 64-row M tile (the plan's big_tile_start schedule) x 256 weight rows, K
// in blocks of 128; warpgroup h owns 128 weight rows (the B tile of its m64n128k16 wgmmas, 64 fp32 accumulators a
// thread): kW13 rows n0 + 64 h .. + 63 of w1 then the same rows of w3 (accumulator columns c and c + 64 are the g and
// u of one output: the same thread, n8 tiles j and j + 8), kW2 rows n0 + 128 h .. + 127 of w2. Per block kb:
//   1. cp.async (all 256 threads, right after the wgmmas of 2. are issued): the f16 activations of block kb + 2
//      into the A ring (3 stages, the wgmma layout: [2 K halves][64 rows][128 bytes] in the 128-byte swizzle, then
//      the 256 rows' E8M0 words and the 64 rows' ratios) and its FP4 weights into the FP4 ring (2 stages, [256
//      staged rows][64 bytes] as k_moe_tc.cu's B).
//   2. each warpgroup rescales its accumulators and issues block kb's 8 wgmmas (A from the A ring, B from the f16
//      buffer kb % 2), and while they run, thread j of the warpgroup converts weight row j of block kb + 1 from the
//      FP4 ring into the f16 buffer (kb + 1) % 2 (the wgmma layout: [2 K halves][128 rows][128 bytes], 128-byte
//      swizzle), then waits for its wgmmas.
//   3. one barrier per block hands the copies and the converted buffer to the next block; it also ANDs the
//      fast-block test of block kb + 1's scales (each thread tests one staged row), so that its conversion knows
//      whether to fold the scales in and the warpgroups which way to run it.
// Shared memory 220,456 bytes (the dynamic part's base rounded up to 1,024 in the kernel): one CTA per SM. Rows past a segment's end repeat its last row and are not stored.
// Without a GPU: tools/device/moe_wgmma_layout_check.py replays the swizzle, descriptor and fragment arithmetic.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "backend/cuda/device_async_copy.cuh"
#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/device_swiglu.cuh"
#include "backend/cuda/device_wgmma.cuh"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe_tc_common.cuh"

namespace dsv4::cuda {
namespace {

using namespace moe_tc;

constexpr int WG_THREADS = 256, WG_M = gemm_internal::kMoeTileM, WG_N = 256, WG_KT = 128;
static_assert(WG_M == 64, "one m64 wgmma per warpgroup and k16 step");
static_assert(WG_N == 2 * 128 && WG_THREADS == 2 * 128, "two warpgroups of 128 weight rows");

// Shared memory (bytes from a 1,024-aligned base; every wgmma tile 1,024-aligned):
//   A ring, 3 stages of 18,432: A [2 K halves][64 rows][128 B] (chunk c of row r at c ^ (r & 7)), then
//     S [256] the staged rows' E8M0 words of the block (at 16,384), R [64] the rows' ratios sa[kb - 1] / sa[kb]
//     (at 17,408)
//   FP4 ring, 2 stages of 16,384: [256 staged rows][64 B], group G of row r at chunk G ^ ((r >> 1) & 3)
//   f16 B, 2 buffers x 2 warpgroups of 32,768: [2 K halves][128 rows][128 B] (chunk c of row j at c ^ (j & 7))
constexpr int A_STAGES = 3, A_STAGE = 18432, A_S = 16384, A_R = 17408;
constexpr int F_STAGES = 2, F_STAGE = 16384;
constexpr int B_WG = 32768;
constexpr int OFF_A = 0, OFF_F = OFF_A + A_STAGES * A_STAGE, OFF_B = OFF_F + F_STAGES * F_STAGE;
constexpr int SMEM_USED = OFF_B + 2 * 2 * B_WG;  // 219,136
constexpr int SMEM_DYN = SMEM_USED + 1024;       // (room to align the base)
static_assert(OFF_F % 1024 == 0 && OFF_B % 1024 == 0 && A_STAGE % 1024 == 0, "wgmma tiles must be 1,024-aligned");

std::atomic<int64_t> g_calls{0};

// Staged row (the FP4 ring's row: 0..127 from the first weight base, 128..255 from the second) of row j of
// warpgroup h's B tile.
template <int KIND>
__device__ __forceinline__ int staged_row(int h, int j) {
  if constexpr (KIND == kW13) return j < 64 ? 64 * h + j : 128 + 64 * h + (j - 64);
  return 128 * h + j;
}

#ifdef DSV4_WGMMA
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a)
               : "memory");
  return v;
}
__device__ __forceinline__ void sts128(uint32_t a, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}
__device__ __forceinline__ uint32_t lds32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ float lds_f32(uint32_t a) { return __uint_as_float(lds32(a)); }
#endif

// The per-block scale factor of group G (fast: the folded f16 factor pair; slow: 2^14, the bare E2M1 values).
template <int G>
__device__ __forceinline__ uint32_t group_factor(bool fast, uint32_t hi4) {
  return fast ? f16_factor<G>(hi4) : kF16Two14;
}

template <int KIND>
__global__ void __launch_bounds__(WG_THREADS, 1) moe_wgmma_kernel(const BigArgs A) {
#ifdef DSV4_WGMMA
  // (static shared memory only in this sm_90a body: wgmma_ok() reads its size as the sign that the device runs it)
  __shared__ const uint8_t* bases[4];  // weight row bases of staged rows 0 and 128, their scale row bases
  __shared__ int tile[2 + WG_M];       // m0, mcnt, then the activation row of each tile row
  extern __shared__ uint8_t wg_smem_raw[];
  const int tid = threadIdx.x;
  const int64_t slot = blockIdx.y, E = A.n_experts;
  if (slot >= A.big_tile_start[E]) return;
  int64_t lo = 0, hi = E - 1;  // the expert: the last e with big_tile_start[e] <= slot
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (A.big_tile_start[mid] <= slot) lo = mid; else hi = mid - 1;
  }
  const int64_t e = lo;
  const int m0 = A.seg_start[e] + int(slot - A.big_tile_start[e]) * WG_M;
  const int mcnt = min(WG_M, A.seg_start[e + 1] - m0);
  if (mcnt <= 0) return;
  const int64_t K = A.K, rb = K / 2, sb = K / 32;
  const int nkb = int(K / WG_KT);
  const int64_t n0 = int64_t(blockIdx.x) * (KIND == kW13 ? WG_N / 2 : WG_N);
  if (tid == 0) {
    const WeightView& W0 = KIND == kW13 ? A.table[e].w1 : A.table[e].w2;
    const WeightView& W1 = KIND == kW13 ? A.table[e].w3 : A.table[e].w2;
    bases[0] = W0.w + n0 * rb;
    bases[1] = KIND == kW13 ? W1.w + n0 * rb : W0.w + (n0 + 128) * rb;
    bases[2] = W0.scale + n0 * sb;
    bases[3] = KIND == kW13 ? W1.scale + n0 * sb : W0.scale + (n0 + 128) * sb;
    tile[0] = m0, tile[1] = mcnt;
  }
  if (tid < WG_M) {
    const int64_t sr = int64_t(m0) + min(tid, mcnt - 1);  // rows past the segment repeat its last row
    tile[2 + tid] = KIND == kW13 ? A.row_tok[sr] : int(sr);
  }
  __syncthreads();
  const uint32_t smem = (smem_addr(wg_smem_raw) + 1023u) & ~1023u;

  // ---- this thread's copies of block kb (block 0's sources, kept in registers: one CTA per SM leaves room)
  // A: round c copies row 16 c + tid / 16, chunk tid % 16 (16 lanes read a row's 256 contiguous bytes; 8 lanes write
  // one row's 8 chunks of a K half: 8 distinct bank groups). FP4: group q of staged rows r + 64 c (r = tid / 4,
  // q = tid % 4; as k_moe_tc.cu's loader). S: the E8M0 word of staged row tid. R: (tid < 64) the ratio of row tid.
  const uint8_t* a_src[4];
  uint32_t a_dst[4];
  const int ch = tid & 15;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int r = 16 * c + (tid >> 4);
    a_src[c] = A.act + int64_t(tile[2 + r]) * K * 2 + 16 * ch;
    a_dst[c] = uint32_t((ch >> 3) * 8192 + r * 128 + 16 * ((ch & 7) ^ (r & 7)));
  }
  const int fr = tid >> 2, fq = tid & 3;
  const uint8_t* f_src[4] = {bases[0] + fr * rb + 16 * fq, bases[0] + (fr + 64) * rb + 16 * fq,
                             bases[1] + fr * rb + 16 * fq, bases[1] + (fr + 64) * rb + 16 * fq};
  const uint32_t f_dst = uint32_t(fr * 64 + 16 * (fq ^ ((fr >> 1) & 3)));
  const uint8_t* s_src = bases[2 + (tid >> 7)] + (tid & 127) * sb;
  const float* r_src = A.ratio + int64_t(tile[2 + (tid & (WG_M - 1))]) * nkb;
  auto load = [&](int kb) {
    const uint32_t SA = smem + OFF_A + (kb % A_STAGES) * A_STAGE, SF = smem + OFF_F + (kb % F_STAGES) * F_STAGE;
#pragma unroll
    for (int c = 0; c < 4; ++c) cp16(SA + a_dst[c], a_src[c] + kb * (WG_KT * 2));
#pragma unroll
    for (int c = 0; c < 4; ++c) cp16(SF + f_dst + 4096 * c, f_src[c] + kb * 64);
    cp4(SA + A_S + 4 * tid, s_src + kb * 4);
    if (tid < WG_M) cp4(SA + A_R + 4 * tid, r_src + kb);
  };
  // whether staged row tid's 4 codes of block kb are all in the fast range (block kb has landed)
  auto row_fast = [&](int kb) {
    return e8m0_word_fast(lds32(smem + OFF_A + (kb % A_STAGES) * A_STAGE + A_S + 4 * thread_index()));
  };
  // ---- thread j of warpgroup h converts row j of its B tile of block kb into f16 buffer kb % 2: group G's 4 FP4
  // words t = 0..3 (columns 8 t .. 8 t + 7) become f16 pairs p = 0..3 (fp4x8_as_f16x2), and pair p of word t goes to
  // word 4 p + t of the group (moe_a16_kernel's order): the 16-byte chunk 4 (G % 2) + p of K half G / 2 holds pair p
  // of words 0..3. A warp's 32 rows: 8 lanes store one chunk of 8 rows, at 8 distinct chunk positions.
  auto convert = [&](int kb, bool fast) {
    const int x = thread_index(), h = x >> 7, j = x & 127, sr = staged_row<KIND>(h, j);
    const uint32_t SA = smem + OFF_A + (kb % A_STAGES) * A_STAGE, SF = smem + OFF_F + (kb % F_STAGES) * F_STAGE;
    const uint32_t hi4 = e8m0_word_f16_hi(lds32(SA + A_S + 4 * sr));
    const uint32_t dst = smem + OFF_B + ((kb & 1) * 2 + h) * B_WG + j * 128;
#pragma unroll
    for (int G = 0; G < 4; ++G) {
      const uint4 w = lds128(SF + sr * 64 + 16 * (G ^ ((sr >> 1) & 3)));
      const uint32_t f = G == 0 ? group_factor<0>(fast, hi4) : G == 1 ? group_factor<1>(fast, hi4)
                       : G == 2 ? group_factor<2>(fast, hi4) : group_factor<3>(fast, hi4);
      uint32_t r[4][4];  // [word t][pair p]
      fp4x8_as_f16x2(w.x, f, r[0]);
      fp4x8_as_f16x2(w.y, f, r[1]);
      fp4x8_as_f16x2(w.z, f, r[2]);
      fp4x8_as_f16x2(w.w, f, r[3]);
      const uint32_t half = dst + (G >> 1) * 16384;
#pragma unroll
      for (int p = 0; p < 4; ++p) sts128(half + 16 * ((4 * (G & 1) + p) ^ (j & 7)), r[0][p], r[1][p], r[2][p], r[3][p]);
    }
  };
  // descriptors of k16 step s (0..7) of block kb: A (64 rows) and warpgroup h's B (128 rows)
  auto desc_a = [&](int kb, int s) {
    return wgmma_desc_sw128(smem + OFF_A + (kb % A_STAGES) * A_STAGE + (s >> 2) * 8192 + 32 * (s & 3));
  };
  auto desc_b = [&](int kb, int h, int s) {
    return wgmma_desc_sw128(smem + OFF_B + ((kb & 1) * 2 + h) * B_WG + (s >> 2) * 16384 + 32 * (s & 3));
  };

  float acc[64];  // warpgroup fragment: rows 16 w + g (+ 8), columns 8 j + 2 t (+ 1) of the warpgroup's 128
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;

  load(0);
  cp_commit();
  if (nkb > 1) load(1);
  cp_commit();
  cp_wait<1>();
  bool fast = __syncthreads_and(row_fast(0));
  convert(0, fast);
  for (int kb = 0; kb < nkb; ++kb) {
    cp_wait<0>();         // block kb + 1's copies (this thread's)
    fence_proxy_async();  // this thread's copies and converted weights, visible to the wgmmas
    const bool fast_next = __syncthreads_and(kb + 1 < nkb ? row_fast(kb + 1) : true);
    const int x = thread_index(), h = x >> 7, warp = (x >> 5) & 3, g = (x & 31) >> 2;
    if (kb > 0) {  // acc from units of sa[kb - 1] to units of sa[kb]
      const uint32_t R = smem + OFF_A + (kb % A_STAGES) * A_STAGE + A_R + 4 * (16 * warp + g);
      const float r0 = lds_f32(R), r1 = lds_f32(R + 32);
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = __fmul_rn(acc[i], (i & 2) ? r1 : r0);
    }
    if (fast) {
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < 8; ++s) wgmma_m64n128k16_f16(acc, desc_a(kb, s), desc_b(kb, h, s), 1);
      wgmma_commit();
      if (kb + 2 < nkb) load(kb + 2);  // (while the wgmmas run; into slots they do not read)
      cp_commit();
      if (kb + 1 < nkb) convert(kb + 1, fast_next);
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 64; ++i) reg_fence(acc[i]);
    } else {  // per group G and quarter q of the warpgroup's 128 columns: d = 2 k16 wgmmas (m64n32) from 0
      if (kb + 2 < nkb) load(kb + 2);
      cp_commit();
      const int t = x & 3;
      const uint32_t S = smem + OFF_A + (kb % A_STAGES) * A_STAGE + A_S;
#pragma unroll 1
      for (int G = 0; G < 4; ++G)
#pragma unroll 1
        for (int q = 0; q < 4; ++q) {
          float d[16];
#pragma unroll
          for (int i = 0; i < 16; ++i) d[i] = 0.0f;
          wgmma_fence();
          wgmma_m64n32k16_f16(d, desc_a(kb, 2 * G), desc_b(kb, h, 2 * G) + q * (4096 >> 4), 0);
          wgmma_m64n32k16_f16(d, desc_a(kb, 2 * G + 1), desc_b(kb, h, 2 * G + 1) + q * (4096 >> 4), 1);
          wgmma_commit();
          wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < 16; ++i) reg_fence(d[i]);
          // d[4 j + v0 + 2 v1]: column 32 q + 8 j + 2 t + v0 (the B row whose scale applies)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int v0 = 0; v0 < 2; ++v0) {
              const uint32_t w = lds32(S + 4 * staged_row<KIND>(h, 32 * q + 8 * j + 2 * t + v0));
              const float sc = __uint_as_float((w >> (8 * G) << 23) & 0x7F800000u);  // e8m0_fast<G>
#pragma unroll
              for (int jj = 0; jj < 4; ++jj)
#pragma unroll
                for (int v1 = 0; v1 < 2; ++v1) {
                  if (jj != q) continue;  // (acc indices must stay compile-time constants)
                  float& a = acc[4 * (4 * jj + j) + v0 + 2 * v1];
                  a = __fmaf_rn(d[4 * j + v0 + 2 * v1], sc, a);
                }
            }
        }
      if (kb + 1 < nkb) convert(kb + 1, fast_next);
    }
    fast = fast_next;
  }

  // epilogue: rows 16 warp + g + 8 v1, columns 8 j + 2 t + v0 of the warpgroup's B rows, times the last block's
  // activation scale
  const int x = thread_index(), h = x >> 7, warp = (x >> 5) & 3, g = (x & 31) >> 2, t = x & 3;
  const int tm0 = tile[0], tcnt = tile[1];
#pragma unroll
  for (int v1 = 0; v1 < 2; ++v1) {
    const int m = 16 * warp + g + 8 * v1;
    if (m >= tcnt) continue;
    const int64_t row = tm0 + m;
    const float sl = A.sa[int64_t(tile[2 + m]) * nkb + nkb - 1];
    auto out = [&](int j, int v0) {
      const float v = __fmul_rn(acc[4 * j + v0 + 2 * v1], sl);
      return A.out_bf16 ? round_bf16(v) : v;
    };
    if constexpr (KIND == kW13) {
      const float rw = A.row_w[row];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float v[2];
#pragma unroll
        for (int v0 = 0; v0 < 2; ++v0) v[v0] = swiglu_val(out(j, v0), out(j + 8, v0), A.limit, true, rw, A.bf16);
        *reinterpret_cast<float2*>(A.y + row * A.ldy + n0 + 64 * h + 8 * j + 2 * t) = make_float2(v[0], v[1]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<float2*>(A.y + row * A.ldy + n0 + 128 * h + 8 * j + 2 * t) =
            make_float2(out(j, 0), out(j, 1));
    }
  }
#else
  __trap();  // wgmma_ok() keeps the launcher off this path
#endif
}

}  // namespace

int64_t moe_wgmma_calls() { return g_calls.load(); }

namespace moe_tc {

bool wgmma_ok() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  static std::atomic<int> cached[64] = {};  // 0 unknown, 1 yes, 2 no
  int c = cached[dev].load(std::memory_order_relaxed);
  if (c == 0) {
    // compute capability 9.0 exactly (wgmma is sm_90a's), the binary's code for this device is the sm_90a body (its
    // static shared memory is there only: an sm_90 or a PTX-JIT build of another architecture has none), and the
    // shared memory is granted
    cudaFuncAttributes fa{};
    int major = 0, minor = 0;
    bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
              major == 9 && minor == 0 && cudaFuncGetAttributes(&fa, moe_wgmma_kernel<kW2>) == cudaSuccess &&
              fa.binaryVersion == 90 && fa.sharedSizeBytes > 0;
    auto smem = [](auto kernel) {  // (and all of the unified L1 as shared memory)
      return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_DYN) == cudaSuccess &&
             cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared) == cudaSuccess;
    };
    ok = ok && smem(moe_wgmma_kernel<kW13>) && smem(moe_wgmma_kernel<kW2>);
    (void)cudaGetLastError();  // (a refusal above is an answer, not an error of the next launch)
    c = ok ? 1 : 2;
    cached[dev].store(c, std::memory_order_relaxed);
  }
  return c == 1;
}

void wgmma_launch(bool w13, const BigArgs& A, dim3 grid, cudaStream_t stream) {
  if (w13) moe_wgmma_kernel<kW13><<<grid, WG_THREADS, SMEM_DYN, stream>>>(A);
  else moe_wgmma_kernel<kW2><<<grid, WG_THREADS, SMEM_DYN, stream>>>(A);
  g_calls.fetch_add(1);
}

}  // namespace moe_tc
}  // namespace dsv4::cuda
