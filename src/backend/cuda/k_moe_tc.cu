// Prefill MoE on f16 tensor cores (mma.sync m16n8k16, fp32 accumulation), FP4 experts converted inside the kernel,
// fast (Q) mode only: the expert segments of more than kMoeSmallMax rows (moe_launch_both in k_gemm.cu; the smaller
// ones run moe_tc_small_kernel there).
//
// Values. The activations are act_quant's e4m3 codes (exact in f16) with a power-of-two scale sa per row and
// 128-column block. A weight is its E2M1 value times its E8M0 scale 2^(e - 127) per 32 columns; the kernel folds the
// scale into the f16 weight, which is exact for e in [104, 128] (the smallest value 0.5 x 2^-23 = 2^-24 is f16's
// least subnormal, the largest 6 x 2^1 = 12). Every product of two f16 values is exact in fp32.
//
// Summation order (not the CPU's; the fast mode's contract is the CPU within its tolerance). Per output one fp32
// accumulator acc, kept in units of the current block's activation scale; per 128-column block kb, ascending:
//   acc = acc * (sa[kb - 1] / sa[kb])       (a power of two: exact while acc stays in fp32's normal range; act_quant
//                                             scales are >= 2^-22)
//   fast block (every E8M0 code of the block's 4 groups in [104, 128] for all 32 weight rows of the warp):
//     8 chained mmas onto acc (k16 steps 0..7, the scaled f16 weights): acc += the block's 128 products, summed in
//     the tensor core's fp32 accumulation
//   other block (rare: codes 0 and 255, scales outside f16's exact range):
//     per 32-column group G = 0..3: d = the group's 32 products with the bare E2M1 values (2 mmas from 0), then
//     acc = fma(d, 2^(e - 127), acc) with code 0 taken as 0 and code 255 as infinity (as moe_tc_small_kernel:
//     such outputs are non-finite)
// and the output is acc * sa[last block] (then bf16 if out_bf16; kW13: SwiGLU of the w1 and w3 outputs).
// Within a block the k16 steps take the columns in a permuted order, the same for activations and weights: step
// 2 G + h holds, for lane quad t, columns 32 G + 8 t + {4 h, 4 h + 2 | 4 h + 1, 4 h + 3} (b0 | b1 of the mma; see
// fp4x8_as_f16x2 and moe_a16_kernel). A row's result does not depend on the other rows of its tile or of the call.
//
// Per call: moe_a16_kernel turns the activation codes into f16 in that order ([rows, K] f16) and writes the
// per-block ratios sa[kb - 1] / sa[kb] ([rows, K / 128] fp32, 1 for kb = 0). Then moe_tc_big_kernel: a block = 256
// threads (8 warps) for one 64-row M tile of big_tile_start x 256 weight rows (kW13: rows n0 .. n0 + 127 of w1 and the
// same rows of w3, so SwiGLU runs in the epilogue; kW2: 256 rows of w2), K in blocks of 128 through a 3-stage
// cp.async ring (34,048 bytes a stage: two blocks per SM). Warp w takes all 64 rows x 32 weight rows (4 m16 x 4 n8
// tiles): it converts each FP4 weight of its rows once per block (in registers, no shared-memory round trip) and each
// A fragment (ldmatrix) feeds 4 mmas, each B fragment 4. Shared memory is swizzled so that every ldmatrix, weight
// word read and cp.async is free of bank conflicts. No host round trip: the kernel finds its expert and rows on the
// device, so the path also runs inside recorded steps. Rows past a segment's end repeat its last row and are not
// stored. On compute capability 9.0 with the sm_90a build the launcher runs the same products on wgmma instead
// (k_moe_wgmma.cu; MoeBigKernel::mma keeps this kernel). Without a GPU: tools/device/moe_big_layout_check.py replays
// the index arithmetic on the host (layouts, fragments, bank conflicts), tools/device/moe_big_sass_count.py counts
// the instructions per k-block.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "backend/cuda/device_async_copy.cuh"
#include "backend/cuda/device_fp8_mma.cuh"
#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/device_swiglu.cuh"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe_tc_common.cuh"

