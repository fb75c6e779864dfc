// Prefill MoE on FP8 tensor cores, FP4 experts dequantized inside the kernel (fast (Q) mode): the expert segments of
// more than kMoeSmallMax rows (moe_launch_both in k_gemm.cu; the smaller ones run moe_tc_small_kernel there).
//
// Products as moe_tc_small_kernel's: per 32-column scale group of the FP4 weights one mma.sync m16n8k32 e4m3 x e4m3
// -> fp32 (weight nibbles placed as e4m3 bytes: the E2M1 value times 2^-6), each result times its E8M0 scale (a
// power of two, exact) summed over the 4 groups of a 128-column block, then times the activation's block scale
// (x 2^6) into the fp32 accumulator. Every product is exact; the sums differ from the CPU's order by fp32 rounding
// (the fast mode's tolerance). A row's result does not depend on the other rows of its tile or of the call.
//
// sm_90 has no FP8 mma.sync: ptxas runs each as two f16 mmas (m16n8k16) over the codes converted to f16, then + 0
// (tc_mma_f16_pair, device_fp8_mma.cuh). The kernel issues those f16 mmas itself (F16A), so the activations are
// converted once per call instead of per fragment read, and the weights go FP4 -> e4m3 -> f16 once per fragment:
// the same mmas on the same values as the FP8 mma's form (kept for the test that pins the two bitwise:
// set_moe_tc_big_e4m3_for_test), the + 0 only in k-blocks where it can matter (see p in the kernel).
//
// Per call: the activation codes (fp32 code values of act_quant) become f16 values of their e4m3 codes once
// (moe_a16_kernel: [rows, K] in the order two ldmatrix read the f16 mmas' A fragments in; the e4m3 form:
// moe_a8_kernel's bytes, per 8 columns the 4 even ones then the 4 odd ones, the order fp4_as_e4m3 splits the
// nibbles in), then moe_tc_big_kernel: a block = 512 threads (16 warps) for one 64-row M tile of big_tile_start x
// 256 weight rows (kW13: rows n0 .. n0 + 127 of w1 and the same rows of w3, so SwiGLU runs in the epilogue; kW2: 256
// rows of w2), K in blocks of 128 through a 4-stage cp.async ring in shared memory (activations, raw FP4 bytes, the
// E8M0 scale words and the activations' block scales: 39,168 bytes a stage). Warp w takes all 64 rows x 16 weight
// rows (4 x 2 mma tiles: each converted weight fragment and decoded scale serves 4 m16 tiles, and the registers
// allow 16 warps per SM). The E8M0 scales skip the special codes (e8m0_fast);
// staged rows are padded (272 bytes of f16: the 8 rows of an ldmatrix phase on 8 bank groups; 160 of e4m3, 80 of
// FP4) so the fragment reads are free of bank conflicts. No host round trip: the kernel
// finds its expert and rows on the device, so the path also runs inside recorded decode steps.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backend/cuda/device_async_copy.cuh"
#include "backend/cuda/device_fp8_mma.cuh"
#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/device_swiglu.cuh"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

constexpr int kW13 = 0, kW2 = 1;
constexpr int BT_THREADS = 512, BT_M = gemm_internal::kMoeTileM, BT_N = 256, BT_KT = 128, BT_STAGES = 4;
constexpr int BT_LDB = 80;  // staged weight row bytes: 64 FP4 bytes + padding
constexpr int BT_B = BT_N * BT_LDB, BT_SB = BT_N * 4, BT_SA = BT_M * 4;
static_assert(BT_M == 64, "the loaders assume 64-row M tiles");

