// Prefill MoE on FP8 tensor cores, FP4 experts dequantized inside the kernel (fast (Q) mode): the expert segments of
// more than kMoeSmallMax rows (moe_launch_both in k_gemm.cu; the smaller ones run moe_tc_small_kernel there).
//
// Products as moe_tc_small_kernel's: mma.sync m16n8k32 e4m3 x e4m3 -> fp32, one mma per 32-column scale group of
// the FP4 weights (nibbles placed as e4m3 bytes: the E2M1 value times 2^-6), each result times its E8M0 scale (a
// power of two, exact) summed over the 4 groups of a 128-column block, then times the activation's block scale
// (x 2^6) into the fp32 accumulator. Every product is exact; the sums differ from the CPU's order by fp32 rounding
// (the fast mode's tolerance). A row's result does not depend on the other rows of its tile or of the call.
//
// Per call: the activation codes (fp32 code values of act_quant) become e4m3 bytes once (moe_a8_kernel: [rows, K],
// per 8 columns the 4 even ones then the 4 odd ones, the order fp4_as_e4m3 splits the nibbles in), then
// moe_tc_big_kernel: a block = 512 threads (16 warps) for one 64-row M tile of big_tile_start x 256 weight rows
// (kW13: rows n0 .. n0 + 127 of w1 and the same rows of w3, so SwiGLU runs in the epilogue; kW2: 256 rows of w2),
// K in blocks of 128 through a 4-stage cp.async ring in shared memory (activation bytes, raw FP4 bytes, the E8M0
// scale words and the activations' block scales). Warp w takes all 64 rows x 16 weight rows (4 x 2 mma tiles: each
// converted weight fragment and decoded scale serves 4 mmas, and the registers allow 16 warps per SM). The E8M0
// scales skip the special codes (e8m0_fast);
// staged rows are padded (160 / 80 bytes) so the fragment reads are free of bank conflicts. No host round trip:
// the kernel finds its expert and rows on the device, so the path also runs inside recorded decode steps.
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

namespace dsv4::cuda {
namespace {

constexpr int kW13 = 0, kW2 = 1;
constexpr int BT_THREADS = 512, BT_M = gemm_internal::kMoeTileM, BT_N = 256, BT_KT = 128, BT_STAGES = 4;
constexpr int BT_LDA = 160, BT_LDB = 80;  // staged row bytes: 128 codes / 64 FP4 bytes + padding
constexpr int BT_A = BT_M * BT_LDA, BT_B = BT_N * BT_LDB, BT_SB = BT_N * 4, BT_SA = BT_M * 4;
constexpr int BT_STAGE = BT_A + BT_B + BT_SB + BT_SA;  // 32,000 bytes
constexpr int BT_SMEM = BT_STAGES * BT_STAGE;
static_assert(BT_STAGE % 16 == 0, "stages must stay 16-byte aligned");
static_assert(BT_M == 64, "the loaders assume 64-row M tiles");

std::atomic<int64_t> g_calls{0};

struct BigArgs {
  const ExpertView* table = nullptr;  // device [E]
  int64_t n_experts = 0;
  const int32_t* seg_start = nullptr;
  const int32_t* big_tile_start = nullptr;
  const int32_t* row_tok = nullptr;  // kW13: token of each sorted row (the activation row); kW2: nullptr
  const uint8_t* a8 = nullptr;       // activation codes as e4m3 bytes [*, K], permuted (see the file comment)
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

template <int KIND>
__global__ void __launch_bounds__(BT_THREADS, 1) moe_tc_big_kernel(const BigArgs A) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
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

  // this thread's copies per stage: 16 activation bytes of row tid / 8, 2 x 16 weight bytes of staged rows
  // tid / 4 and tid / 4 + 128 (kW13: the w1 row and the w3 row), (tid < 256) the scale word of staged row tid,
  // (tid < 64) an activation scale. Rows past the segment repeat its last row (their results are not stored).
  auto src_row = [&](int r) {
    const int64_t sr = m0 + min(r, mcnt - 1);
    return KIND == kW13 ? int64_t(A.row_tok[sr]) : sr;
  };
  const uint8_t* asrc = A.a8 + src_row(tid >> 3) * K + 16 * (tid & 7);
  auto w_row = [&](int r, bool sc) {  // staged weight row r: its bytes or its scale bytes
    const WeightView& W = (KIND == kW13 && r >= 128) ? W1 : W0;
    const int64_t wr = n0 + (KIND == kW13 ? (r & 127) : r);
    return sc ? W.scale + wr * sb : W.w + wr * rb;
  };
  const uint8_t* bsrc0 = w_row(tid >> 2, false) + 16 * (tid & 3);
  const uint8_t* bsrc1 = w_row((tid >> 2) + 128, false) + 16 * (tid & 3);
  const uint8_t* ssrc = w_row(tid & 255, true);
  const float* sasrc = A.sa + src_row(tid & 63) * nkb;