namespace dsv4::cuda {
namespace {

using namespace moe_tc;

constexpr int BT_THREADS = 256, BT_M = gemm_internal::kMoeTileM, BT_N = 256, BT_KT = 128, BT_STAGES = 3;
static_assert(BT_M == 64, "the loaders assume 64-row M tiles");

// A stage of the ring (bytes):
//   A  [64 rows][128 f16]: the 16-byte chunk c of row r at chunk c ^ a_swizzle(r)
//   B  [256 weight rows][64 FP4 bytes]: group G (16 bytes) of row r at chunk G ^ ((r >> 1) & 3)
//   S  [256] the rows' E8M0 words (the block's 4 groups)
//   R  [64] fp32 ratios sa[kb - 1] / sa[kb]: row 8 q + g at 8 g + q (a lane's 8 rows in two 16-byte reads)
constexpr int ST_A = 0, ST_B = ST_A + BT_M * 256, ST_S = ST_B + BT_N * 64, ST_R = ST_S + BT_N * 4;
constexpr int ST_BYTES = ST_R + BT_M * 4;       // 34,048
constexpr int BT_SMEM = BT_STAGES * ST_BYTES;   // 102,144
constexpr int BT_BASES = 304;  // after the ring: 4 weight / scale row pointers, first row, row count, 64 rows
static_assert(ST_BYTES % 128 == 0, "stages must stay 128-byte aligned (swizzle patterns, 16-byte copies)");

// The A swizzle: distinct for 8 consecutive rows (ldmatrix's 8 rows of one chunk hit 8 bank groups), and rows 2 i,
// 2 i + 1 differ in bit 2 (a copy instruction's 8 lanes write chunks 4 c .. 4 c + 3 of two rows: 8 bank groups).
__device__ __forceinline__ int a_swizzle(int r) { return (r & 7) ^ ((r & 1) << 2); }

std::atomic<int64_t> g_calls{0};

// The f16 values of the e4m3 codes of q (exact), as 32-bit f16 pairs: per 32 columns (16 words) word 4 p + t holds
// pair p of columns 8 t .. 8 t + 7: columns 0, 2 | 1, 3 | 4, 6 | 5, 7 (p = 0..3; the k positions of lane quad t's A
// fragments: step 2 G + h of the kernel reads words 8 h .. 8 h + 7 of group G). A thread per 8 columns; the first
// thread of each 128 columns also writes the block's ratio sa[kb - 1] / sa[kb] (exact for powers of two).
__global__ void moe_a16_kernel(const float* q, const float* sa, int64_t n8, int64_t k8, uint32_t* out, float* ratio) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const float4 v0 = __ldg(reinterpret_cast<const float4*>(q) + 2 * i);
  const float4 v1 = __ldg(reinterpret_cast<const float4*>(q) + 2 * i + 1);
  auto cvt = [](float a, float b) {
    const __nv_fp8x2_storage_t e = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(e, __NV_E4M3);
    return uint32_t(h.x) | (uint32_t(h.y) << 16);
  };
  uint32_t* o = out + (i >> 2) * 16 + (i & 3);
  o[0] = cvt(v0.x, v0.z), o[4] = cvt(v0.y, v0.w), o[8] = cvt(v1.x, v1.z), o[12] = cvt(v1.y, v1.w);
  if ((i & 15) == 0) {  // (k8 is a multiple of 16)
    const int64_t row = i / k8, kb = (i - row * k8) >> 4, nkb = k8 >> 4;
    const float* s = sa + row * nkb;
    ratio[row * nkb + kb] = kb == 0 ? 1.0f : __fdiv_rn(s[kb - 1], s[kb]);
  }
}

// First staged weight row of n8 tile j (0..3) of warp w: kW13 tiles 0, 1 are w1 rows 16 w .. 16 w + 15 and tiles 2,
// 3 the same rows of w3 (staged from row 128 on); kW2 tiles 0..3 are rows 32 w .. 32 w + 31.
template <int KIND>
__device__ __forceinline__ int b_row(int w, int j) {
  if constexpr (KIND == kW13) return (j >> 1) * 128 + 16 * w + 8 * (j & 1);
  return 32 * w + 8 * j;
}


template <int KIND>
__global__ void __launch_bounds__(BT_THREADS, 2) moe_tc_big_kernel(const BigArgs A) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  extern __shared__ __align__(128) uint8_t bt_smem[];
  const int tid = threadIdx.x;
  const int64_t slot = blockIdx.y, E = A.n_experts;
  if (slot >= A.big_tile_start[E]) return;
  int64_t lo = 0, hi = E - 1;  // the expert: the last e with big_tile_start[e] <= slot
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (A.big_tile_start[mid] <= slot) lo = mid; else hi = mid - 1;
  }
  const int64_t e = lo;
  const int m0 = A.seg_start[e] + int(slot - A.big_tile_start[e]) * BT_M;  // (rows < 2^16: kMaxPairs)
  const int mcnt = min(BT_M, A.seg_start[e + 1] - m0);
  if (mcnt <= 0) return;
  const int64_t K = A.K, rb = K / 2, sb = K / 32;
  const int nkb = int(K / BT_KT);
  const int64_t n0 = int64_t(blockIdx.x) * (KIND == kW13 ? BT_N / 2 : BT_N);
  const WeightView& W0 = KIND == kW13 ? A.table[e].w1 : A.table[e].w2;
  const WeightView& W1 = KIND == kW13 ? A.table[e].w3 : A.table[e].w2;
  auto src_row = [&](int r) {  // activation row of tile row r (rows past the segment repeat its last row)
    const int64_t sr = int64_t(m0) + min(r, mcnt - 1);
    return KIND == kW13 ? int64_t(A.row_tok[sr]) : sr;
  };

  // ---- this thread's copies per stage (r = tid / 4, q = tid % 4)
  // A: chunks 4 c + q of row r (c = 0..3; 16 bytes each). B: group q of staged rows r + 64 c (kW13: c = 0, 1 w1,
  // c = 2, 3 w3). S: the E8M0 word of staged row tid. R: (tid < 64) the ratio of row tid.
  // The block's weight and scale row bases (staged rows 0 and 128), first row, row count and activation rows wait in
  // shared memory (after the ring): the loader recomputes its addresses from them, keeping no registers across the
  // loop.
  const uint8_t** bases = reinterpret_cast<const uint8_t**>(bt_smem + BT_SMEM);
  int* tile = reinterpret_cast<int*>(bt_smem + BT_SMEM + 32);  // m0, mcnt, then the activation row of each tile row
  if (tid == 0) {
    bases[0] = W0.w + n0 * rb;
    bases[1] = KIND == kW13 ? W1.w + n0 * rb : W0.w + (n0 + 128) * rb;
    bases[2] = W0.scale + n0 * sb;
    bases[3] = KIND == kW13 ? W1.scale + n0 * sb : W0.scale + (n0 + 128) * sb;
    tile[0] = m0, tile[1] = mcnt;
  }
  if (tid < BT_M) tile[2 + tid] = int(src_row(tid));
  __syncthreads();
  const uint32_t smem = smem_addr(bt_smem);

  auto load = [&](int st, int kb) {
    const int tid = thread_index();  // (read again: its addresses are recomputed, not kept across the loop)
    const int r = tid >> 2, q = tid & 3;
    const uint8_t* b0 = bases[0];
    const uint8_t* b1 = bases[1];
    const uint8_t* s0 = bases[2 + (tid >> 7)];
    const int a_row = tile[2 + r], r_row = tile[2 + (tid & 63)];
    const uint32_t S = smem + st * ST_BYTES;
    // A: chunk 4 c + q of row r (16 bytes at 64 c + 16 q of the row's 256)
    const uint8_t* a = A.act + (int64_t(a_row) * K + kb * BT_KT) * 2 + 16 * q;
    const uint32_t ad = S + ST_A + r * 256, ax = 16 * (q ^ a_swizzle(r));
#pragma unroll
    for (int c = 0; c < 4; ++c) cp16(ad + ((64 * c) ^ ax), a + 64 * c);
    // B: group q of staged rows r + 64 c
    const int64_t bo = r * rb + 16 * q + kb * 64;
    const uint32_t bd = S + ST_B + r * 64 + 16 * (q ^ ((r >> 1) & 3));
    cp16(bd, b0 + bo);
    cp16(bd + 4096, b0 + bo + 64 * rb);
    cp16(bd + 8192, b1 + bo);
    cp16(bd + 12288, b1 + bo + 64 * rb);
    cp4(S + ST_S + 4 * tid, s0 + (tid & 127) * sb + kb * 4);
    if (tid < BT_M) cp4(S + ST_R + 4 * ((tid & 7) * 8 + (tid >> 3)), A.ratio + int64_t(r_row) * nkb + kb);
  };

  // ---- this lane's reads. Registers are scarce (acc alone takes 64): the lane's indices and offsets are recomputed
  // per k-block from thread_index() instead of being kept (ptxas would spill them).
  // A (ldmatrix x4 of a 16 x 16 f16 tile): lane l gives row (l & 7) + 8 ((l >> 3) & 1), logical chunk 2 s + (l >> 4)
  // of step s, stored at chunk (2 s + (l >> 4)) ^ a_swizzle(l & 7) = 2 s ^ ax (ax < 8); steps 4..7 are steps 0..3 +
  // 128 bytes.
  // B: weight row b_row + g, word t of group G at byte b_lane + ((16 G) ^ gx16) of the row block.
  struct Lane {
    int warp, g, t;
    uint32_t a_row, ax16, b_lane, gx16;
    __device__ __forceinline__ uint32_t a(int s) const { return a_row + ((32 * (s & 3)) ^ ax16) + 128 * (s >> 2); }
    __device__ __forceinline__ uint32_t b(int G) const { return b_lane + ((16 * G) ^ gx16); }
    __device__ __forceinline__ int row(int j) const { return b_row<KIND>(warp, j); }  // n8 tile j's first row
  };
  auto lane_now = [] {
    const int x = thread_index(), l = x & 31;
    return Lane{x >> 5, l >> 2, l & 3, uint32_t(ST_A + ((l & 7) + 8 * ((l >> 3) & 1)) * 256),
                uint32_t(16 * ((l >> 4) ^ a_swizzle(l & 7))), uint32_t(ST_B + (l >> 2) * 64 + 4 * (l & 3)),
                uint32_t(16 * ((l >> 3) & 3))};
  };

  float acc[4][4][4];  // [m16 tile i][n8 tile j][fragment element]: rows 16 i + g (+ 8 for 2, 3), cols 2 t (+ 1)
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;