// A stage in shared memory: the activations (F16A: 128 f16 a row, else 128 e4m3 bytes), the weights' FP4 bytes,
// their E8M0 words, the activations' block scales.
template <bool F16A>
struct Stage {
  static constexpr int ab = F16A ? 2 : 1;           // bytes of a staged activation code
  static constexpr int lda = F16A ? 272 : 160;      // staged row bytes: 256 / 128 + padding
  static constexpr int a = BT_M * lda;                 // offsets of the parts
  static constexpr int sb = a + BT_B, sa = sb + BT_SB, bytes = sa + BT_SA;  // 39,168 / 32,000 bytes
  static constexpr int smem = BT_STAGES * bytes;
  static_assert(bytes % 16 == 0, "stages must stay 16-byte aligned");
};

std::atomic<int64_t> g_calls{0};
std::atomic<bool> g_e4m3_for_test{false};

struct BigArgs {
  const ExpertView* table = nullptr;  // device [E]
  int64_t n_experts = 0;
  const int32_t* seg_start = nullptr;
  const int32_t* big_tile_start = nullptr;
  const int32_t* row_tok = nullptr;  // kW13: token of each sorted row (the activation row); kW2: nullptr
  const uint8_t* act = nullptr;      // activation codes [*, K] as f16 (F16A) or e4m3 bytes, permuted (file comment)
  const float* sa = nullptr;         // activation scales [*, K / 128]
  int64_t K = 0;
  float* y = nullptr;                // kW13: h [rows, inter]; kW2: o [rows, d_model]
  int64_t ldy = 0;
  const float* row_w = nullptr;
  float limit = 0.0f;
  bool out_bf16 = false, bf16 = false;
};

// out[r, 8 j ..] = e4m3 bytes of q[r, 8 j .. 8 j + 7] (exact code values): columns 0, 2, 4, 6, then 1, 3, 5, 7.
__global__ void moe_a8_kernel(const float* q, int64_t n8, uint8_t* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const float4 v0 = __ldg(reinterpret_cast<const float4*>(q) + 2 * i);
  const float4 v1 = __ldg(reinterpret_cast<const float4*>(q) + 2 * i + 1);
  auto cvt = [](float a, float b) {
    return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
  };
  const uint32_t ev = cvt(v0.x, v0.z) | (cvt(v1.x, v1.z) << 16);
  const uint32_t od = cvt(v0.y, v0.w) | (cvt(v1.y, v1.w) << 16);
  reinterpret_cast<uint2*>(out)[i] = make_uint2(ev, od);
}

// The f16 values of the e4m3 codes of q (exact), as 32-bit f16 pairs: per 32 columns (16 words) word 4 p + t holds
// pair p of columns 8 t .. 8 t + 7: columns 0, 2 | 1, 3 | 4, 6 | 5, 7 (p = 0..3; the k positions of thread t's A
// fragments in the two f16 mmas, see moe_tc_big_kernel). A thread per 8 columns.
__global__ void moe_a16_kernel(const float* q, int64_t n8, uint32_t* out) {
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
}

// Staged row of n8 tile j of warp w: kW13 tile 0 is w1 rows 8 w .. 8 w + 7 and tile 1 the same rows of w3 (staged
// from row 128 on); kW2 tiles 0, 1 are rows 16 w .. 16 w + 15.
template <int KIND>
__device__ __forceinline__ int b_row(int warp, int j) {
  if constexpr (KIND == kW13) return j == 0 ? 8 * warp : 128 + 8 * warp;
  return 16 * warp + 8 * j;
}

// Byte S of four E8M0 scales as a float 2^(e - 127), without e8m0_to_float's special codes: e = 0 gives 0 (not
// 2^-127: a difference below 2^-100 of the products), e = 255 gives infinity (not NaN: still non-finite).
template <int S>
__device__ __forceinline__ float e8m0_fast(uint32_t w) {
  const uint32_t e = S <= 2 ? w << (23 - 8 * S) : w >> (8 * S - 23);
  return __uint_as_float(e & 0x7F800000u);
}