  auto load = [&](int st, int64_t kb) {
    uint8_t* S = bt_smem + st * BT_STAGE;
    cp16(S + (tid >> 3) * BT_LDA + 16 * (tid & 7), asrc + kb * BT_KT);
    uint8_t* Sw = S + BT_A + (tid >> 2) * BT_LDB + 16 * (tid & 3);
    cp16(Sw, bsrc0 + kb * 64);
    cp16(Sw + 128 * BT_LDB, bsrc1 + kb * 64);
    if (tid < BT_N) cp4(S + BT_A + BT_B + 4 * tid, ssrc + kb * 4);
    if (tid < BT_M) cp4(S + BT_A + BT_B + BT_SB + 4 * tid, sasrc + kb);
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
    const uint8_t* S = bt_smem + int(kb % BT_STAGES) * BT_STAGE;
    const uint8_t* As = S;
    const uint8_t* Bs = S + BT_A;
    const uint32_t* SB = reinterpret_cast<const uint32_t*>(S + BT_A + BT_B);
    const float* SA = reinterpret_cast<const float*>(S + BT_A + BT_B + BT_SB);
    uint32_t sw[2][2];  // E8M0 words (4 groups) of weight rows 2 t, 2 t + 1 of each n8 tile
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) sw[j][c] = SB[b_row<KIND>(wn, j) + 2 * t + c];
    float p[4][2][4];  // this block's sum over its 4 groups of mma x weight scale
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t b[2][2];  // the n8 tiles' weight fragments as e4m3 (converted once, used by the 4 m16 tiles)
      float sc[2][2];    // and the group's scales of weight rows 2 t, 2 t + 1
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(Bs + (b_row<KIND>(wn, j) + g) * BT_LDB + 16 * s + 4 * t);
        fp4_as_e4m3(w, b[j][0], b[j][1]);
#pragma unroll
        for (int c = 0; c < 2; ++c)
          sc[j][c] = s == 0 ? e8m0_fast<0>(sw[j][c]) : s == 1 ? e8m0_fast<1>(sw[j][c])
                   : s == 2 ? e8m0_fast<2>(sw[j][c]) : e8m0_fast<3>(sw[j][c]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint8_t* pa = As + (16 * i + g) * BT_LDA + 32 * s + 8 * t;
        const uint2 r0 = *reinterpret_cast<const uint2*>(pa), r8 = *reinterpret_cast<const uint2*>(pa + 8 * BT_LDA);
        const uint32_t a[4] = {r0.x, r8.x, r0.y, r8.y};
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float d[4];
          tc_mma(a, b[j][0], b[j][1], d);
          const float s0 = sc[j][0], s1 = sc[j][1];
          if (s == 0) {
            p[i][j][0] = __fmul_rn(d[0], s0), p[i][j][1] = __fmul_rn(d[1], s1);
            p[i][j][2] = __fmul_rn(d[2], s0), p[i][j][3] = __fmul_rn(d[3], s1);
          } else {
            p[i][j][0] = __fmaf_rn(d[0], s0, p[i][j][0]), p[i][j][1] = __fmaf_rn(d[1], s1, p[i][j][1]);
            p[i][j][2] = __fmaf_rn(d[2], s0, p[i][j][2]), p[i][j][3] = __fmaf_rn(d[3], s1, p[i][j][3]);
          }
        }
      }
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

// Whether the device and the binary run moe_tc_big_kernel (e4m3 mma: sm_89+) with its shared memory; per device.
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
    ok = ok && cudaFuncSetAttribute(moe_tc_big_kernel<kW13>, cudaFuncAttributeMaxDynamicSharedMemorySize, BT_SMEM) ==
                   cudaSuccess &&
         cudaFuncSetAttribute(moe_tc_big_kernel<kW2>, cudaFuncAttributeMaxDynamicSharedMemorySize, BT_SMEM) ==
             cudaSuccess;
    cudaGetLastError();  // (a refusal above is an answer, not an error of the next launch)
    cached[dev] = ok ? 1 : 2;
  }
  return cached[dev] == 1;
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

size_t moe_tc_big_scratch_bytes(GemmFormat fmt, bool quant, int64_t n_tok, int64_t P, int64_t D, int64_t I) {
  if (!quant || fmt != GemmFormat::fp4 || P <= kMoeSmallMax) return 0;
  return (size_t(std::max(n_tok * D, P * I)) + 255) & ~size_t(255);
}

void moe_tc_big(bool w13, const MoeGemmArgs& g, const float* a, const float* sa, float* y, int64_t ldy, float limit,
                bool bf16, cudaStream_t stream) {
  const int64_t K = w13 ? g.d_model : g.inter, rows = w13 ? g.n_tok : g.n_rows_bound;
  uint8_t* a8 = static_cast<uint8_t*>(g.a8_ws);
  const int64_t n8 = rows * K / 8;
  if (n8 <= 0) return;
  moe_a8_kernel<<<unsigned((n8 + 255) / 256), 256, 0, stream>>>(a, n8, a8);
  BigArgs A;
  A.table = g.table;
  A.n_experts = g.n_experts;
  A.seg_start = g.seg_start;
  A.big_tile_start = g.big_tile_start;
  A.row_tok = w13 ? g.row_tok : nullptr;
  A.a8 = a8;
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
  if (w13) {
    const dim3 grid(unsigned(g.inter / (BT_N / 2)), unsigned(slots));
    moe_tc_big_kernel<kW13><<<grid, BT_THREADS, BT_SMEM, stream>>>(A);
  } else {
    const dim3 grid(unsigned(g.d_model / BT_N), unsigned(slots));
    moe_tc_big_kernel<kW2><<<grid, BT_THREADS, BT_SMEM, stream>>>(A);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) fail_msg(std::string("moe (FP8 tensor cores, prefill): ") + cudaGetErrorString(err));
  g_calls.fetch_add(1);
}

}  // namespace gemm_internal
}  // namespace dsv4::cuda