#pragma unroll
  for (int s = 0; s < BT_STAGES - 1; ++s) {
    if (s < nkb) load(s, s);
    cp_commit();
  }
  for (int kb = 0; kb < nkb; ++kb) {
    cp_wait<BT_STAGES - 2>();
    __syncthreads();  // stage kb has landed for every thread; stage kb - 1 is free again
    if (kb + BT_STAGES - 1 < nkb) load((kb + BT_STAGES - 1) % BT_STAGES, kb + BT_STAGES - 1);
    cp_commit();
    const int st = kb % BT_STAGES;
    const uint32_t S = smem + st * ST_BYTES;
    const uint8_t* Sp = bt_smem + st * ST_BYTES;
    const uint32_t* SW = reinterpret_cast<const uint32_t*>(Sp + ST_S);
    if (kb > 0) {  // acc from units of sa[kb - 1] to units of sa[kb]
      const int g = lane_now().g;
      const float4 r0 = *reinterpret_cast<const float4*>(Sp + ST_R + 32 * g);
      const float4 r1 = *reinterpret_cast<const float4*>(Sp + ST_R + 32 * g + 16);
      const float r[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};  // rows g + 8 q
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[i][j][c] = __fmul_rn(acc[i][j][c], r[2 * i + (c >> 1)]);
    }
    // the fast path when the warp's 32 weight rows have every code of this block in range (lane (g, t) checks row
    // g of n8 tile t)
    const bool fast = [&] {
      const Lane L = lane_now();
      return __all_sync(0xFFFFFFFFu, e8m0_word_fast(SW[L.row(L.t) + L.g]));
    }();
    if (fast) {
      const Lane L = lane_now();
      const int g = L.g;
      uint32_t f16hi[4];  // n8 tile j: row g's 4 scale factors (e8m0_word_f16_hi)
#pragma unroll
      for (int j = 0; j < 4; ++j) f16hi[j] = e8m0_word_f16_hi(SW[L.row(j) + g]);
#pragma unroll
      for (int G = 0; G < 4; ++G) {
        uint32_t b[4][4];  // n8 tile j: steps 2 G (b[j][0], b[j][1]) and 2 G + 1 (b[j][2], b[j][3])
        const uint32_t bg = L.b(G);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t w = *reinterpret_cast<const uint32_t*>(Sp + bg + 64 * L.row(j));
          const uint32_t f = G == 0 ? f16_factor<0>(f16hi[j]) : G == 1 ? f16_factor<1>(f16hi[j])
                           : G == 2 ? f16_factor<2>(f16hi[j]) : f16_factor<3>(f16hi[j]);
          fp4x8_as_f16x2(w, f, b[j]);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int s = 2 * G + h;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            uint32_t a[4];
            ldsm_x4(S + L.a(s) + 4096 * i, a);
#pragma unroll
            for (int j = 0; j < 4; ++j) mma_f16_acc(a, b[j][2 * h], b[j][2 * h + 1], acc[i][j]);
          }
        }
      }
    } else {  // per group: 2 mmas from 0 on the bare E2M1 values, then times the group's scale into acc (two n8
              // tiles at a time: fewer registers than the fast path, the A fragments read twice)
      const Lane L = lane_now();
      const int t = L.t;
#pragma unroll
      for (int G = 0; G < 4; ++G)
#pragma unroll
        for (int jh = 0; jh < 4; jh += 2) {
          uint32_t b[2][4];
          float sc[2][2];  // group G's scales of weight rows 2 t, 2 t + 1 of the n8 tiles (the output columns)
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            fp4x8_as_f16x2(*reinterpret_cast<const uint32_t*>(Sp + L.b(G) + 64 * L.row(jh + jj)), kF16Two14, b[jj]);
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const uint32_t w = SW[L.row(jh + jj) + 2 * t + c];
              sc[jj][c] = G == 0 ? e8m0_fast<0>(w) : G == 1 ? e8m0_fast<1>(w) : G == 2 ? e8m0_fast<2>(w)
                                                                                        : e8m0_fast<3>(w);
            }
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            uint32_t a0[4], a1[4];
            ldsm_x4(S + L.a(2 * G) + 4096 * i, a0);
            ldsm_x4(S + L.a(2 * G + 1) + 4096 * i, a1);
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
              float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
              mma_f16_acc(a0, b[jj][0], b[jj][1], d);
              mma_f16_acc(a1, b[jj][2], b[jj][3], d);
#pragma unroll
              for (int c = 0; c < 4; ++c) acc[i][jh + jj][c] = __fmaf_rn(d[c], sc[jj][c & 1], acc[i][jh + jj][c]);
            }
          }
        }
    }
  }
  cp_wait<0>();

  // epilogue: rows 16 i + g + 8 h, columns 2 t, 2 t + 1 of each n8 tile, times the last block's activation scale
  const int tm0 = tile[0], tcnt = tile[1];
  const Lane L = lane_now();
  const int warp = L.warp, g = L.g, t = L.t;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = 16 * i + g + 8 * h;
      if (m >= tcnt) continue;
      const int64_t row = tm0 + m;
      const float sl = A.sa[int64_t(tile[2 + m]) * nkb + nkb - 1];
      auto out = [&](int j, int c) {
        const float v = __fmul_rn(acc[i][j][2 * h + c], sl);
        return A.out_bf16 ? round_bf16(v) : v;
      };
      if constexpr (KIND == kW13) {
        const float rw = A.row_w[row];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          float v[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) v[c] = swiglu_val(out(jj, c), out(jj + 2, c), A.limit, true, rw, A.bf16);
          *reinterpret_cast<float2*>(A.y + row * A.ldy + n0 + 16 * warp + 8 * jj + 2 * t) = make_float2(v[0], v[1]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          *reinterpret_cast<float2*>(A.y + row * A.ldy + n0 + 32 * warp + 8 * j + 2 * t) =
              make_float2(out(j, 0), out(j, 1));
      }
    }