template <int KIND, bool F16A>
__global__ void __launch_bounds__(BT_THREADS, 1) moe_tc_big_kernel(const BigArgs A) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  using St = Stage<F16A>;
  extern __shared__ __align__(16) uint8_t bt_smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wn = warp;  // warp tile: all 64 rows x the n8 tiles b_row(wn, 0..1)
  const int64_t slot = blockIdx.y, E = A.n_experts;
  if (slot >= A.big_tile_start[E]) return;
  int64_t lo = 0, hi = E - 1;  // the expert: the last e with big_tile_start[e] <= slot
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (A.big_tile_start[mid] <= slot) lo = mid; else hi = mid - 1;
  }
  const int64_t e = lo, m0 = A.seg_start[e] + (slot - A.big_tile_start[e]) * BT_M;
  const int mcnt = int(min(int64_t(BT_M), int64_t(A.seg_start[e + 1]) - m0));
  if (mcnt <= 0) return;
  const int64_t K = A.K, nkb = K / BT_KT, rb = K / 2, sb = K / 32;
  const int64_t n0 = int64_t(blockIdx.x) * (KIND == kW13 ? BT_N / 2 : BT_N);
  const WeightView& W0 = KIND == kW13 ? A.table[e].w1 : A.table[e].w2;
  const WeightView& W1 = KIND == kW13 ? A.table[e].w3 : A.table[e].w2;

  // this thread's copies per stage: 16 activation codes of row tid / 8, 2 x 16 weight bytes of staged rows
  // tid / 4 and tid / 4 + 128 (kW13: the w1 row and the w3 row), (tid < 256) the scale word of staged row tid,
  // (tid < 64) an activation scale. Rows past the segment repeat its last row (their results are not stored).
  auto src_row = [&](int r) {
    const int64_t sr = m0 + min(r, mcnt - 1);
    return KIND == kW13 ? int64_t(A.row_tok[sr]) : sr;
  };
  const uint8_t* asrc = A.act + (src_row(tid >> 3) * K + 16 * (tid & 7)) * St::ab;
  auto w_row = [&](int r, bool sc) {  // staged weight row r: its bytes or its scale bytes
    const WeightView& W = (KIND == kW13 && r >= 128) ? W1 : W0;
    const int64_t wr = n0 + (KIND == kW13 ? (r & 127) : r);
    return sc ? W.scale + wr * sb : W.w + wr * rb;
  };
  const uint8_t* bsrc0 = w_row(tid >> 2, false) + 16 * (tid & 3);
  const uint8_t* bsrc1 = w_row((tid >> 2) + 128, false) + 16 * (tid & 3);
  const uint8_t* ssrc = w_row(tid & 255, true);
  const float* sasrc = A.sa + src_row(tid & 63) * nkb;
  // F16A: this lane's ldmatrix row in a 16-row tile: matrix lane / 8 = rows 0..7 / 8..15 (odd), words 0..3 / 4..7
  // (of the 16 of a 32-column group: see moe_a16_kernel)
  const int a_ld = (8 * ((lane >> 3) & 1) + (lane & 7)) * St::lda + 16 * (lane >> 4);

  auto load = [&](int st, int64_t kb) {
    uint8_t* S = bt_smem + st * St::bytes;
    uint8_t* Sa = S + (tid >> 3) * St::lda + 16 * St::ab * (tid & 7);
#pragma unroll
    for (int c = 0; c < St::ab; ++c) cp16(Sa + 16 * c, asrc + kb * BT_KT * St::ab + 16 * c);
    uint8_t* Sw = S + St::a + (tid >> 2) * BT_LDB + 16 * (tid & 3);
    cp16(Sw, bsrc0 + kb * 64);
    cp16(Sw + 128 * BT_LDB, bsrc1 + kb * 64);
    if (tid < BT_N) cp4(S + St::sb + 4 * tid, ssrc + kb * 4);
    if (tid < BT_M) cp4(S + St::sa + 4 * tid, sasrc + kb);
  };

  float tot[4][2][4];  // [m16 tile i][n8 tile j][fragment element]
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) tot[i][j][c] = 0.0f;

#pragma unroll
  for (int s = 0; s < BT_STAGES - 1; ++s) {
    if (s < nkb) load(s, s);
    cp_commit();
  }
  for (int64_t kb = 0; kb < nkb; ++kb) {
    cp_wait<BT_STAGES - 2>();
    __syncthreads();  // stage kb has landed for every thread; stage kb - 1 is free again
    if (kb + BT_STAGES - 1 < nkb) load(int((kb + BT_STAGES - 1) % BT_STAGES), kb + BT_STAGES - 1);
    cp_commit();
    const uint8_t* S = bt_smem + int(kb % BT_STAGES) * St::bytes;
    const uint8_t* As = S;
    const uint8_t* Bs = S + St::a;
    const uint32_t* SB = reinterpret_cast<const uint32_t*>(S + St::sb);
    const float* SA = reinterpret_cast<const float*>(S + St::sa);
    uint32_t sw[2][2];  // E8M0 words (4 groups) of weight rows 2 t, 2 t + 1 of each n8 tile
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) sw[j][c] = SB[b_row<KIND>(wn, j) + 2 * t + c];
    // p: this block's sum over its 4 groups of mma x weight scale. The FP8 mma's f16 form ends in + 0 (tc_mma_f16_pair
    // leaves it out; PLUS0 adds it), which only turns a -0 sum d into +0. Without it the sums are still the FP8
    // form's bit for bit when no weight scale of the block is 0 (E8M0 code 0, e8m0_fast): p starts as d * s0 + 0
    // (an fma onto +0: equal to (0 + d) * s0 unless s0 = 0), so p is never -0 and fma(-0, s, p) == fma(+0, s, p).
    // Blocks with such a code somewhere in the warp's rows (a vote: rare) take the + 0 and the FP8 form's products.
    float p[4][2][4];
    auto groups = [&](auto plus0) {
      constexpr bool PLUS0 = decltype(plus0)::value;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t b[2][4];  // the n8 tiles' weight fragments, f16 pairs (F16A) or e4m3 (b[j][0..1]), converted once
        float sc[2][2];    // for the 4 m16 tiles, and the group's scales of weight rows 2 t, 2 t + 1
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const uint32_t w =
              *reinterpret_cast<const uint32_t*>(Bs + (b_row<KIND>(wn, j) + g) * BT_LDB + 16 * s + 4 * t);
          if constexpr (F16A) fp4_as_f16x2(w, b[j]);
          else fp4_as_e4m3(w, b[j][0], b[j][1]);
#pragma unroll
          for (int c = 0; c < 2; ++c)
            sc[j][c] = s == 0 ? e8m0_fast<0>(sw[j][c]) : s == 1 ? e8m0_fast<1>(sw[j][c])
                     : s == 2 ? e8m0_fast<2>(sw[j][c]) : e8m0_fast<3>(sw[j][c]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          // rows g, g + 8 of m16 tile i, the 8 columns 32 s + 8 t .. of this thread: 4 e4m3 columns of each half of
          // the k32 mma (F16A: their f16 pairs, as the two f16 mmas take them: bytes 0-1 of the e4m3 registers in
          // a, bytes 2-3 in hi)
          uint32_t a[4];
          [[maybe_unused]] uint32_t hi[4];
          if constexpr (F16A) {
            ldsm_x4(As + 16 * i * St::lda + 64 * s + a_ld, a);
            ldsm_x4(As + 16 * i * St::lda + 64 * s + 32 + a_ld, hi);
          } else {
            const uint8_t* pa = As + (16 * i + g) * St::lda + 32 * s + 8 * t;
            const uint2 r0 = *reinterpret_cast<const uint2*>(pa);
            const uint2 r8 = *reinterpret_cast<const uint2*>(pa + 8 * St::lda);
            a[0] = r0.x, a[1] = r8.x, a[2] = r0.y, a[3] = r8.y;
          }
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            float d[4];
            if constexpr (F16A) {
              tc_mma_f16_pair(a, hi, b[j], d);
              if constexpr (PLUS0)
#pragma unroll
                for (int c = 0; c < 4; ++c) d[c] = __fadd_rn(0.0f, d[c]);
            } else {
              tc_mma(a, b[j][0], b[j][1], d);  // (+ 0 included)
            }
            const float s0 = sc[j][0], s1 = sc[j][1];
            if (s == 0 && PLUS0) {
              p[i][j][0] = __fmul_rn(d[0], s0), p[i][j][1] = __fmul_rn(d[1], s1);
              p[i][j][2] = __fmul_rn(d[2], s0), p[i][j][3] = __fmul_rn(d[3], s1);
            } else {
              const bool first = s == 0;  // (!PLUS0: onto +0)
              p[i][j][0] = __fmaf_rn(d[0], s0, first ? 0.0f : p[i][j][0]);
              p[i][j][1] = __fmaf_rn(d[1], s1, first ? 0.0f : p[i][j][1]);
              p[i][j][2] = __fmaf_rn(d[2], s0, first ? 0.0f : p[i][j][2]);
              p[i][j][3] = __fmaf_rn(d[3], s1, first ? 0.0f : p[i][j][3]);
            }
          }
        }
      }
    };
    if constexpr (F16A) {
      uint32_t zero = 0;  // bit 7 of a byte set where a scale byte is 0 (a borrow only passes a zero byte)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) zero |= (sw[j][c] - 0x01010101u) & ~sw[j][c];
      if (__any_sync(0xFFFFFFFFu, (zero & 0x80808080u) != 0)) groups(std::true_type{});
      else groups(std::false_type{});
    } else {
      groups(std::true_type{});
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float sa0 = __fmul_rn(SA[16 * i + g], 64.0f), sa8 = __fmul_rn(SA[16 * i + g + 8], 64.0f);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        tot[i][j][0] = __fmaf_rn(p[i][j][0], sa0, tot[i][j][0]), tot[i][j][1] = __fmaf_rn(p[i][j][1], sa0, tot[i][j][1]);
        tot[i][j][2] = __fmaf_rn(p[i][j][2], sa8, tot[i][j][2]), tot[i][j][3] = __fmaf_rn(p[i][j][3], sa8, tot[i][j][3]);
      }
    }
  }
  cp_wait<0>();

  // epilogue: rows g, g + 8 of each m16 tile, columns 2 t, 2 t + 1 of each n8 tile
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = 16 * i + g + 8 * h;
      if (m >= mcnt) continue;
      const int64_t row = m0 + m;
      if constexpr (KIND == kW13) {
        const float rw = A.row_w[row];
        float v[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float gg = A.out_bf16 ? round_bf16(tot[i][0][2 * h + c]) : tot[i][0][2 * h + c];
          const float uu = A.out_bf16 ? round_bf16(tot[i][1][2 * h + c]) : tot[i][1][2 * h + c];
          v[c] = swiglu_val(gg, uu, A.limit, true, rw, A.bf16);
        }
        *reinterpret_cast<float2*>(A.y + row * A.ldy + n0 + 8 * wn + 2 * t) = make_float2(v[0], v[1]);
      } else {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float v[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) v[c] = A.out_bf16 ? round_bf16(tot[i][j][2 * h + c]) : tot[i][j][2 * h + c];
          *reinterpret_cast<float2*>(A.y + row * A.ldy + n0 + 16 * wn + 8 * j + 2 * t) = make_float2(v[0], v[1]);
        }
      }
    }