#else
  __trap();  // moe_tc_big_ok() keeps the launchers off this path
#endif
}

// Whether the device and the binary run moe_tc_big_kernel (the e4m3 conversions of moe_a16_kernel: sm_89+) with its
// shared memory; per device.
bool device_ok() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  static int cached[64] = {};  // 0 unknown, 1 yes, 2 no
  if (cached[dev] == 0) {
    cudaFuncAttributes fa{};
    int major = 0, minor = 0;
    bool ok = cudaFuncGetAttributes(&fa, moe_tc_big_kernel<kW2>) == cudaSuccess &&
              cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
              fa.binaryVersion >= 89 && major * 10 + minor >= 89;
    auto smem = [](auto kernel) {  // (and all of the unified L1 as shared memory: two blocks per SM)
      return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, BT_SMEM + BT_BASES) ==
                 cudaSuccess &&
             cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared) == cudaSuccess;
    };
    ok = ok && smem(moe_tc_big_kernel<kW13>) && smem(moe_tc_big_kernel<kW2>);
    cudaGetLastError();  // (a refusal above is an answer, not an error of the next launch)
    cached[dev] = ok ? 1 : 2;
  }
  return cached[dev] == 1;
}

// Scratch of a call: the f16 activations (max(n_tok D, P I) elements), then the ratios (one per 128 of them).
size_t a16_bytes(int64_t n_tok, int64_t P, int64_t D, int64_t I) {
  return (size_t(std::max(n_tok * D, P * I)) * 2 + 255) & ~size_t(255);
}
size_t ratio_bytes(int64_t n_tok, int64_t P, int64_t D, int64_t I) {
  return (size_t(std::max(n_tok * D, P * I) / BT_KT) * 4 + 255) & ~size_t(255);
}

}  // namespace