#else
  __trap();  // moe_tc_big_ok() keeps the launchers off this path
#endif
}

// Whether the device and the binary run moe_tc_big_kernel (e4m3 conversions: sm_89+) with its shared memory; per
// device.
bool device_ok() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  static int cached[64] = {};  // 0 unknown, 1 yes, 2 no
  if (cached[dev] == 0) {
    cudaFuncAttributes fa{};
    int major = 0, minor = 0;
    bool ok = cudaFuncGetAttributes(&fa, moe_tc_big_kernel<kW2, true>) == cudaSuccess &&
              cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
              fa.binaryVersion >= 89 && major * 10 + minor >= 89;
    auto smem = [](auto kernel, int bytes) {
      return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
    };
    ok = ok && smem(moe_tc_big_kernel<kW13, true>, Stage<true>::smem) &&
         smem(moe_tc_big_kernel<kW2, true>, Stage<true>::smem) &&
         smem(moe_tc_big_kernel<kW13, false>, Stage<false>::smem) &&
         smem(moe_tc_big_kernel<kW2, false>, Stage<false>::smem);
    cudaGetLastError();  // (a refusal above is an answer, not an error of the next launch)
    cached[dev] = ok ? 1 : 2;
  }
  return cached[dev] == 1;
}

}  // namespace

int64_t moe_tc_big_calls() { return g_calls.load(); }
void set_moe_tc_big_e4m3_for_test(bool on) { g_e4m3_for_test.store(on); }

namespace gemm_internal {

bool moe_tc_big_ok(const MoeGemmArgs& g) {
  if (!g.quant || g.fmt != GemmFormat::fp4 || deterministic() || gemm_path() != GemmPath::auto_) return false;
  if (g.d_model % BT_N != 0 || g.inter % (BT_N / 2) != 0 || g.d_model % BT_KT != 0 || g.inter % BT_KT != 0)
    return false;
  if (!g.w16_ok || g.n_rows_bound <= kMoeSmallMax) return false;
  return device_ok();
}

size_t moe_tc_big_scratch_bytes(GemmFormat fmt, bool quant, int64_t n_tok, int64_t P, int64_t D, int64_t I) {
  if (!quant || fmt != GemmFormat::fp4 || P <= kMoeSmallMax) return 0;
  return (size_t(std::max(n_tok * D, P * I)) * 2 + 255) & ~size_t(255);  // f16 activations
}

void moe_tc_big(bool w13, const MoeGemmArgs& g, const float* a, const float* sa, float* y, int64_t ldy, float limit,
                bool bf16, cudaStream_t stream) {
  const int64_t K = w13 ? g.d_model : g.inter, rows = w13 ? g.n_tok : g.n_rows_bound;
  const int64_t n8 = rows * K / 8;
  if (n8 <= 0) return;
  const bool f16a = !g_e4m3_for_test.load();
  if (f16a) moe_a16_kernel<<<unsigned((n8 + 255) / 256), 256, 0, stream>>>(a, n8, static_cast<uint32_t*>(g.a8_ws));
  else moe_a8_kernel<<<unsigned((n8 + 255) / 256), 256, 0, stream>>>(a, n8, static_cast<uint8_t*>(g.a8_ws));
  BigArgs A;
  A.table = g.table;
  A.n_experts = g.n_experts;
  A.seg_start = g.seg_start;
  A.big_tile_start = g.big_tile_start;
  A.row_tok = w13 ? g.row_tok : nullptr;
  A.act = static_cast<const uint8_t*>(g.a8_ws);
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
  if (w13 && f16a) moe_tc_big_kernel<kW13, true><<<grid, BT_THREADS, Stage<true>::smem, stream>>>(A);
  else if (f16a) moe_tc_big_kernel<kW2, true><<<grid, BT_THREADS, Stage<true>::smem, stream>>>(A);
  else if (w13) moe_tc_big_kernel<kW13, false><<<grid, BT_THREADS, Stage<false>::smem, stream>>>(A);
  else moe_tc_big_kernel<kW2, false><<<grid, BT_THREADS, Stage<false>::smem, stream>>>(A);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) fail_msg(std::string("moe (FP8 tensor cores, prefill): ") + cudaGetErrorString(err));
  g_calls.fetch_add(1);
}

}  // namespace gemm_internal
}  // namespace dsv4::cuda