int64_t moe_tc_big_calls() { return g_calls.load(); }

namespace gemm_internal {

bool moe_tc_big_ok(const MoeGemmArgs& g) {
  if (!g.quant || g.fmt != GemmFormat::fp4 || deterministic() || gemm_path() != GemmPath::auto_) return false;
  if (g.d_model % BT_N != 0 || g.inter % (BT_N / 2) != 0 || g.d_model % BT_KT != 0 || g.inter % BT_KT != 0)
    return false;
  if (!g.w16_ok || g.n_rows_bound <= kMoeSmallMax) return false;
  return device_ok();
}

bool moe_tc_big_wgmma_ok() { return moe_big_kernel() == MoeBigKernel::auto_ && wgmma_ok(); }

size_t moe_tc_big_scratch_bytes(GemmFormat fmt, bool quant, int64_t n_tok, int64_t P, int64_t D, int64_t I) {
  if (!quant || fmt != GemmFormat::fp4 || P <= kMoeSmallMax) return 0;
  return a16_bytes(n_tok, P, D, I) + ratio_bytes(n_tok, P, D, I);
}

void moe_tc_big(bool w13, const MoeGemmArgs& g, const float* a, const float* sa, float* y, int64_t ldy, float limit,
                bool bf16, cudaStream_t stream) {
  const int64_t K = w13 ? g.d_model : g.inter, rows = w13 ? g.n_tok : g.n_rows_bound;
  const int64_t n8 = rows * K / 8;
  if (n8 <= 0) return;
  uint8_t* ws = static_cast<uint8_t*>(g.a8_ws);
  float* ratio = reinterpret_cast<float*>(ws + a16_bytes(g.n_tok, g.n_rows_bound, g.d_model, g.inter));
  moe_a16_kernel<<<unsigned((n8 + 255) / 256), 256, 0, stream>>>(a, sa, n8, K / 8, reinterpret_cast<uint32_t*>(ws),
                                                                   ratio);
  BigArgs A;
  A.table = g.table;
  A.n_experts = g.n_experts;
  A.seg_start = g.seg_start;
  A.big_tile_start = g.big_tile_start;
  A.row_tok = w13 ? g.row_tok : nullptr;
  A.act = ws;
  A.ratio = ratio;
  A.sa = sa;
  A.K = K;
  A.y = y;
  A.ldy = ldy;
  A.row_w = g.row_w;
  A.limit = limit;
  A.out_bf16 = g.out_bf16;
  A.bf16 = bf16;
  // M tiles: at most ceil(P / 64) + P / (kMoeSmallMax + 1) (as the tiled kernel's schedule); unused ones exit
  const int64_t P = g.n_rows_bound;
  const int64_t slots = (P + BT_M - 1) / BT_M + std::min<int64_t>(g.n_experts, P / (kMoeSmallMax + 1));
  const dim3 grid(unsigned(w13 ? g.inter / (BT_N / 2) : g.d_model / BT_N), unsigned(slots));
  if (moe_tc_big_wgmma_ok()) wgmma_launch(w13, A, grid, stream);  // (the same grid: k_moe_wgmma.cu)
  else if (w13) moe_tc_big_kernel<kW13><<<grid, BT_THREADS, BT_SMEM + BT_BASES, stream>>>(A);
  else moe_tc_big_kernel<kW2><<<grid, BT_THREADS, BT_SMEM + BT_BASES, stream>>>(A);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) fail_msg(std::string("moe (f16 tensor cores, prefill): ") + cudaGetErrorString(err));
  g_calls.fetch_add(1);
}

}  // namespace gemm_internal
}  // namespace dsv4::cuda
