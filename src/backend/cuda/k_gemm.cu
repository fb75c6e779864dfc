// CUDA linear layers (backend/gemm.h semantics) and the grouped expert GEMMs of the MoE (k_moe.cu).
//
// Kernels
//   act_quant_kernel    act_quant per 128 columns (spec §4.3): one warp per (row, 128-block); fp32 code values +
//                       scales, or e4m3 bytes + transposed scales for cuBLASLt (gemm_cublaslt.cpp).
//   tile_kernel         "simt", (Q) and (D): 64 tokens x 64 output rows per block, K in tiles of 32 through shared
//                       memory (weights decoded once per tile), 4x4 outputs per thread. Kinds: linear, MoE w1+w3
//                       (both weights, SwiGLU epilogue), MoE w2; the MoE kinds find their (expert, M tile) from the
//                       tile offsets of the routing plan (binary search) and exit past the total.
//   tc_kernel           the tiled kernel's MoE schedule on FP8 tensor cores (fast (Q) mode, big expert segments; not
//                       the CPU's order: see its comment).
//   small_kernel        "small_m" in (Q): 32 output rows x 4 tokens per block for decode; the 32 lanes of a warp take
//                       32 consecutive scale blocks of the same row (coalesced 16-byte weight loads), the block
//                       partial sums go through shared memory and one thread per output adds them in block order.
//   rowchain_kernel     "small_m" in (D): one warp per 32 output rows, one row per lane, every lane runs its row's
//                       whole K chain (for up to 4 tokens / sorted rows at once: MT accumulators). The warp streams
//                       its 32 rows through a shared-memory ring of 8 slots (32 weight bytes of each row + the
//                       matching activations per slot, filled by cp.async 7 slots ahead, coalesced: two lanes per
//                       row), so the loads never wait on the chain.
//   finish_kernel       bf16 rounding / copy of cuBLASLt outputs.
//   swiglu_kernel       SwiGLU of the shared expert.
//
// Summation order per output element (the CPU's, gemm.h, in both products, so simt == small_m == CPU bitwise for
// any n_tok, and row t never depends on the other rows):
//   (Q) per scale block kb (128 columns for FP8, 32 for FP4):  q = 0;  for k in kb ascending: q = fma(qa[k], qw[k], q)
//       acc = acc + q * (sa[m, k/128] * sw[n, kb])     (acc0 = 0, blocks ascending; every product is exact)
//   (D) acc = 0;  for k = 0..K-1 ascending:  acc = fma(x[m, k], Wd[n, k], acc)      (one fp32 chain over all of K)
//       Wd = code * scale (one fp32 multiply; E4M3 / E2M1 code values are exact) for FP8 / FP4, the stored value for
//       BF16 / F32, then bf16-rounded (RNE on the bit pattern, as gemm_kernels.h) with weight_as_bf16.
// The (D) chain cannot be split over lanes, so a (D) decode GEMV needs at least K dependent FMAs per output (about
// K * 4 cycles: ~8 us at K = 4096); rowchain_kernel keeps every chain busy and otherwise runs at memory bandwidth.
//
// Exactness: no contraction is left to the compiler (__fmaf_rn / __fadd_rn / __fmul_rn everywhere it matters);
// weights are decoded exactly (e4m3 / e2m1 by bit placement + a power-of-two multiply, as the CPU's values).
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/device_async_copy.cuh"
#include "backend/cuda/device_fp8_mma.cuh"
#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/device_pdl.cuh"
#include "backend/cuda/device_swiglu.cuh"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/glibc_math.cuh"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

using gemm_internal::fail_msg;

constexpr int kFmtBf16 = 0, kFmtF32 = 1, kFmtFp8 = 2, kFmtFp4 = 3;  // GemmFormat order
constexpr int kLinear = 0, kW13 = 1, kW2 = 2;                        // kernel kinds

inline int fmt_code(GemmFormat f) { return static_cast<int>(f); }
inline size_t align256(size_t b) { return (b + 255) & ~size_t(255); }
__host__ __device__ inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- weights ----------------------------------------------------------------------------------------------------
struct WDesc {
  const uint8_t* w = nullptr;  // row 0 of the matrix
  const uint8_t* scale = nullptr;
  int64_t row_bytes = 0, K = 0, scols = 0;
  int br = 1, bc = 1, br_sh = 0, bc_sh = 0;  // scale block; *_sh: log2 when a power of two, else -1
  bool sf32 = false;                         // FP8 scales stored as F32
  bool vec = false;                          // 16-byte aligned rows: full 8-element groups read with vector loads
};

__host__ __device__ inline int pow2_shift(int v) {
  if (v <= 0 || (v & (v - 1)) != 0) return -1;
  int s = 0;
  while ((1 << s) < v) ++s;
  return s;
}

__host__ __device__ inline WDesc make_wdesc(const WeightView& v) {
  WDesc d;
  d.w = v.w;
  d.scale = v.scale;
  d.K = v.cols;
  switch (v.fmt) {
    case GemmFormat::fp8: d.row_bytes = v.cols; break;
    case GemmFormat::fp4: d.row_bytes = v.cols / 2; break;
    case GemmFormat::bf16: d.row_bytes = 2 * v.cols; break;
    case GemmFormat::f32: d.row_bytes = 4 * v.cols; break;
  }
  if (v.fmt == GemmFormat::fp4) {
    d.br = 1;
    d.bc = 32;
  } else if (v.fmt == GemmFormat::fp8) {
    d.br = static_cast<int>(v.block_rows);
    d.bc = static_cast<int>(v.block_cols);
  }
  d.br_sh = pow2_shift(d.br);
  d.bc_sh = pow2_shift(d.bc);
  d.scols = (v.cols + d.bc - 1) / d.bc;
  d.sf32 = v.scale_f32 && v.fmt == GemmFormat::fp8;
  d.vec = (reinterpret_cast<uintptr_t>(v.w) & 15) == 0 && d.row_bytes % 16 == 0;
  return d;
}

// Block scale of element (n, k) (FP8: sw[n/br][k/bc], E8M0 or F32; FP4: sw[n][k/32]).
__device__ __forceinline__ float wscale(const WDesc& d, int64_t n, int64_t k) {
  const int64_t nb = d.br_sh >= 0 ? (n >> d.br_sh) : n / d.br;
  const int64_t kb = d.bc_sh >= 0 ? (k >> d.bc_sh) : k / d.bc;
  const int64_t i = nb * d.scols + kb;
  if (d.sf32) return __ldg(reinterpret_cast<const float*>(d.scale) + i);
  return e8m0_to_float(__ldg(d.scale + i));
}

// Exact decoders. e4m3: the 7 magnitude bits placed at the top of the binary32 mantissa/exponent give
// 2^(e-127)(1+m/8) (or m * 2^-149 * 2^20 when e = 0); times 2^120 that is the e4m3 value (subnormals included,
// no FTZ without fast math). Codes 0x7F / 0xFF (NaN) decode to +-480 like the CPU's SIMD decoders (unsupported).
__device__ __forceinline__ float dec_e4m3(uint32_t b) {
  return __fmul_rn(__uint_as_float(((b & 0x80u) << 24) | ((b & 0x7Fu) << 20)), 0x1p120f);
}
// e2m1 (low 4 bits of n): same placement of (e:2, m:1) times 2^126.
__device__ __forceinline__ float dec_e2m1(uint32_t n) {
  return __fmul_rn(__uint_as_float(((n & 8u) << 28) | ((n & 7u) << 22)), 0x1p126f);
}

// 8 code values (not scaled) of a row from column k (k % 8 == 0, k + 8 <= K, 16-byte aligned rows).
template <int FMT>
__device__ __forceinline__ void codes8_vec(const uint8_t* rowp, int64_t k, float* v) {
  if constexpr (FMT == kFmtFp8) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(rowp + k));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[i] = dec_e4m3((u.x >> (8 * i)) & 0xFFu);
      v[4 + i] = dec_e4m3((u.y >> (8 * i)) & 0xFFu);
    }
  } else if constexpr (FMT == kFmtFp4) {
    const uint32_t u = __ldg(reinterpret_cast<const unsigned int*>(rowp + k / 2));
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = dec_e2m1(u >> (4 * i));
  } else if constexpr (FMT == kFmtBf16) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(rowp + 2 * k));
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
  } else {
    const float4 a = __ldg(reinterpret_cast<const float4*>(rowp + 4 * k));
    const float4 b = __ldg(reinterpret_cast<const float4*>(rowp + 4 * k + 16));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}

// One code value (any alignment).
template <int FMT>
__device__ __forceinline__ float code1(const uint8_t* rowp, int64_t k) {
  if constexpr (FMT == kFmtFp8) {
    return dec_e4m3(__ldg(rowp + k));
  } else if constexpr (FMT == kFmtFp4) {
    const uint32_t b = __ldg(rowp + (k >> 1));
    return dec_e2m1((k & 1) ? (b >> 4) : b);
  } else if constexpr (FMT == kFmtBf16) {
    const uint32_t lo = __ldg(rowp + 2 * k), hi = __ldg(rowp + 2 * k + 1);
    return __uint_as_float((lo | (hi << 8)) << 16);
  } else {
    uint32_t b = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) b |= uint32_t(__ldg(rowp + 4 * k + i)) << (8 * i);
    return __uint_as_float(b);
  }
}

// weight_as_bf16 rounding of a dequantized weight, bit for bit the CPU's (gemm_kernels.h bf16_round_bits: RNE on the
// bit pattern, no NaN special case).
__device__ __forceinline__ float wround_bf16(float v) {
  const uint32_t b = __float_as_uint(v);
  return __uint_as_float((b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u);
}

// (D) value of a code: exactly dequantized (code * scale, one fp32 rounding as the CPU), then bf16 when asked.
template <int FMT>
__device__ __forceinline__ float dequant(float code, float s, bool wbf16) {
  float v = code;
  if constexpr (FMT == kFmtFp8 || FMT == kFmtFp4) v = __fmul_rn(code, s);
  if constexpr (FMT == kFmtBf16) return v;  // a bf16 value rounds to itself
  return wbf16 ? wround_bf16(v) : v;
}

// 8 weight values of row n from column k (k % 8 == 0): code values (Q) or (D) values; 0 beyond K.
template <int FMT, bool Q>
__device__ __forceinline__ void weights8(const WDesc& d, int64_t n, int64_t k, bool wbf16, float* v) {
  const uint8_t* rowp = d.w + n * d.row_bytes;
  const bool full = k + 8 <= d.K;
  if (full && d.vec) {
    codes8_vec<FMT>(rowp, k, v);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = (k + i < d.K) ? code1<FMT>(rowp, k + i) : 0.0f;
  }
  if constexpr (!Q) {
    if constexpr (FMT == kFmtFp8 || FMT == kFmtFp4) {
      if (d.bc % 8 == 0) {  // one scale for the 8 columns
        const float s = wscale(d, n, k);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = dequant<FMT>(v[i], s, wbf16);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = (k + i < d.K) ? dequant<FMT>(v[i], wscale(d, n, k + i), wbf16) : 0.0f;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = dequant<FMT>(v[i], 1.0f, wbf16);
    }
  }
}

// 8 activations of a row from column k; 0 beyond K.
__device__ __forceinline__ void acts8(const float* rowp, int64_t k, int64_t K, bool vec, float* v) {
  if (vec && k + 8 <= K) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(rowp + k));
    const float4 b = __ldg(reinterpret_cast<const float4*>(rowp + k + 4));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = (k + i < K) ? __ldg(rowp + k + i) : 0.0f;
  }
}

// ---- activation quantization ------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t enc_e4m3(float v) {  // v an exact e4m3 value (|v| <= 448)
  const uint32_t b = __float_as_uint(v), sign = (b >> 24) & 0x80u, ab = b & 0x7FFFFFFFu;
  if (ab < 0x3C800000u) return sign | static_cast<uint32_t>(__fmul_rn(__uint_as_float(ab), 512.0f));
  return sign | ((((ab >> 23) - 120u) & 0xFu) << 3) | ((ab >> 20) & 7u);
}

// act_quant of one 128-column block by a warp (act_quant_kernel's arithmetic): lane holds columns j * 32 + lane
// (j < 4; 0 at or beyond len) of the block starting at xr; c[j] gets their codes, the block scale is returned.
__device__ __forceinline__ float warp_act_quant128(const float* xr, int len, int lane, float c[4]) {
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = j * 32 + lane;
    c[j] = i < len ? xr[i] : 0.0f;
    const float a = fabsf(c[j]);
    m = a > m ? a : m;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xFFFFFFFFu, m, o);
    m = u > m ? u : m;
  }
  const float sc = fp8_act_scale(m), inv = __fdiv_rn(1.0f, sc);
#pragma unroll
  for (int j = 0; j < 4; ++j) c[j] = fp8_quant(c[j], inv);
  return sc;
}

// One warp per (row, 128-column block). E4M3: q8/s_t (cuBLASLt layout), rows >= rows_real are padding.
template <bool E4M3>
__global__ void __launch_bounds__(256) act_quant_kernel(const float* x, int64_t rows_real, int64_t rows, int64_t K,
                                                        float* q, float* s, uint8_t* q8, float* s_t) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int64_t nsb = (K + 127) / 128;
  const int64_t gw = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (gw >= rows * nsb) return;
  const int64_t row = gw / nsb, b = gw % nsb, k0 = b * 128;
  const int len = static_cast<int>(imin(128, K - k0));
  if (E4M3 && row >= rows_real) {
    for (int j = lane; j < len; j += 32) q8[row * K + k0 + j] = 0;
    if (lane == 0) s_t[b * rows + row] = 1.0f;
    return;
  }
  float c[4];
  const float sc = warp_act_quant128(x + row * K + k0, len, lane, c);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = j * 32 + lane;
    if (i < len) {
      if (E4M3)
        q8[row * K + k0 + i] = static_cast<uint8_t>(enc_e4m3(c[j]));
      else
        q[row * K + k0 + i] = c[j];
    }
  }
  if (lane == 0) {
    if (E4M3)
      s_t[b * rows + row] = sc;
    else
      s[row * nsb + b] = sc;
  }
}

__global__ void finish_kernel(const float* src, int64_t n, bool bf16, float* y) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = bf16 ? round_bf16(src[i]) : src[i];
}

__global__ void swiglu_kernel(const float* g, const float* up, int64_t n, float limit, bool bf16, float* h) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    h[i] = swiglu_val(g[i], up[i], limit, false, 0.0f, bf16);
}

__global__ void widen_scales_kernel(const uint8_t* scale, bool sf32, int64_t srows, int64_t scols, int64_t ld,
                                    float* aux) {
  const int64_t n = srows * ld;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / ld, c = i % ld;
    float v = 1.0f;
    if (c < scols) {
      const int64_t j = r * scols + c;
      if (sf32) {
        uint32_t b = 0;
        for (int t = 0; t < 4; ++t) b |= uint32_t(scale[4 * j + t]) << (8 * t);
        v = __uint_as_float(b);
      } else {
        v = e8m0_to_float(scale[j]);  // 2^(e-127), exact in fp32
      }
    }
    aux[i] = v;
  }
}

// ---- kernel arguments ---------------------------------------------------------------------------------------------
struct GArgs {
  // activations: rows of a (codes in (Q)) with scales sa [*, ldsa]
  const float* a = nullptr;
  int64_t lda = 0;
  const float* sa = nullptr;
  int64_t ldsa = 0;
  bool a_vec = false;  // a and lda allow 16-byte loads
  // linear
  int64_t M = 0;
  WeightView W;
  int64_t r0 = 0, nout = 0;
  // gemv_tc_kernel pair (y2 != nullptr): a second matrix of W's K and format on the same x, its rows [0, nout2) into
  // y2 [M, ldy2] (the first matrix then starts at row r0 = 0 too)
  WeightView W2;
  float* y2 = nullptr;
  int64_t nout2 = 0, ldy2 = 0;
  // output (linear: y [M, ldy]; MoE: h or o [rows, ldy])
  float* y = nullptr;
  int64_t ldy = 0;
  bool out_bf16 = false, weight_as_bf16 = false;
  int64_t n_slots = 0;  // blockIdx.x = n_tile * n_slots + slot
  int gv_ks = 1;        // gemv_kernel: warps splitting K (1, 2, 4, 8)
  // gemv_kernel, grouped linear (blockIdx.y = group g): a + g grp_a, y + g grp_y, weight rows r0 + g grp_r
  int64_t grp_a = 0, grp_y = 0, grp_r = 0;
  // MoE
  const ExpertView* table = nullptr;
  int64_t n_experts = 0, d_model = 0, inter = 0;
  const int32_t* seg_start = nullptr;
  const int32_t* big_tile_start = nullptr;
  const int32_t* small_list = nullptr;
  const int32_t* n_small = nullptr;
  const int32_t* row_tok = nullptr;
  const float* row_w = nullptr;
  float limit = 0.0f;
  bool bf16 = false;
  float* raw_gu = nullptr;  // tests: moe_tc_small_kernel<kW13> stores g and u here ([rows, 2 inter]), not SwiGLU
};

// Weights, K and the output width of a block of kind KIND (expert e for the MoE kinds).
template <int KIND>
__device__ __forceinline__ void block_weights(const GArgs& A, int64_t e, WDesc* wd, int64_t& K, int64_t& nout,
                                              int64_t& wrow0) {
  if constexpr (KIND == kLinear) {
    wd[0] = make_wdesc(A.W);
    K = A.W.cols;
    nout = A.nout;
    wrow0 = A.r0;
  } else if constexpr (KIND == kW13) {
    wd[0] = make_wdesc(A.table[e].w1);
    wd[1] = make_wdesc(A.table[e].w3);
    K = A.d_model;
    nout = A.inter;
    wrow0 = 0;
  } else {
    wd[0] = make_wdesc(A.table[e].w2);
    K = A.inter;
    nout = A.d_model;
    wrow0 = 0;
  }
}

// Source activation row of output row m of a block starting at row m0 (linear: token; MoE: sorted row).
template <int KIND>
__device__ __forceinline__ int64_t act_row(const GArgs& A, int64_t sorted_row) {
  if constexpr (KIND == kW13) return A.row_tok[sorted_row];
  return sorted_row;
}

// Output of one element (after the chunk loop).
// (y0: offset of a grouped linear's group in y.)
template <int KIND>
__device__ __forceinline__ void store_out(const GArgs& A, int64_t row, int64_t n, float acc0, float acc1,
                                          int64_t y0 = 0) {
  if constexpr (KIND == kW13) {
    const float g = A.out_bf16 ? round_bf16(acc0) : acc0;
    const float u = A.out_bf16 ? round_bf16(acc1) : acc1;
    A.y[row * A.ldy + n] = swiglu_val(g, u, A.limit, true, A.row_w[row], A.bf16);
  } else {
    A.y[y0 + row * A.ldy + n] = A.out_bf16 ? round_bf16(acc0) : acc0;
  }
}

// 16 bytes of weights from p (any alignment when !vec).
__device__ __forceinline__ uint4 gv_load16(const uint8_t* p, bool vec) {
  if (vec) return __ldg(reinterpret_cast<const uint4*>(p));
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = uint32_t(__ldg(p + 4 * i)) | (uint32_t(__ldg(p + 4 * i + 1)) << 8) |
           (uint32_t(__ldg(p + 4 * i + 2)) << 16) | (uint32_t(__ldg(p + 4 * i + 3)) << 24);
  return make_uint4(w[0], w[1], w[2], w[3]);
}


// The expert of big-segment tile `slot` of the MoE kinds: the last e with big_tile_start[e] <= slot (binary search;
// slot < big_tile_start[n_experts]).
__device__ __forceinline__ int64_t big_tile_expert(const GArgs& A, int64_t slot) {
  int64_t lo = 0, hi = A.n_experts - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (A.big_tile_start[mid] <= slot) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// ---- tiled kernel ("simt") ------------------------------------------------------------------------------------------
constexpr int TBM = 64, TBN = 64, TBK = 32, TPAD = 4;

template <int FMT, bool Q, int KIND>
__global__ void __launch_bounds__(256) tile_kernel(const GArgs A) {
  constexpr int NW = KIND == kW13 ? 2 : 1;
  constexpr int CPT = (Q && FMT == kFmtFp8) ? 4 : 1;  // (Q) K tiles per scale block (FP8: 128 = 4 tiles)
  __shared__ __align__(16) float As[TBK][TBM + TPAD];
  __shared__ __align__(16) float Ws[NW][TBK][TBN + TPAD];
  __shared__ float SA[TBM];
  __shared__ float SW[NW][TBN];
  __shared__ int64_t Arow[TBM];

  const int tid = threadIdx.x;
  const int64_t slot = blockIdx.x % A.n_slots, nt = blockIdx.x / A.n_slots;
  int64_t m0 = 0, mcnt = 0, e = 0;
  if constexpr (KIND == kLinear) {
    m0 = slot * TBM;
    mcnt = imin(TBM, A.M - m0);
  } else {
    const int64_t E = A.n_experts;
    if (slot >= A.big_tile_start[E]) return;
    e = big_tile_expert(A, slot);
    m0 = A.seg_start[e] + (slot - A.big_tile_start[e]) * TBM;
    mcnt = imin(TBM, A.seg_start[e + 1] - m0);
  }
  WDesc wd[NW];
  int64_t K = 0, nout = 0, wrow0 = 0;
  block_weights<KIND>(A, e, wd, K, nout, wrow0);
  const int64_t n0 = nt * TBN;
  if (mcnt <= 0 || n0 >= nout) return;

  if (tid < TBM) Arow[tid] = tid < mcnt ? act_row<KIND>(A, m0 + tid) : -1;
  __syncthreads();

  const int tx = tid % 16, ty = tid / 16;        // compute: rows n0 + tx*4 + j, tokens ty*4 + i
  const int lrow = tid / 4, lk = (tid % 4) * 8;  // loaders: tile row lrow, columns lk .. lk+7
  const bool active = ty * 4 < mcnt;
  float acc[NW][4][4], q[NW][4][4];
#pragma unroll
  for (int w = 0; w < NW; ++w)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[w][i][j] = 0.0f, q[w][i][j] = 0.0f;

  const int64_t nkt = cdiv(K, TBK);
  for (int64_t t = 0; t < nkt; ++t) {
    const int64_t k0 = t * TBK;
    const int kmax = static_cast<int>(imin(TBK, K - k0));
    const bool chunk_end = ((t + 1) % CPT == 0) || (t + 1 == nkt);
    {
      float v[8];
      const int64_t ar = Arow[lrow];
      if (ar >= 0) {
        acts8(A.a + ar * A.lda, k0 + lk, K, A.a_vec, v);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) As[lk + i][lrow] = v[i];
    }
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      float v[8];
      const int64_t n = n0 + lrow;
      if (n < nout) {
        weights8<FMT, Q>(wd[w], wrow0 + n, k0 + lk, A.weight_as_bf16, v);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) Ws[w][lk + i][lrow] = v[i];
    }
    if constexpr (Q) {
      if (chunk_end) {
        const int64_t kc = (t / CPT) * CPT * TBK;  // first column of the chunk (= of the scale block)
        if (tid < TBM) {
          const int64_t ar = Arow[tid];
          SA[tid] = ar >= 0 ? A.sa[ar * A.ldsa + kc / 128] : 0.0f;
        } else if (tid < TBM + NW * TBN) {
          const int w = (tid - TBM) / TBN, nn = (tid - TBM) % TBN;
          const int64_t n = n0 + nn;
          // (constant indices into wd: a dynamic one would put the descriptors in local memory)
          if (w == 0)
            SW[0][nn] = n < nout ? wscale(wd[0], wrow0 + n, kc) : 0.0f;
          else
            SW[NW - 1][nn] = n < nout ? wscale(wd[NW - 1], wrow0 + n, kc) : 0.0f;
        }
      }
    }
    __syncthreads();
    if (active) {
      auto step = [&](int kk) {
        const float4 a4 = *reinterpret_cast<const float4*>(&As[kk][ty * 4]);
        const float av[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
        for (int w = 0; w < NW; ++w) {
          const float4 w4 = *reinterpret_cast<const float4*>(&Ws[w][kk][tx * 4]);
          const float wv[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if constexpr (Q)
                q[w][i][j] = __fmaf_rn(av[i], wv[j], q[w][i][j]);  // the scale block's chain
              else
                acc[w][i][j] = __fmaf_rn(av[i], wv[j], acc[w][i][j]);  // (D): one chain over all K tiles
            }
        }
      };
      if (kmax == TBK) {
#pragma unroll 8
        for (int kk = 0; kk < TBK; ++kk) step(kk);
      } else {
        for (int kk = 0; kk < kmax; ++kk) step(kk);
      }
      if constexpr (Q) {
        if (chunk_end) {
#pragma unroll
          for (int w = 0; w < NW; ++w)
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                const float sc = __fmul_rn(SA[ty * 4 + i], SW[w][tx * 4 + j]);
                acc[w][i][j] = __fadd_rn(acc[w][i][j], __fmul_rn(q[w][i][j], sc));
                q[w][i][j] = 0.0f;
              }
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = ty * 4 + i;
    if (m >= mcnt) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx * 4 + j;
      if (n >= nout) continue;
      store_out<KIND>(A, m0 + m, n, acc[0][i][j], acc[NW - 1][i][j]);
    }
  }
}

// ---- tensor-core MoE tile kernel ("tc": fast mode, (Q) FP4 / FP8 experts, big segments) -------------------------
// The tiled kernel's schedule (64 sorted rows x 64 output rows per block, big_tile_start) on FP8 tensor cores:
// mma.sync m16n8k32 e4m3 x e4m3 -> fp32, one mma per 32-column K block, so the FP4 weights' per-32 scales (and the
// FP8 weights' per-128 ones) and the activations' per-128 scales are applied to each block's product in fp32:
//   acc = fma(mma(a_codes[kb], w_codes[kb]), sa[m, kb/4] * sw[n, kb], acc)      (kb = 32-column blocks, ascending)
// Activation codes (exact e4m3 values in fp32) are converted to e4m3 bytes exactly; FP4 nibbles become e4m3 bytes by
// bit placement (the E2M1 value times 2^-6, exact; the scale carries the 2^6 back). Every product is exact; the sums
// inside one mma are the tensor core's (as in the reference's own FP8 / FP4 GEMMs), so the result differs from the
// CPU's order by accumulation rounding (not deterministic(): the CPU-order tiled kernel runs there). A row's result
// does not depend on the other rows of its tile.
// Block: 128 threads = 2 x 2 warps of 32 rows x 32 columns (per weight: w1 and w3 for kW13), K in tiles of 128
// staged through shared memory as e4m3 bytes (row stride 144 bytes: conflict-free fragment reads).
constexpr int TC_THREADS = 128, TC_KT = 128, TC_LD = TC_KT + 16;  // bytes per staged row

__device__ __forceinline__ uint32_t tc_e4m3x4(float4 v) {  // 4 exact e4m3 values -> 4 bytes (little endian)
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v.x, v.y), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v.z, v.w), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// 8 FP4 nibbles (columns 0..7, low nibble first) -> 8 e4m3 bytes (E2M1 value x 2^-6) in column order.
__device__ __forceinline__ uint2 tc_fp4x8(uint32_t w) {
  uint32_t ev, od;
  fp4_as_e4m3(w, ev, od);
  return make_uint2(__byte_perm(ev, od, 0x5140), __byte_perm(ev, od, 0x7362));
}


template <int FMT, int KIND>
__global__ void __launch_bounds__(TC_THREADS) tc_kernel(const GArgs A) {
  static_assert(FMT == kFmtFp8 || FMT == kFmtFp4, "tc: FP8 / FP4 weights");
  static_assert(KIND == kW13 || KIND == kW2, "tc: MoE kinds");
  constexpr int NW = KIND == kW13 ? 2 : 1;
  constexpr float WMUL = FMT == kFmtFp4 ? 64.0f : 1.0f;
  __shared__ __align__(16) uint8_t As[TBM * TC_LD];
  __shared__ __align__(16) uint8_t Bs[NW][TBN * TC_LD];
  __shared__ float SA[TBM];
  __shared__ float SW[NW][TBN][TC_KT / 32];
  __shared__ int64_t Arow[TBM];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int64_t slot = blockIdx.x % A.n_slots, nt = blockIdx.x / A.n_slots;
  const int64_t E = A.n_experts;
  if (slot >= A.big_tile_start[E]) return;
  const int64_t e = big_tile_expert(A, slot);
  const int64_t m0 = A.seg_start[e] + (slot - A.big_tile_start[e]) * TBM;
  const int64_t mcnt = imin(TBM, A.seg_start[e + 1] - m0);
  WDesc wd[NW];
  int64_t K = 0, nout = 0, wrow0 = 0;
  block_weights<KIND>(A, e, wd, K, nout, wrow0);
  const int64_t n0 = nt * TBN;
  if (mcnt <= 0 || n0 >= nout) return;
  if (tid < TBM) Arow[tid] = tid < mcnt ? act_row<KIND>(A, m0 + tid) : -1;
  __syncthreads();

  const int wm = warp & 1, wn = warp >> 1;  // warp tile: rows wm*32 .. +32, columns wn*32 .. +32
  float acc[NW][2][4][4];
#pragma unroll
  for (int w = 0; w < NW; ++w)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[w][i][j][c] = 0.0f;

  for (int64_t k0 = 0; k0 < K; k0 += TC_KT) {
    // stage A: 64 rows x 128 codes -> e4m3 bytes (rows past the segment: zeros)
#pragma unroll 4
    for (int i = tid; i < TBM * (TC_KT / 4); i += TC_THREADS) {
      const int r = i / (TC_KT / 4), c4 = i % (TC_KT / 4);
      const int64_t ar = Arow[r];
      uint32_t v = 0u;
      if (ar >= 0) v = tc_e4m3x4(__ldg(reinterpret_cast<const float4*>(A.a + ar * A.lda + k0) + c4));
      *reinterpret_cast<uint32_t*>(As + r * TC_LD + 4 * c4) = v;
    }
    if (tid < TBM) {
      const int64_t ar = Arow[tid];
      SA[tid] = ar >= 0 ? __ldg(A.sa + ar * A.ldsa + (k0 >> 7)) : 0.0f;
    }
    // stage B: 64 weight rows x 128 columns as e4m3 bytes, and their per-32-column scales (x 2^6 for FP4)
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      if constexpr (FMT == kFmtFp4) {
        for (int i = tid; i < TBN * 4; i += TC_THREADS) {  // 16 bytes = 32 columns each
          const int r = i / 4, q = i % 4;
          const int64_t n = n0 + r;
          uint4 u = make_uint4(0u, 0u, 0u, 0u);
          if (n < nout) u = gv_load16(wd[w].w + (wrow0 + n) * wd[w].row_bytes + k0 / 2 + 16 * q, wd[w].vec);
          const uint2 a = tc_fp4x8(u.x), b = tc_fp4x8(u.y), c = tc_fp4x8(u.z), d = tc_fp4x8(u.w);
          uint4* dst = reinterpret_cast<uint4*>(Bs[w] + r * TC_LD + 32 * q);
          dst[0] = make_uint4(a.x, a.y, b.x, b.y);
          dst[1] = make_uint4(c.x, c.y, d.x, d.y);
        }
      } else {
        for (int i = tid; i < TBN * 8; i += TC_THREADS) {  // 16 bytes = 16 columns each
          const int r = i / 8, q = i % 8;
          const int64_t n = n0 + r;
          uint4 u = make_uint4(0u, 0u, 0u, 0u);
          if (n < nout) u = gv_load16(wd[w].w + (wrow0 + n) * wd[w].row_bytes + k0 + 16 * q, wd[w].vec);
          *reinterpret_cast<uint4*>(Bs[w] + r * TC_LD + 16 * q) = u;
        }
      }
      for (int i = tid; i < TBN * (TC_KT / 32); i += TC_THREADS) {
        const int r = i / (TC_KT / 32), kb = i % (TC_KT / 32);
        const int64_t n = n0 + r;
        // (constant indices into wd: a dynamic one would put the descriptors in local memory)
        const float s = n < nout ? wscale(wd[w == 0 ? 0 : NW - 1], wrow0 + n, k0 + 32 * kb) : 0.0f;
        SW[w][r][kb] = __fmul_rn(s, WMUL);
      }
    }
    __syncthreads();
    float sa[2][2];  // rows g and g + 8 of the warp's two m16 tiles
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      sa[i][0] = SA[wm * 32 + i * 16 + g];
      sa[i][1] = SA[wm * 32 + i * 16 + g + 8];
    }
#pragma unroll
    for (int kb = 0; kb < TC_KT / 32; ++kb) {
      uint32_t a[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint8_t* p = As + (wm * 32 + i * 16 + g) * TC_LD + kb * 32 + 4 * t4;
        a[i][0] = *reinterpret_cast<const uint32_t*>(p);
        a[i][1] = *reinterpret_cast<const uint32_t*>(p + 8 * TC_LD);
        a[i][2] = *reinterpret_cast<const uint32_t*>(p + 16);
        a[i][3] = *reinterpret_cast<const uint32_t*>(p + 8 * TC_LD + 16);
      }
#pragma unroll
      for (int w = 0; w < NW; ++w)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int nr = wn * 32 + j * 8 + g;  // B fragment: weight row nr (output column g of the n8 tile)
          const uint8_t* p = Bs[w] + nr * TC_LD + kb * 32 + 4 * t4;
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(p), b1 = *reinterpret_cast<const uint32_t*>(p + 16);
          const int nc = wn * 32 + j * 8 + 2 * t4;  // accumulator columns nc, nc + 1
          const float s0 = SW[w][nc][kb], s1 = SW[w][nc + 1][kb];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            float d[4];
            tc_mma(a[i], b0, b1, d);
            acc[w][i][j][0] = __fmaf_rn(d[0], __fmul_rn(sa[i][0], s0), acc[w][i][j][0]);
            acc[w][i][j][1] = __fmaf_rn(d[1], __fmul_rn(sa[i][0], s1), acc[w][i][j][1]);
            acc[w][i][j][2] = __fmaf_rn(d[2], __fmul_rn(sa[i][1], s0), acc[w][i][j][2]);
            acc[w][i][j][3] = __fmaf_rn(d[3], __fmul_rn(sa[i][1], s1), acc[w][i][j][3]);
          }
        }
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = wm * 32 + i * 16 + g + 8 * h;
      if (m >= mcnt) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int64_t n = n0 + wn * 32 + j * 8 + 2 * t4 + c;
          if (n < nout) store_out<KIND>(A, m0 + m, n, acc[0][i][j][2 * h + c], acc[NW - 1][i][j][2 * h + c]);
        }
    }
}

// ---- small-M kernel ("small_m", (Q) only) -------------------------------------------------------------------------
// The chunks are the scale blocks, so splitting K over the lanes keeps the CPU's (Q) order exactly.
constexpr int SBN = 32;  // output rows per block (8 warps x 4)
constexpr int SMG = 4;   // tokens per group
constexpr int SQS = 33;  // padded row of the chunk-partial buffer

template <int FMT, bool Q, int KIND>
__global__ void __launch_bounds__(256, 2) small_kernel(const GArgs A) {
  static_assert(Q, "(D) decode runs on rowchain_kernel: its chain must not be split");
  constexpr int NW = KIND == kW13 ? 2 : 1;
  constexpr int CH = FMT == kFmtFp8 ? 128 : 32;  // chunk length (columns) = the scale block
  __shared__ float Qs[NW * SBN * SMG][SQS];
  __shared__ float Xc[SBN * SMG];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t slot = blockIdx.x % A.n_slots, nt = blockIdx.x / A.n_slots;
  int64_t base = 0, cnt = 0, e = 0;  // rows [base, base + cnt) (linear: tokens; MoE: sorted rows)
  if constexpr (KIND == kLinear) {
    base = slot * SMG;
    cnt = imin(SMG, A.M - base);
  } else {
    if (slot >= *A.n_small) return;
    e = A.small_list[slot];
    base = A.seg_start[e];
    cnt = A.seg_start[e + 1] - base;
  }
  WDesc wd[NW];
  int64_t K = 0, nout = 0, wrow0 = 0;
  block_weights<KIND>(A, e, wd, K, nout, wrow0);
  const int64_t n0 = nt * SBN;
  if (cnt <= 0 || n0 >= nout) return;

  const int64_t NC = cdiv(K, CH), npass = cdiv(NC, 32);
  // combine role: output (ow, orow, om) of the block
  const int ow = tid / (SBN * SMG), orow = (tid / SMG) % SBN, om = tid % SMG;
  const bool owner = tid < NW * SBN * SMG;
  const int64_t on = n0 + orow;

  for (int64_t g0 = 0; g0 < cnt; g0 += SMG) {
    const int mcnt = static_cast<int>(imin(SMG, cnt - g0));
    const bool own = owner && om < mcnt && on < nout;
    const float* osa = nullptr;
    const uint8_t* oscale = nullptr;
    bool osf32 = false;
    int64_t osrow = 0;
    if (Q && own) {
      const bool second = NW == 2 && ow == 1;  // (selects, not a dynamic index into wd)
      const int obr = second ? wd[NW - 1].br : wd[0].br;
      const int64_t oscols = second ? wd[NW - 1].scols : wd[0].scols;
      oscale = second ? wd[NW - 1].scale : wd[0].scale;
      osf32 = second ? wd[NW - 1].sf32 : wd[0].sf32;
      osa = A.sa + act_row<KIND>(A, base + g0 + om) * A.ldsa;
      osrow = ((wrow0 + on) / obr) * oscols;
    }
    float acc = 0.0f;
    for (int64_t p = 0; p < npass; ++p) {
      const int64_t c = p * 32 + lane;
      if (c < NC) {
        for (int m = 0; m < mcnt; ++m) {
          const float* arow = A.a + act_row<KIND>(A, base + g0 + m) * A.lda;
          // The chunk's chain runs over sub-chunks of 32 columns; the running sum of each (weight, row) lives in
          // its Qs slot between sub-chunks (keeps the register count low: 32 activations + 8 weights at a time).
          for (int sub = 0; sub < CH / 32; ++sub) {
            const int64_t k0 = c * CH + sub * 32;
            const int kv = k0 < K ? static_cast<int>(imin(32, K - k0)) : 0;
            float xv[32];
#pragma unroll
            for (int g = 0; g < 4; ++g) {
              if (kv > 0) {
                acts8(arow, k0 + 8 * g, K, A.a_vec, xv + 8 * g);
              } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) xv[8 * g + i] = 0.0f;
              }
            }
#pragma unroll
            for (int w = 0; w < NW; ++w) {
#pragma unroll 1
              for (int r = 0; r < 4; ++r) {
                float* qp = &Qs[(w * SBN + warp * 4 + r) * SMG + m][lane];
                float acc_s = sub == 0 ? 0.0f : *qp;
                const int64_t n = n0 + warp * 4 + r;
                if (n < nout && kv > 0) {
#pragma unroll
                  for (int g = 0; g < 4; ++g) {
                    float wv[8];
                    weights8<FMT, Q>(wd[w], wrow0 + n, k0 + 8 * g, A.weight_as_bf16, wv);
                    if (kv == 32) {
#pragma unroll
                      for (int i = 0; i < 8; ++i) acc_s = __fmaf_rn(xv[8 * g + i], wv[i], acc_s);
                    } else {
#pragma unroll
                      for (int i = 0; i < 8; ++i)
                        if (8 * g + i < kv) acc_s = __fmaf_rn(xv[8 * g + i], wv[i], acc_s);
                    }
                  }
                }
                *qp = acc_s;
              }
            }
          }
        }
      }
      __syncthreads();
      if (own) {
        const int jn = static_cast<int>(imin(32, NC - p * 32));
        for (int j = 0; j < jn; ++j) {
          const float qj = Qs[tid][j];
          const int64_t cc = p * 32 + j;  // chunk = scale block: bc == CH in (Q)
          const float sw = osf32 ? __ldg(reinterpret_cast<const float*>(oscale) + osrow + cc)
                                 : e8m0_to_float(__ldg(oscale + osrow + cc));
          const float sc = __fmul_rn(osa[(cc * CH) >> 7], sw);
          acc = __fadd_rn(acc, __fmul_rn(qj, sc));
        }
      }
      __syncthreads();
    }
    // epilogue
    if constexpr (KIND == kW13) {
      if (own && ow == 1) Xc[orow * SMG + om] = A.out_bf16 ? round_bf16(acc) : acc;
      __syncthreads();
      if (own && ow == 0) store_out<KIND>(A, base + g0 + om, on, acc, Xc[orow * SMG + om]);
      __syncthreads();
    } else {
      if (own) store_out<KIND>(A, base + g0 + om, on, acc, acc);
    }
  }
}

// ---- row-chain kernel ("small_m", (D)) ----------------------------------------------------------------------------
// One warp = RC_ROWS output rows, lane l owns row n0 + l and runs its whole (D) chain, for MT tokens (sorted rows) at
// once (MT independent accumulators per weight). Data path: a per-warp ring of RC_S slots in shared memory; slot v
// holds bytes [32 v, 32 v + 32) of each of the 32 rows (one 32-byte sector each, two lanes per row, so every cp.async
// instruction moves 16 full sectors) and the activations of the slot's columns for the MT tokens. Slots are filled
// RC_AHEAD ahead with cp.async (no registers held), consumed after cp.async.wait_group + __syncwarp (the copies of
// the other lanes); a slot is refilled only after every lane has passed the __syncwarp that follows its last read.
// Fast path: 16-byte aligned weight rows of a multiple of 32 bytes, 16-byte aligned activation rows, FP8 scale blocks
// a multiple of 32 columns wide. Anything else (tiny odd shapes) runs the plain per-element chain (same order).
constexpr int RC_ROWS = 32;           // output rows per block (one warp)
constexpr int RC_S = 8;               // ring slots
constexpr int RC_AHEAD = RC_S - 1;    // slots in flight ahead of the one being consumed
constexpr int RC_BYTES = 32;          // weight bytes of one row per slot

// Columns of one slot (32 bytes of a row).
template <int FMT>
constexpr int rc_cols() {
  return FMT == kFmtFp4 ? 64 : FMT == kFmtFp8 ? 32 : FMT == kFmtBf16 ? 16 : 8;
}

// cp.async (sm_80+): 16 bytes global -> shared, bypassing L1. Elsewhere (host emulation) a plain copy.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned sa = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem) : "memory");
#else
  *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Wait until at most N of this thread's committed groups are still pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// (D) values of the 8 columns [8p, 8p + 8) of a slot (u = the row's 32 bytes as 8 words), exactly the CPU's:
// FP8 / FP4 code value (bit placement, exact) * block scale (one fp32 multiply; FP4: s0 for columns < 32 of the slot,
// s1 above), BF16 / F32 as stored; then bf16-rounded when rnd (rowchain_kernel drops rnd where the rounding is the
// identity).
template <int FMT>
__device__ __forceinline__ void rc_decode8(const uint32_t* u, int p, float s0, float s1, bool rnd, float* v) {
  if constexpr (FMT == kFmtBf16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t w = u[4 * p + i];
      v[2 * i] = __uint_as_float(w << 16);
      v[2 * i + 1] = __uint_as_float(w & 0xFFFF0000u);
    }
    (void)s0, (void)s1, (void)rnd;
  } else if constexpr (FMT == kFmtF32) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __uint_as_float(u[8 * p + i]);
    if (rnd) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = wround_bf16(v[i]);
    }
    (void)s0, (void)s1;
  } else if constexpr (FMT == kFmtFp8) {
    // byte i of a word moved to the top, arithmetic shift by 4: sign at bit 31, the 7 magnitude bits at 26..20
    // (dec_e4m3's placement; the CPU's SIMD decoder does the same)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t w = u[2 * p + h];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t top = i == 3 ? w : (w << (24 - 8 * i));
        const uint32_t b = static_cast<uint32_t>(static_cast<int32_t>(top) >> 4) & 0x87F00000u;
        v[4 * h + i] = __fmul_rn(__fmul_rn(__uint_as_float(b), 0x1p120f), s0);
      }
    }
    if (rnd) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = wround_bf16(v[i]);
    }
    (void)s1;
  } else {
    // nibble i (element 8p + i: low nibble first) at the top, arithmetic shift by 6: sign at 31, magnitude at 24..22
    const uint32_t w = u[p];
    const float s = p < 4 ? s0 : s1;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t top = i == 7 ? w : (w << (28 - 4 * i));
      const uint32_t b = static_cast<uint32_t>(static_cast<int32_t>(top) >> 6) & 0x81C00000u;
      v[i] = __fmul_rn(__fmul_rn(__uint_as_float(b), 0x1p126f), s);
    }
    (void)rnd;  // an E2M1 code times a power of two has <= 2 significant bits: bf16 rounding is the identity
  }
}

template <int FMT, int KIND, int MT>
__global__ void __launch_bounds__(RC_ROWS) rowchain_kernel(const GArgs A) {
  constexpr int NW = KIND == kW13 ? 2 : 1;
  constexpr int SC = rc_cols<FMT>();               // columns per slot
  constexpr int XCH = SC / 4;                      // 16-byte activation chunks of one token per slot
  constexpr int XI = (MT * XCH + RC_ROWS - 1) / RC_ROWS;  // activation chunks per lane per slot
  constexpr bool QF = FMT == kFmtFp8 || FMT == kFmtFp4;
  __shared__ __align__(16) uint32_t Wr[NW][RC_S][RC_ROWS][RC_BYTES / 4];
  __shared__ __align__(16) float Xr[RC_S][MT * SC];

  const int lane = threadIdx.x;
  const int64_t slot = blockIdx.x % A.n_slots, nt = blockIdx.x / A.n_slots;
  int64_t base = 0, cnt = 0, e = 0;  // rows [base, base + cnt) (linear: tokens; MoE: sorted rows)
  if constexpr (KIND == kLinear) {
    base = slot * MT;
    cnt = imin(MT, A.M - base);
  } else {
    if (slot >= *A.n_small) return;
    e = A.small_list[slot];
    base = A.seg_start[e];
    cnt = A.seg_start[e + 1] - base;
  }
  WDesc wd[NW];
  int64_t K = 0, nout = 0, wrow0 = 0;
  block_weights<KIND>(A, e, wd, K, nout, wrow0);
  const int64_t n0 = nt * RC_ROWS;
  if (cnt <= 0 || n0 >= nout) return;  // (uniform over the warp)
  const int64_t n = n0 + lane;
  const bool row_ok = n < nout;
  const bool wbf16 = A.weight_as_bf16;

  bool fast = A.a_vec;
#pragma unroll
  for (int w = 0; w < NW; ++w)
    fast = fast && wd[w].vec && wd[w].row_bytes % RC_BYTES == 0 && (FMT != kFmtFp8 || wd[w].bc % 32 == 0);

  for (int64_t g0 = 0; g0 < cnt; g0 += MT) {
    const int mc = static_cast<int>(imin(MT, cnt - g0));
    float acc[NW][MT];
#pragma unroll
    for (int w = 0; w < NW; ++w)
#pragma unroll
      for (int t = 0; t < MT; ++t) acc[w][t] = 0.0f;

    if (fast) {
      const int nvec = static_cast<int>(K / SC);
      // this lane's copies: weight rows r = 16 j + lane / 2, half lane % 2 of each 32-byte slot
      const uint8_t* wsrc[NW][2];
      bool won[2];
      int wdst[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int r = 16 * j + (lane >> 1), h = lane & 1;
        won[j] = n0 + r < nout;
        wdst[j] = r * (RC_BYTES / 4) + 4 * h;
#pragma unroll
        for (int w = 0; w < NW; ++w) wsrc[w][j] = wd[w].w + (wrow0 + n0 + r) * wd[w].row_bytes + 16 * h;
      }
      // activation chunk c = lane + 32 i: token c / XCH, columns 4 (c % XCH) .. + 3 of the slot
      const float* xsrc[XI];
      bool xon[XI];
      int xdst[XI];
#pragma unroll
      for (int i = 0; i < XI; ++i) {
        const int c = lane + RC_ROWS * i, t = c / XCH, q = c % XCH;
        xon[i] = c < MT * XCH && t < mc;
        xdst[i] = t * SC + 4 * q;
        xsrc[i] = xon[i] ? A.a + act_row<KIND>(A, base + g0 + t) * A.lda + 4 * q : A.a;
      }
      auto issue = [&](int v) {
        if (v < nvec) {
          const int s = v % RC_S;
#pragma unroll
          for (int j = 0; j < 2; ++j)
            if (won[j]) {
#pragma unroll
              for (int w = 0; w < NW; ++w)
                cp_async16(&Wr[w][s][0][0] + wdst[j], wsrc[w][j] + int64_t(v) * RC_BYTES);
            }
#pragma unroll
          for (int i = 0; i < XI; ++i)
            if (xon[i]) cp_async16(&Xr[s][0] + xdst[i], xsrc[i] + int64_t(v) * SC);
        }
        cp_async_commit();  // one group per slot, empty past the end: the wait count stays uniform
      };
      // block scales of slot v for this lane's row (FP8: one per slot; FP4: two)
      auto scales = [&](int v, float* s0, float* s1) {
#pragma unroll
        for (int w = 0; w < NW; ++w) {
          s0[w] = 1.0f, s1[w] = 1.0f;
          if (QF && row_ok && v < nvec) {
            s0[w] = wscale(wd[w], wrow0 + n, int64_t(v) * SC);
            if (FMT == kFmtFp4) s1[w] = wscale(wd[w], wrow0 + n, int64_t(v) * SC + 32);
          }
        }
      };

      __syncwarp();  // the previous pass has read its last slots before the ring is refilled
#pragma unroll 1
      for (int v = 0; v < RC_AHEAD; ++v) issue(v);
      float ns0[NW], ns1[NW];
      scales(0, ns0, ns1);
#pragma unroll 1
      for (int v = 0; v < nvec; ++v) {
        cp_async_wait<RC_AHEAD - 1>();  // this lane's copies of slot v have landed
        __syncwarp();                   // ... and every other lane's; all lanes are done with slot v - 1
        issue(v + RC_AHEAD);            // refills slot (v - 1) % RC_S
        float cs0[NW], cs1[NW];
#pragma unroll
        for (int w = 0; w < NW; ++w) cs0[w] = ns0[w], cs1[w] = ns1[w];
        scales(v + 1, ns0, ns1);  // one slot ahead
        if (row_ok) {
          const int s = v % RC_S;
          uint32_t u[NW][8];
          bool rnd[NW];
#pragma unroll
          for (int w = 0; w < NW; ++w) {
            const uint4 a = *reinterpret_cast<const uint4*>(&Wr[w][s][lane][0]);
            const uint4 b = *reinterpret_cast<const uint4*>(&Wr[w][s][lane][4]);
            u[w][0] = a.x, u[w][1] = a.y, u[w][2] = a.z, u[w][3] = a.w;
            u[w][4] = b.x, u[w][5] = b.y, u[w][6] = b.z, u[w][7] = b.w;
            // weight_as_bf16: code * 2^(e-127) (E8M0) has <= 4 significant bits, so bf16(v) == v unless the
            // product is a tiny subnormal (scale < 2^-124); F32 scales always round
            if constexpr (FMT == kFmtFp8)
              rnd[w] = wbf16 && (wd[w].sf32 || !(cs0[w] >= 0x1p-124f));
            else
              rnd[w] = wbf16 && FMT == kFmtF32;
          }
          const float* xs = &Xr[s][0];
#pragma unroll
          for (int p = 0; p < SC / 8; ++p) {
            float wv[NW][8];
#pragma unroll
            for (int w = 0; w < NW; ++w) rc_decode8<FMT>(u[w], p, cs0[w], cs1[w], rnd[w], wv[w]);
#pragma unroll
            for (int t = 0; t < MT; ++t) {
              if (t < mc) {
                const float4 xa = *reinterpret_cast<const float4*>(xs + t * SC + 8 * p);
                const float4 xb = *reinterpret_cast<const float4*>(xs + t * SC + 8 * p + 4);
                const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                for (int c = 0; c < 8; ++c)
#pragma unroll
                  for (int w = 0; w < NW; ++w) acc[w][t] = __fmaf_rn(xv[c], wv[w][c], acc[w][t]);
              }
            }
          }
        }
      }
      cp_async_wait<0>();
    } else if (row_ok) {
      // plain chain, any shape / alignment
      const uint8_t* rp[NW];
#pragma unroll
      for (int w = 0; w < NW; ++w) rp[w] = wd[w].w + (wrow0 + n) * wd[w].row_bytes;
      const float* xr[MT];
#pragma unroll
      for (int t = 0; t < MT; ++t) xr[t] = A.a + act_row<KIND>(A, base + g0 + (t < mc ? t : 0)) * A.lda;
#pragma unroll 1
      for (int64_t k = 0; k < K; ++k) {
        float wv[NW];
#pragma unroll
        for (int w = 0; w < NW; ++w)
          wv[w] = dequant<FMT>(code1<FMT>(rp[w], k), QF ? wscale(wd[w], wrow0 + n, k) : 1.0f, wbf16);
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          if (t < mc) {
            const float xv = __ldg(xr[t] + k);
#pragma unroll
            for (int w = 0; w < NW; ++w) acc[w][t] = __fmaf_rn(xv, wv[w], acc[w][t]);
          }
        }
      }
    }
    if (row_ok) {
#pragma unroll
      for (int t = 0; t < MT; ++t)
        if (t < mc) store_out<KIND>(A, base + g0 + t, n, acc[0][t], acc[NW - 1][t]);
    }
  }
}

// ---- fast decode kernel ("gemv", the default for n_tok <= 8; NOT the CPU's summation order) -----------------------
// A split-K GEMV that streams the weights at memory speed: a block of 8 warps covers R rows per warp group
// (R = 4; 2 for w1 + w3) and KS = 1, 2, 4 or 8 warps split K between them (chosen from the shape alone: gv_plan).
// Lane l of warp slice ks reads the 16-byte chunks c = (ks + KS j) * 32 + l of each of its R rows (coalesced
// 16-byte loads, GV_U chunks x R rows in flight per lane), decodes them (FP8 / FP4 through the hardware
// e4m3x2 -> f16x2 conversion; FP4 by moving each E2M1 nibble into E4M3 bit positions, which reads as the E2M1 value
// times 2^-6, exact) and accumulates per chunk: part = sum_j x[j] * code[j] (fma chain over the chunk's columns), then
// acc = fma(part, scale, acc) with scale = sw (x 64 for FP4) and, in (Q), times the activation block scale sa.
// The lanes' accumulators are added by a xor butterfly (lane 0's result), the KS warp slices through shared memory in
// slice order. Everything is a fixed function of the shape: the result is deterministic, and a token's output does
// not depend on the other tokens of the call (MT tokens share each weight load, each with its own accumulators).
// It differs from the CPU's order (gemm.h) by fp32 rounding only; tests/gpu/test_ops_gemm.cpp states the tolerance.
// Needs: rows of a multiple of 16 bytes, K a multiple of the chunk's columns, FP8 scale blocks a multiple of 16
// columns wide, 16-byte aligned activation rows (gv_plan / the launchers check; else the small_m kernels run).
// E4M3 NaN codes (0x7F / 0xFF, which checkpoints do not use) decode to NaN here (the CPU's decoders give +-480).
constexpr int GV_THREADS = 256, GV_WARPS = 8, GV_U = 2;
constexpr int64_t kGvWarpTarget = 2048;  // row-group warps a matrix should give before K is split further

template <int FMT>
__host__ __device__ constexpr int gv_cols() {  // columns of one 16-byte chunk
  return FMT == kFmtFp4 ? 32 : FMT == kFmtFp8 ? 16 : FMT == kFmtBf16 ? 8 : 4;
}
template <int KIND>
__host__ __device__ constexpr int gv_rows() {  // rows per warp
  return KIND == kW13 ? 2 : 4;
}

// Two e4m3 bytes (low 16 bits of b) -> two floats (hardware conversion, exact).
__device__ __forceinline__ float2 gv_e4m3x2(uint32_t b) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(b & 0xFFFFu), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// Values of columns [8 p, 8 p + SUB) of a chunk (words u[0..3]): FP8 codes, FP4 codes times 2^-6, BF16 / F32 values.
template <int FMT>
__device__ __forceinline__ void gv_decode(const uint4& u4, int p, float* v) {
  const uint32_t u[4] = {u4.x, u4.y, u4.z, u4.w};
  if constexpr (FMT == kFmtFp8) {  // 8 columns = words 2p, 2p + 1, byte j of a word = column 4 (word) + j
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t w = u[2 * p + h];
      const float2 a = gv_e4m3x2(w), b = gv_e4m3x2(w >> 16);
      v[4 * h] = a.x, v[4 * h + 1] = a.y, v[4 * h + 2] = b.x, v[4 * h + 3] = b.y;
    }
  } else if constexpr (FMT == kFmtFp4) {  // 8 columns = word p, nibble j = column j (low nibble = even column)
    uint32_t ev, od;  // columns 0, 2, 4, 6 and 1, 3, 5, 7 as e4m3 bytes
    fp4_as_e4m3(u[p], ev, od);
    const float2 e0 = gv_e4m3x2(ev), e1 = gv_e4m3x2(ev >> 16), o0 = gv_e4m3x2(od), o1 = gv_e4m3x2(od >> 16);
    v[0] = e0.x, v[2] = e0.y, v[4] = e1.x, v[6] = e1.y;
    v[1] = o0.x, v[3] = o0.y, v[5] = o1.x, v[7] = o1.y;
  } else if constexpr (FMT == kFmtBf16) {  // the chunk's 8 columns
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(u[i] << 16);
      v[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
    }
    (void)p;
  } else {  // F32: the chunk's 4 columns
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __uint_as_float(u[i]);
    (void)p;
  }
}

// FQ (fused act_quant, single-token (Q) linears with K % 128 == 0): A.a holds the raw activations; every lane
// quantizes its chunk itself, the 128-column block's amax taken over the 128 / CC lanes that hold it (xor shuffles
// within the lane group), with act_quant_kernel's functions: the same codes and scales, one launch less.
template <int FMT, bool Q, int KIND, int MT, bool FQ = false>
__global__ void __launch_bounds__(GV_THREADS) gemv_kernel(const GArgs A) {
  static_assert(!FQ || (Q && MT == 1 && KIND == kLinear), "fused act_quant: single-token (Q) linears");
  constexpr int NW = KIND == kW13 ? 2 : 1;
  constexpr int R = gv_rows<KIND>();
  constexpr int CC = gv_cols<FMT>();
  constexpr int SUB = CC < 8 ? CC : 8;
  constexpr bool QF = FMT == kFmtFp8 || FMT == kFmtFp4;
  constexpr float WMUL = FMT == kFmtFp4 ? 64.0f : 1.0f;
  __shared__ float red[GV_WARPS][NW * R * MT];
  pdl_wait();
  pdl_launch_dependents();

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int KS = A.gv_ks, ks = warp % KS, wr = warp / KS;
  const int rpb = R * (GV_WARPS / KS);
  const int64_t slot = blockIdx.x % A.n_slots, nt = blockIdx.x / A.n_slots;
  int64_t base = 0, cnt = 0, e = 0;  // rows [base, base + cnt) (linear: tokens; MoE: sorted rows)
  if constexpr (KIND == kLinear) {
    base = slot * MT;
    cnt = imin(MT, A.M - base);
  } else {
    if (slot >= *A.n_small) return;
    e = A.small_list[slot];
    base = A.seg_start[e];
    cnt = A.seg_start[e + 1] - base;
  }
  WDesc wd[NW];
  int64_t K = 0, nout = 0, wrow0 = 0;
  block_weights<KIND>(A, e, wd, K, nout, wrow0);
  const int64_t grp = KIND == kLinear ? int64_t(blockIdx.y) : 0;  // grouped linear: group grp (else 0)
  const float* a_g = A.a;
  int64_t y_g = 0;
  if constexpr (KIND == kLinear) {
    wrow0 += grp * A.grp_r;
    a_g += grp * A.grp_a;
    y_g = grp * A.grp_y;
  }
  const int64_t nb0 = nt * rpb;
  if (cnt <= 0 || nb0 >= nout) return;  // (uniform over the block)
  const int64_t n0 = nb0 + int64_t(wr) * R;
  const int64_t C = wd[0].row_bytes / 16;
  const bool wbf = A.weight_as_bf16 && !Q && FMT != kFmtBf16;

  for (int64_t g0 = 0; g0 < cnt; g0 += MT) {
    const int mc = static_cast<int>(imin(MT, cnt - g0));
    const float* xr[MT];
    const float* sr[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      const int64_t ar = act_row<KIND>(A, base + g0 + (t < mc ? t : 0));
      xr[t] = a_g + ar * A.lda;
      sr[t] = Q ? A.sa + ar * A.ldsa : nullptr;
    }
    float acc[NW][R][MT];
#pragma unroll
    for (int w = 0; w < NW; ++w)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < MT; ++t) acc[w][r][t] = 0.0f;

    for (int64_t c0 = int64_t(ks) * 32 + lane; c0 < C; c0 += int64_t(32) * KS * GV_U) {
      uint4 wv[GV_U][NW][R];
#pragma unroll
      for (int u = 0; u < GV_U; ++u) {
        const int64_t c = c0 + int64_t(u) * 32 * KS;
#pragma unroll
        for (int w = 0; w < NW; ++w)
#pragma unroll
          for (int r = 0; r < R; ++r)
            wv[u][w][r] = (c < C && n0 + r < nout)
                              ? gv_load16(wd[w].w + (wrow0 + n0 + r) * wd[w].row_bytes + c * 16, wd[w].vec)
                              : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < GV_U; ++u) {
        const int64_t c = c0 + int64_t(u) * 32 * KS;
        if (c < C) {
          const int64_t k0 = c * CC;
          float ws[NW][R];
#pragma unroll
          for (int w = 0; w < NW; ++w)
#pragma unroll
            for (int r = 0; r < R; ++r) {
              ws[w][r] = 1.0f;
              if constexpr (QF) ws[w][r] = n0 + r < nout ? __fmul_rn(wscale(wd[w], wrow0 + n0 + r, k0), WMUL) : 0.0f;
            }
          float part[NW][R][MT];
#pragma unroll
          for (int w = 0; w < NW; ++w)
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int t = 0; t < MT; ++t) part[w][r][t] = 0.0f;
          float xq[FQ ? CC : 1];  // FQ: the chunk's activation codes
          float fsa = 1.0f;       // FQ: their block scale
          if constexpr (FQ) {
            constexpr int G = 128 / CC;  // lanes of one 128-column block (consecutive, aligned)
            const float* xp = xr[0] + k0;
#pragma unroll
            for (int q = 0; q < CC / 4; ++q) {
              const float4 f = __ldg(reinterpret_cast<const float4*>(xp) + q);
              xq[4 * q] = f.x, xq[4 * q + 1] = f.y, xq[4 * q + 2] = f.z, xq[4 * q + 3] = f.w;
            }
            float m = 0.0f;
#pragma unroll
            for (int j = 0; j < CC; ++j) {
              const float a = fabsf(xq[j]);
              m = a > m ? a : m;
            }
            const unsigned gmask = ((1u << G) - 1u) << (lane & ~(G - 1));
#pragma unroll
            for (int o = 1; o < G; o <<= 1) {
              const float t2 = __shfl_xor_sync(gmask, m, o);
              m = t2 > m ? t2 : m;
            }
            fsa = fp8_act_scale(m);
            const float inv = __fdiv_rn(1.0f, fsa);
#pragma unroll
            for (int j = 0; j < CC; ++j) xq[j] = fp8_quant(xq[j], inv);
          }
#pragma unroll
          for (int p = 0; p < CC / SUB; ++p) {
            float wvals[NW][R][SUB];
#pragma unroll
            for (int w = 0; w < NW; ++w)
#pragma unroll
              for (int r = 0; r < R; ++r) {
                gv_decode<FMT>(wv[u][w][r], p, wvals[w][r]);
                if (wbf) {  // (D) weight_as_bf16: bf16(dequantized weight), the scale applied per element
#pragma unroll
                  for (int j = 0; j < SUB; ++j)
                    wvals[w][r][j] = wround_bf16(QF ? __fmul_rn(wvals[w][r][j], ws[w][r]) : wvals[w][r][j]);
                }
              }
#pragma unroll
            for (int t = 0; t < MT; ++t) {
              if (t < mc) {
                float x[SUB];
                if constexpr (FQ) {
#pragma unroll
                  for (int j = 0; j < SUB; ++j) x[j] = xq[p * SUB + j];
                } else {
                  const float* xp = xr[t] + k0 + p * SUB;
#pragma unroll
                  for (int q = 0; q < SUB / 4; ++q) {
                    const float4 f = __ldg(reinterpret_cast<const float4*>(xp) + q);
                    x[4 * q] = f.x, x[4 * q + 1] = f.y, x[4 * q + 2] = f.z, x[4 * q + 3] = f.w;
                  }
                }
#pragma unroll
                for (int w = 0; w < NW; ++w)
#pragma unroll
                  for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int j = 0; j < SUB; ++j) part[w][r][t] = __fmaf_rn(x[j], wvals[w][r][j], part[w][r][t]);
              }
            }
          }
#pragma unroll
          for (int t = 0; t < MT; ++t) {
            if (t < mc) {
              const float sa = FQ ? fsa : Q ? __ldg(sr[t] + (k0 >> 7)) : 1.0f;
#pragma unroll
              for (int w = 0; w < NW; ++w)
#pragma unroll
                for (int r = 0; r < R; ++r) {
                  const float s = (QF && !wbf) ? __fmul_rn(sa, ws[w][r]) : 1.0f;
                  acc[w][r][t] = __fmaf_rn(part[w][r][t], s, acc[w][r][t]);
                }
            }
          }
        }
      }
    }
    // lanes: xor butterfly (lane 0's sum is used), then the KS slices in order
#pragma unroll
    for (int w = 0; w < NW; ++w)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          float v = acc[w][r][t];
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
          if (lane == 0) red[warp][(w * R + r) * MT + t] = v;
        }
    __syncthreads();
    for (int o = tid; o < (GV_WARPS / KS) * R * MT; o += GV_THREADS) {
      const int owr = o / (R * MT), r = (o / MT) % R, t = o % MT;
      const int64_t n = nb0 + int64_t(owr) * R + r;
      if (t >= mc || n >= nout) continue;
      float s[NW];
#pragma unroll
      for (int w = 0; w < NW; ++w) {
        s[w] = red[owr * KS][(w * R + r) * MT + t];
        for (int q = 1; q < KS; ++q) s[w] = __fadd_rn(s[w], red[owr * KS + q][(w * R + r) * MT + t]);
      }
      store_out<KIND>(A, base + g0 + t, n, s[0], s[NW - 1], y_g);
    }
    __syncthreads();  // red is reused by the next group of tokens
  }
}

// ---- gemv_tc_kernel: (Q) FP8 linear of 1..8 tokens on tensor cores (fast mode) -------------------------------------
// y[m, n] = sum over 128-column blocks kb of (sum_k xcode[m, k] wcode[n, k]) * sa[m, kb] * sw[n / 128, kb], the
// products by mma.sync m16n8k32 e4m3 (exact; the tensor core's fp32 sums inside one mma, each mma's result added in
// fp32 as tc_kernel does) instead of decoding every weight to fp32. The block quantizes x itself into shared memory
// (act_quant_kernel's codes and scales, warp_act_quant128).
// Work: 16-row tiles; KS warps (1, 2, 4 or 8, from the shape: gemv_tc_ks) split a tile's K, so a block of 8 warps
// covers 8 / KS tiles at a time (a "group"). The grid is persistent (at most the blocks that fit the GPU at once):
// block b takes groups b, b + gridDim.x, ... and each warp streams its (tile, 128-column block) items through a ring
// of GT_PF items in registers, the next items' loads (weights and their scale) in flight while it runs the mma of
// the current one, across tile boundaries too: one prologue per block, no waves of short blocks.
// Lane (g, t) loads 16 bytes at 16 t and 64 + 16 t of each 128-column block of the tile's rows g and g + 8, and
// token g's codes at the same columns: the four mma of a block see the columns permuted alike in A and B (the same
// products). Column m of D is token m (an output never depends on another column), so a token's result is the same
// alone or with up to 7 others. A warp adds its items in ascending kb, the KS slices are added in slice order
// (deterministic; the order depends on the shape only).
// A pair (linear_pair: two matrices of one K and format on the same x, e.g. the shared expert's w1 and w3, or wq_a
// and wkv) runs as one matrix of both matrices' tiles: tiles [n_mat, n_mat + nout2 / 16) are W2's and go to y2; x is
// quantized once. Both matrices take the KS that each would take alone (the launcher checks that it is the same), so
// every output equals its own linear() bitwise.
constexpr int GT_THREADS = 256, GT_WARPS = 8, GT_ROWS = 16, GT_MAXK = 8192, GT_PF = 4, GT_MAXTOK = 8;
constexpr int GT_XPAD = 64;               // shared-memory row padding of the codes (conflict-free 16-byte reads)
constexpr int64_t kGtWarpTarget = 2048;   // (tile, slice) warp tasks a matrix should give before K is split further

// Warps per tile (K slices) of an nout-row matrix: the fewest (1, 2, 4, 8) that give kGtWarpTarget warp tasks.
int gemv_tc_ks(int64_t nout) {
  const int64_t tiles = nout / GT_ROWS;
  int ks = 1;
  while (ks < GT_WARPS && tiles * ks < kGtWarpTarget) ks *= 2;
  return ks;
}

size_t gemv_tc_smem(int64_t n_tok, int64_t K) {
  return size_t(n_tok * (K + GT_XPAD)) + size_t(n_tok * (K / 128)) * 4;
}

__global__ void __launch_bounds__(GT_THREADS, 2) gemv_tc_kernel(const GArgs A) {
  extern __shared__ __align__(16) uint8_t gt_smem[];
  __shared__ float red[GT_WARPS][GT_MAXTOK][GT_ROWS];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t M = A.M, K = A.W.cols, nkb = K / 128, Kp = K + GT_XPAD;
  const int KS = A.gv_ks, tpb = GT_WARPS / KS, wt = warp / KS, ks = warp % KS;
  const int64_t kbw = nkb / KS;                               // items of a warp per tile
  const bool pair = A.y2 != nullptr;                          // tiles [n_mat, n_tiles) are W2's
  const int64_t n_mat = A.nout / GT_ROWS, n_tiles = pair ? n_mat + A.nout2 / GT_ROWS : n_mat;
  const int64_t n_groups = cdiv(n_tiles, tpb);
  const int64_t n_mine = int64_t(blockIdx.x) < n_groups ? cdiv(n_groups - blockIdx.x, gridDim.x) : 0;
  const int64_t n_items = n_mine * kbw, tile_step = int64_t(gridDim.x) * tpb;
  uint8_t* xq = gt_smem;                                      // activation codes (e4m3 bytes) [M, Kp]
  float* xs = reinterpret_cast<float*>(gt_smem + M * Kp);     // their scales [M, K / 128]
  const WDesc wd = make_wdesc(A.W), wd2 = pair ? make_wdesc(A.W2) : wd;
  const int64_t kbs = int64_t(ks) * kbw;                      // the warp's first 128-column block

  // the ring: weights of items i .. i + GT_PF - 1 and the raw bits of their weight scales
  uint4 wv[GT_PF][4];
  uint32_t sv[GT_PF];
  int64_t l_tile = int64_t(blockIdx.x) * tpb + wt, l_kb = 0;  // next item to load
  auto load = [&](uint4 (&w)[4], uint32_t& s) {
    if (l_tile < n_tiles) {  // (past the block's last item: l_tile >= n_tiles)
      const bool second = l_tile >= n_mat;
      const int64_t row = second ? (l_tile - n_mat) * GT_ROWS : A.r0 + l_tile * GT_ROWS, kb = kbs + l_kb;
      const uint8_t* scale = second ? wd2.scale : wd.scale;
      const uint8_t* p = (second ? wd2.w : wd.w) + (row + g) * wd.row_bytes + kb * 128 + 16 * t;
      w[0] = __ldg(reinterpret_cast<const uint4*>(p));
      w[1] = __ldg(reinterpret_cast<const uint4*>(p + 64));
      w[2] = __ldg(reinterpret_cast<const uint4*>(p + 8 * wd.row_bytes));
      w[3] = __ldg(reinterpret_cast<const uint4*>(p + 8 * wd.row_bytes + 64));
      const int64_t si = (wd.br_sh >= 0 ? row >> wd.br_sh : row / wd.br) * wd.scols + kb;  // (br % 16 == 0)
      s = wd.sf32 ? __float_as_uint(__ldg(reinterpret_cast<const float*>(scale) + si)) : uint32_t(__ldg(scale + si));
    }
    if (++l_kb == kbw) l_kb = 0, l_tile += tile_step;
  };
#pragma unroll
  for (int s = 0; s < GT_PF; ++s) load(wv[s], sv[s]);  // in flight while the block quantizes x
  // (PDL, device_pdl.cuh: the loads above read weights only; x and y belong to the kernels around this one)
  pdl_wait();
  pdl_launch_dependents();

  for (int64_t q = warp; q < M * nkb; q += GT_WARPS) {  // act_quant_kernel's codes and scale of (token, block)
    const int64_t m = q / nkb, b = q % nkb;
    float c[4];
    const float sc = warp_act_quant128(A.a + m * A.lda + b * 128, 128, lane, c);
#pragma unroll
    for (int j = 0; j < 4; ++j) xq[m * Kp + b * 128 + j * 32 + lane] = static_cast<uint8_t>(enc_e4m3(c[j]));
    if (lane == 0) xs[m * nkb + b] = sc;
  }
  __syncthreads();

  const bool has_tok = g < M;            // lane (g, t) supplies token g's codes (column g of B)
  const int m0 = 2 * t, m1 = 2 * t + 1;  // D columns of this lane
  float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // (row g, m0), (row g, m1), (row g + 8, m0), (row g + 8, m1)
  int64_t c_tile = int64_t(blockIdx.x) * tpb + wt, c_kb = 0;  // item being consumed
  for (int64_t i0 = 0; i0 < n_items; i0 += GT_PF) {
#pragma unroll
    for (int s = 0; s < GT_PF; ++s) {
      if (i0 + s < n_items) {  // (uniform over the block: every warp has n_items items)
        const int64_t kb = kbs + c_kb;
        uint4 x0 = make_uint4(0u, 0u, 0u, 0u), x1 = x0;
        if (has_tok) {
          x0 = *reinterpret_cast<const uint4*>(xq + g * Kp + kb * 128 + 16 * t);
          x1 = *reinterpret_cast<const uint4*>(xq + g * Kp + kb * 128 + 64 + 16 * t);
        }
        const uint4 &r0 = wv[s][0], &r1 = wv[s][1], &q0 = wv[s][2], &q1 = wv[s][3];
        const uint32_t a0[4] = {r0.x, q0.x, r0.y, q0.y}, a1[4] = {r0.z, q0.z, r0.w, q0.w};
        const uint32_t a2[4] = {r1.x, q1.x, r1.y, q1.y}, a3[4] = {r1.z, q1.z, r1.w, q1.w};
        float blk[4], d[4];
        tc_mma(a0, x0.x, x0.y, blk);
        tc_mma(a1, x0.z, x0.w, d);
#pragma unroll
        for (int j = 0; j < 4; ++j) blk[j] = __fadd_rn(blk[j], d[j]);
        tc_mma(a2, x1.x, x1.y, d);
#pragma unroll
        for (int j = 0; j < 4; ++j) blk[j] = __fadd_rn(blk[j], d[j]);
        tc_mma(a3, x1.z, x1.w, d);
#pragma unroll
        for (int j = 0; j < 4; ++j) blk[j] = __fadd_rn(blk[j], d[j]);
        const float sw = wd.sf32 ? __uint_as_float(sv[s]) : e8m0_to_float(sv[s]);
        load(wv[s], sv[s]);  // the item GT_PF ahead into the slot just used
        const float s0m = m0 < M ? __fmul_rn(xs[m0 * nkb + kb], sw) : 0.0f;
        const float s1m = m1 < M ? __fmul_rn(xs[m1 * nkb + kb], sw) : 0.0f;
        tot[0] = __fmaf_rn(blk[0], s0m, tot[0]);
        tot[1] = __fmaf_rn(blk[1], s1m, tot[1]);
        tot[2] = __fmaf_rn(blk[2], s0m, tot[2]);
        tot[3] = __fmaf_rn(blk[3], s1m, tot[3]);
        if (++c_kb == kbw) {  // the tile's slice is done (uniform: every warp ends a slice on the same item)
          const int64_t n0 = (c_tile >= n_mat ? c_tile - n_mat : c_tile) * GT_ROWS;
          const bool tile_ok = c_tile < n_tiles;
          if (KS == 1) {
            if (tile_ok) {
              float* y = (c_tile >= n_mat ? A.y2 : A.y) + n0 + g;
              const int64_t ldy = c_tile >= n_mat ? A.ldy2 : A.ldy;
              if (m0 < M) y[m0 * ldy] = A.out_bf16 ? round_bf16(tot[0]) : tot[0];
              if (m1 < M) y[m1 * ldy] = A.out_bf16 ? round_bf16(tot[1]) : tot[1];
              if (m0 < M) y[m0 * ldy + 8] = A.out_bf16 ? round_bf16(tot[2]) : tot[2];
              if (m1 < M) y[m1 * ldy + 8] = A.out_bf16 ? round_bf16(tot[3]) : tot[3];
            }
          } else {
            if (m0 < M) red[warp][m0][g] = tot[0], red[warp][m0][g + 8] = tot[2];
            if (m1 < M) red[warp][m1][g] = tot[1], red[warp][m1][g + 8] = tot[3];
            __syncthreads();
            const int64_t tile0 = c_tile - wt;  // the group's first tile
            for (int o = tid; o < tpb * M * GT_ROWS; o += GT_THREADS) {
              const int tw = o / int(M * GT_ROWS), m = (o / GT_ROWS) % int(M), r = o % GT_ROWS;
              const int64_t tl = tile0 + tw;
              if (tl >= n_tiles) continue;
              float v = red[tw * KS][m][r];
              for (int q = 1; q < KS; ++q) v = __fadd_rn(v, red[tw * KS + q][m][r]);
              if (tl >= n_mat)
                A.y2[m * A.ldy2 + (tl - n_mat) * GT_ROWS + r] = A.out_bf16 ? round_bf16(v) : v;
              else
                A.y[m * A.ldy + tl * GT_ROWS + r] = A.out_bf16 ? round_bf16(v) : v;
            }
            __syncthreads();  // red is reused by the next group
          }
          tot[0] = tot[1] = tot[2] = tot[3] = 0.0f;
          c_kb = 0;
          c_tile += tile_step;
        }
      }
    }
  }
}

// ---- moe_tc_small_kernel: the small segments (1..16 rows) of FP4 (Q) experts on tensor cores (fast mode) ----------
// gemv_kernel's products for the MoE kinds (kW13: w1 and w3 of the expert, then SwiGLU; kW2) on f16 tensor cores
// (mma.sync m16n8k16, fp32 accumulation). The FP4 weights' per-32 scales differ by row, so every 32-column scale
// group has its own pair of mmas and its result is scaled in fp32 (as tc_kernel does).
// Order per output: per 128-column block, d_s = the 32 products of group s summed by two f16 mmas (columns 0..3 of
// every 8 of the group, then columns 4..7 onto that sum), p = d_0 sw_0, then p = fma(d_s, sw_s, p) for s = 1..3
// (sw: the rows' E8M0 scales), acc = fma(p, sa, acc) (sa: the activation's block scale) over the warp's blocks in
// ascending order from 0, then the 8 warps' sums added in warp order. Every product is exact; the sums differ from
// the CPU's order by fp32 rounding (the fast mode's tolerance). That order depends on the shape only, and a row's
// result does not depend on the other rows of the call or their number (the columns of an mma do not mix):
// deterministic and batch invariant.
// These are the mmas ptxas (CUDA 13.0) made of the e4m3 mma.sync m16n8k32 this kernel issued before (sm_90 has no
// FP8 mma.sync; it converted both operands' e4m3 codes to f16 for every mma, the weights' codes being the E2M1
// values x 2^-6, and added + 0 to the result). Now the weights go from FP4 straight to f16 as the E2M1 values x 2^-14
// (fp4_as_f16x2_bits: bit placement, no conversion), the activation codes are converted once per block (below), the
// block scale carries the 2^14 (sa x 2^14 instead of sa x 2^6) and the + 0 is gone: d is the old d x 2^-8 and every
// later product the old one, so the results are the old kernel's (on sm_90; where no fp32 product of a scale is
// subnormal, i.e. weight scales >= 2^-100) but for E8M0 codes 0 and 255, decoded as moe_tc_big_kernel decodes them
// (e8m0_byte_fast: code 0 as 0 instead of 2^-127, which changes only groups with nonzero weights by less than 2^-100
// of their products (such groups are all zero in real checkpoints); code 255 as infinity instead of NaN).
// Fragments: lane (g, t) takes the 4-byte word 16 s + 4 t of the tile's rows g, g + 8 in each 64-byte (128-column)
// block, i.e. columns 32 s + 8 t .. + 7 of group s, as f16 pairs of columns 0, 2 | 1, 3 | 4, 6 | 5, 7: the first mma
// takes pairs (0, 2), (1, 3) of rows g and g + 8 as a0..a3, the second (4, 6), (5, 7). B's column n is the segment's
// row g0 + n (rows taken 8 at a time). The activation codes (exact e4m3 values) are staged once per block in shared
// memory in that order: kW2 as f16 (16 bytes per 8 columns: one 16-byte load gives a lane the B pairs of a group),
// kW13 as e4m3 bytes (per 8 columns the 4 even ones, then the 4 odd ones: one 8-byte load and 4 conversions per group,
// for both matrices), because f16 codes of K = 4096 would leave room for one block per SM only. Staged rows are
// padded so that the rows one load phase reads lie on different banks.
// Work: blockIdx.x = bt * n_slots + slot: the block takes expert slot's 16-row output tiles bt, bt + n_bt, ...
// (n_bt = gridDim.x / n_slots: the launcher sizes the grid to what the GPU holds at once), its 8 warps splitting K;
// every warp streams its (tile, KB x 128-column blocks) items through its own ring of mt_pf(KIND, KB) stages in
// shared memory: each stage is filled by cp.async (16 bytes per lane, whole row blocks: one pass over the lines,
// nothing held in registers while in flight; each lane's sources are set per tile and advanced per item) and read
// back by ldmatrix, whose fragment layout hands lane (g, t) exactly word t of a row's 16-byte scale group. KB = 2 (K
// a multiple of 2048: an item covers 128 contiguous bytes of each of its 16 rows, a whole cache line) where
// possible: items of 64 bytes per row (half lines) streamed at most ~2.0 TB/s on an H100 even without any
// arithmetic, whole lines at 3.0 (a microbenchmark of the two patterns); KB = 1 otherwise. Each 128-column block of
// a stage is stored as its own 16 x 64-byte sub-block, the rows' four 16-byte chunks XOR-swizzled by (row / 2) % 4,
// so the 8 rows one ldmatrix phase reads hit 8 different bank groups; its 16 scale words follow, those of rows r
// and r + 8 side by side (one 8-byte load per lane). So the expert's pointers and the staged activations are paid
// once per block. A warp consumes its 128-column blocks in the same order whatever KB, and the 8 warps' sums are
// added in warp order (the order depends on the shape only, not on the grid or KB).
constexpr int MT_THREADS = 256, MT_WARPS = 8, MT_ROWS = 16, MT_COLS = 8, MT_MAXK = 8192;
constexpr int64_t kMtMaxTiles = 8;  // output tiles one block of moe_tc_small_kernel takes at most
constexpr int MT_WBYTES = MT_ROWS * 64, MT_SBYTES = MT_ROWS * 4;  // a 128-column block's weight / scale bytes

// ring stages per warp; bytes of one stage (all matrices)
__host__ __device__ constexpr int mt_pf(int kind, int kb) {
  return kb == 2 ? (kind == kW13 ? 2 : 3) : (kind == kW13 ? 3 : 4);
}
__host__ __device__ constexpr int mt_stage_bytes(int kind, int kb) {
  return (kind == kW13 ? 2 : 1) * kb * (MT_WBYTES + MT_SBYTES);
}
// 128-column blocks per item for the product's K (see above)
int mt_kb(int64_t K) { return (K / 128) % (2 * MT_WARPS) == 0 ? 2 : 1; }

// The activations staged as f16 (kW2) or as e4m3 codes (kW13), see above; bytes of a staged row for K: 64 more than a
// multiple of 128 for f16 (16-byte loads: the 2 rows of a phase on all banks), 32 more for e4m3 (8-byte loads: 4 rows).
__host__ __device__ constexpr bool mt_f16_act(int kind) { return kind == kW2; }
__host__ __device__ constexpr int64_t mt_act_pitch(int kind, int64_t K) {
  return mt_f16_act(kind) ? 2 * K + 64 : K + 32;
}

// Dynamic shared memory of moe_tc_small_kernel<KIND, KB> for K: the 8 rows' staged activations and their scales
// [K / 128, 8], then the warps' rings.
size_t moe_tc_smem(int kind, int kb, int64_t K) {
  return size_t(MT_COLS * mt_act_pitch(kind, K)) + size_t(MT_COLS * (K / 128)) * 4 +
         size_t(MT_WARPS * mt_pf(kind, kb) * mt_stage_bytes(kind, kb));
}

// Byte offset of 16-byte chunk c of row r (0..15) in a stage's weight block (the bank swizzle above).
__device__ __forceinline__ int mt_chunk(int r, int c) { return r * 64 + 16 * (c ^ ((r >> 1) & 3)); }
// Byte offset of row r's scale word (r = 0..15) in a stage's scale block: rows r, r + 8 side by side.
__device__ __forceinline__ int mt_sword(int r) { return 8 * (r & 7) + 4 * (r >> 3); }

// 8 bytes of shared memory at a shared-window address.
__device__ __forceinline__ uint2 mt_lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

// tc_mma_f16_pair's B for group s of a 128-column block, from the lane's staged 8 columns at x (F16: f16 pairs of
// columns 0, 2 | 1, 3 | 4, 6 | 5, 7; else e4m3 codes of columns 0, 2, 4, 6 then 1, 3, 5, 7, converted here).
template <bool F16>
__device__ __forceinline__ void mt_act_pairs(const uint8_t* x, uint32_t (&b)[4]) {
  if constexpr (F16) {
    const uint4 v = *reinterpret_cast<const uint4*>(x);
    b[0] = v.x, b[1] = v.y, b[2] = v.z, b[3] = v.w;
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(x);
    b[0] = e4m3x2_as_f16x2<false>(v.x), b[1] = e4m3x2_as_f16x2<false>(v.y);
    b[2] = e4m3x2_as_f16x2<true>(v.x), b[3] = e4m3x2_as_f16x2<true>(v.y);
  }
}

// f16 pair (lo = a, hi = b) of two exact e4m3 values (exact); e4m3 byte pair likewise.
__device__ __forceinline__ uint32_t mt_f16x2(float a, float b) {
  const __half2_raw h = __floats2half2_rn(a, b);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}
__device__ __forceinline__ uint32_t mt_e4m3x2(float a, float b) {
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}

// The block's work on expert slot `slot` (see moe_tc_small_kernel); every weight row is 16-byte aligned and every
// scale row 4-byte aligned (MoeGemmArgs::w16_ok, words_ok).
template <int KIND, int KB>
__device__ __forceinline__ void moe_tc_small_run(const GArgs& A, const WDesc (&wd)[KIND == kW13 ? 2 : 1], int64_t K64,
                                                 int64_t n_tiles, int64_t wrow0, int64_t base, int64_t cnt,
                                                 int64_t bt, int64_t n_bt, int64_t n_mine,
                                                 float (&red)[MT_WARPS][KIND == kW13 ? 2 : 1][MT_COLS][MT_ROWS]) {
  constexpr int NW = KIND == kW13 ? 2 : 1;
  constexpr bool F16A = mt_f16_act(KIND);
  constexpr int PF = mt_pf(KIND, KB), SB = mt_stage_bytes(KIND, KB), MB = KB * (MT_WBYTES + MT_SBYTES);
  extern __shared__ __align__(16) uint8_t mt_smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int K = static_cast<int>(K64), nkb = K / 128, pitch = static_cast<int>(mt_act_pitch(KIND, K));
  // kbw items of KB blocks per warp and tile; the warp's blocks start at kbs
  const int kbw = nkb / MT_WARPS / KB, kbs = warp * (nkb / MT_WARPS), n_items = static_cast<int>(n_mine) * kbw;
  uint8_t* xq = mt_smem;                                            // [8, pitch] staged activation codes
  float* xs = reinterpret_cast<float*>(mt_smem + MT_COLS * pitch);  // [K / 128, 8] their scales x 2^14
  const uint32_t ring = smem_addr(mt_smem + MT_COLS * pitch + MT_COLS * nkb * 4) + warp * PF * SB;  // the warp's
  // this lane's part of a stage fill, per matrix. KB = 1: rows frow + 8 u (u = 0, 1), 16-byte chunk fch of the row's
  // 64 bytes, the scale word of row `lane` (lanes < 16). KB = 2: rows frow + 4 u (u = 0..3), chunk fch of the row's
  // 128 bytes (block fch / 4; 8 lanes read a row's whole line), the scale word of row lane % 16, block lane / 16.
  constexpr int NCP = KB == 1 ? 2 : 4, RSTEP = KB == 1 ? 8 : 4;  // 16-byte copies per lane and matrix, their row step
  const int frow = KB == 1 ? lane >> 2 : lane >> 3, fch = KB == 1 ? lane & 3 : lane & 7;
  const int srow = lane & 15, sblk = KB == 1 ? 0 : lane >> 4;
  const bool scopy = KB == 2 || lane < MT_ROWS;
  // the copies' offsets in a matrix's part of a stage: copy u at wdst[u % 2] + 512 (u / 2) (rows r and r + 8 have
  // the same swizzle)
  const int wdst[2] = {(fch >> 2) * MT_WBYTES + mt_chunk(frow, fch & 3),
                       (fch >> 2) * MT_WBYTES + mt_chunk(frow + RSTEP, fch & 3)};
  const int sdst = KB * MT_WBYTES + sblk * MT_SBYTES + mt_sword(srow);
  const int64_t rstep = RSTEP * wd[0].row_bytes;  // (w1 and w3 have the same shape)
  // this lane's ldmatrix row address inside a matrix's weight block: matrix j = lane / 8 (rows j % 2 ? 8..15 : 0..7,
  // chunk s + j / 2 for groups s, s + 1)
  const int lr = (lane & 7) + 8 * ((lane >> 3) & 1), lc = lane >> 4;
  const int lm0 = mt_chunk(lr, lc), lm2 = mt_chunk(lr, lc + 2);
  const int m0 = 2 * t, m1 = 2 * t + 1;  // D columns of this lane
  for (int64_t g0 = 0; g0 < cnt; g0 += MT_COLS) {
    const int mc = static_cast<int>(imin(MT_COLS, cnt - g0));
    // the next item to fill: item l_kb of tile l_tile; this lane's sources of it per matrix (the bytes of its first
    // row, its scale word), set from the tile at the tile's first item and advanced by KB blocks per item
    int64_t l_tile = bt;
    int l_kb = 0;
    const uint8_t* wsrc[NW];
    const uint8_t* ssrc[NW];
    auto tile_sources = [&] {
      const int64_t row = wrow0 + l_tile * MT_ROWS;
#pragma unroll
      for (int q = 0; q < NW; ++q) {
        wsrc[q] = wd[q].w + (row + frow) * wd[q].row_bytes + kbs * 64 + 16 * fch;
        ssrc[q] = wd[q].scale + (row + srow) * wd[q].scols + (kbs + sblk) * 4;
      }
    };
    tile_sources();
    auto fill = [&](uint32_t st) {  // the next item into stage st, one commit group (empty past the last item)
      if (l_tile < n_tiles) {
#pragma unroll
        for (int q = 0; q < NW; ++q) {
          const uint8_t* src = wsrc[q];
#pragma unroll
          for (int u = 0; u < NCP; ++u, src += rstep) cp16(st + wdst[u & 1] + (q * MB + 512 * (u >> 1)), src);
          if (scopy) cp4(st + q * MB + sdst, ssrc[q]);
          wsrc[q] += KB * 64;
          ssrc[q] += KB * 4;
        }
      }
      cp_commit();
      if (++l_kb == kbw) {
        l_kb = 0, l_tile += n_bt;
        if (l_tile < n_tiles) tile_sources();
      }
    };
#pragma unroll
    for (int i = 0; i < PF; ++i) fill(ring + i * SB);  // in flight while the block stages the activations
    // the rows' activation codes, 8 columns per thread and step (F16A: f16 pairs of columns 0, 2 | 1, 3 | 4, 6 | 5, 7;
    // else e4m3 codes of columns 0, 2, 4, 6 | 1, 3, 5, 7), and their block scales x 2^14
    for (int m = 0; m < mc; ++m) {
      const int64_t ar = act_row<KIND>(A, base + g0 + m);
      const float* src = A.a + ar * A.lda;
      uint8_t* dst = xq + m * pitch;
      for (int c = 8 * tid; c < K; c += 8 * MT_THREADS) {
        const float4 v0 = __ldg(reinterpret_cast<const float4*>(src + c));
        const float4 v1 = __ldg(reinterpret_cast<const float4*>(src + c + 4));
        if constexpr (F16A)
          *reinterpret_cast<uint4*>(dst + 2 * c) = make_uint4(mt_f16x2(v0.x, v0.z), mt_f16x2(v0.y, v0.w),
                                                              mt_f16x2(v1.x, v1.z), mt_f16x2(v1.y, v1.w));
        else
          *reinterpret_cast<uint2*>(dst + c) = make_uint2(mt_e4m3x2(v0.x, v0.z) | (mt_e4m3x2(v1.x, v1.z) << 16),
                                                          mt_e4m3x2(v0.y, v0.w) | (mt_e4m3x2(v1.y, v1.w) << 16));
      }
      for (int b = tid; b < nkb; b += MT_THREADS)
        xs[b * MT_COLS + m] = __fmul_rn(__ldg(A.sa + ar * A.ldsa + b), 0x1p14f);
    }
    __syncthreads();
    // B column g: the segment row g0 + g's codes, or row 0's past the segment (any valid codes: an mma's output
    // columns do not mix, and those are not stored); the scales of D columns m0, m1 likewise
    const uint8_t* xg = xq + (g < mc ? g : 0) * pitch + (F16A ? 16 : 8) * t;
    const float* xs0 = xs + (m0 < mc ? m0 : 0);
    const float* xs1 = xs + (m1 < mc ? m1 : 0);
    float tot[NW][4];
#pragma unroll
    for (int w = 0; w < NW; ++w) tot[w][0] = tot[w][1] = tot[w][2] = tot[w][3] = 0.0f;
    int64_t c_tile = bt;  // item being consumed: item c_kb of tile c_tile, in ring slot `slot`
    int c_kb = 0, slot = 0;
    for (int it = 0; it < n_items; ++it) {
      const uint32_t st = ring + slot * SB;
      cp_wait<PF - 1>();  // this lane's copies of item it are done ...
      __syncwarp();       // ... and every lane's
#pragma unroll
      for (int j = 0; j < KB; ++j) {  // the item's 128-column blocks in order
        const int kb = kbs + c_kb * KB + j;
        const float sa0 = xs0[kb * MT_COLS], sa1 = xs1[kb * MT_COLS];
        uint32_t wv[NW][4][2];  // [matrix][group][row g, g + 8]
        uint2 sw[NW];           // [matrix]: the scale words of rows g, g + 8
#pragma unroll
        for (int w = 0; w < NW; ++w) {
          const uint32_t wb = st + w * MB + j * MT_WBYTES;
          uint32_t r[4];
          ldsm_x4(wb + lm0, r);  // groups 0, 1
          wv[w][0][0] = r[0], wv[w][0][1] = r[1], wv[w][1][0] = r[2], wv[w][1][1] = r[3];
          ldsm_x4(wb + lm2, r);  // groups 2, 3
          wv[w][2][0] = r[0], wv[w][2][1] = r[1], wv[w][3][0] = r[2], wv[w][3][1] = r[3];
          sw[w] = mt_lds64(st + w * MB + KB * MT_WBYTES + j * MT_SBYTES + 8 * g);
        }
        if (j == KB - 1) {
          __syncwarp();  // every lane has read the stage: it can be refilled
          fill(st);      // the item PF ahead into the stage just read
        }
        // the block's sum over its 4 groups of each group's mma result times its weight scale (a power of two: exact
        // products), then one multiply by the activation scale
        float p[NW][4];
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          uint32_t b[4];
          mt_act_pairs<F16A>(xg + (F16A ? 2 : 1) * (kb * 128 + 32 * s), b);
#pragma unroll
          for (int w = 0; w < NW; ++w) {
            uint32_t rg[4], r8[4];  // the f16 pairs of rows g, g + 8
            fp4_as_f16x2_bits(wv[w][s][0], rg);
            fp4_as_f16x2_bits(wv[w][s][1], r8);
            const uint32_t lo[4] = {rg[0], r8[0], rg[1], r8[1]}, hi[4] = {rg[2], r8[2], rg[3], r8[3]};
            float d[4];
            tc_mma_f16_pair(lo, hi, b, d);
            const float sg = e8m0_byte_fast(sw[w].x, s), s8 = e8m0_byte_fast(sw[w].y, s);
            if (s == 0) {
              p[w][0] = __fmul_rn(d[0], sg), p[w][1] = __fmul_rn(d[1], sg);
              p[w][2] = __fmul_rn(d[2], s8), p[w][3] = __fmul_rn(d[3], s8);
            } else {
              p[w][0] = __fmaf_rn(d[0], sg, p[w][0]), p[w][1] = __fmaf_rn(d[1], sg, p[w][1]);
              p[w][2] = __fmaf_rn(d[2], s8, p[w][2]), p[w][3] = __fmaf_rn(d[3], s8, p[w][3]);
            }
          }
        }
#pragma unroll
        for (int w = 0; w < NW; ++w) {
          tot[w][0] = __fmaf_rn(p[w][0], sa0, tot[w][0]), tot[w][1] = __fmaf_rn(p[w][1], sa1, tot[w][1]);
          tot[w][2] = __fmaf_rn(p[w][2], sa0, tot[w][2]), tot[w][3] = __fmaf_rn(p[w][3], sa1, tot[w][3]);
        }
      }
      slot = slot + 1 == PF ? 0 : slot + 1;
      if (++c_kb == kbw) {  // the tile is done (uniform: every warp ends its slice on the same item)
#pragma unroll
        for (int w = 0; w < NW; ++w) {
          if (m0 < mc) red[warp][w][m0][g] = tot[w][0], red[warp][w][m0][g + 8] = tot[w][2];
          if (m1 < mc) red[warp][w][m1][g] = tot[w][1], red[warp][w][m1][g + 8] = tot[w][3];
          tot[w][0] = tot[w][1] = tot[w][2] = tot[w][3] = 0.0f;
        }
        __syncthreads();
        if (tid < mc * MT_ROWS) {
          const int m = tid / MT_ROWS, r = tid % MT_ROWS;
          float sm[NW];
#pragma unroll
          for (int w = 0; w < NW; ++w) {
            sm[w] = red[0][w][m][r];
#pragma unroll
            for (int q = 1; q < MT_WARPS; ++q) sm[w] = __fadd_rn(sm[w], red[q][w][m][r]);
          }
          if (KIND == kW13 && A.raw_gu != nullptr) {  // (tests: g and u instead of SwiGLU)
            A.raw_gu[(base + g0 + m) * 2 * A.inter + c_tile * MT_ROWS + r] = sm[0];
            A.raw_gu[(base + g0 + m) * 2 * A.inter + A.inter + c_tile * MT_ROWS + r] = sm[NW - 1];
          } else {
            store_out<KIND>(A, base + g0 + m, c_tile * MT_ROWS + r, sm[0], sm[NW - 1]);
          }
        }
        __syncthreads();  // red (and, after the last tile, xq / xs) are reused
        c_kb = 0;
        c_tile += n_bt;
      }
    }
    cp_wait<0>();  // the empty groups past the last item (nothing in flight when the rings restart)
  }
}

template <int KIND, int KB>
__global__ void __launch_bounds__(MT_THREADS, 2) moe_tc_small_kernel(const GArgs A) {
  constexpr int NW = KIND == kW13 ? 2 : 1;
  __shared__ float red[MT_WARPS][NW][MT_COLS][MT_ROWS];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t slot = blockIdx.x % A.n_slots, bt = blockIdx.x / A.n_slots, n_bt = gridDim.x / A.n_slots;
  if (slot >= *A.n_small) return;
  const int64_t e = A.small_list[slot], base = A.seg_start[e], cnt = A.seg_start[e + 1] - base;
  WDesc wd[NW];
  int64_t K = 0, nout = 0, wrow0 = 0;
  block_weights<KIND>(A, e, wd, K, nout, wrow0);
  const int64_t n_tiles = nout / MT_ROWS, n_mine = bt < n_tiles ? cdiv(n_tiles - bt, n_bt) : 0;
  if (cnt <= 0 || n_mine == 0) return;  // (uniform over the block)
  moe_tc_small_run<KIND, KB>(A, wd, K, n_tiles, wrow0, base, cnt, bt, n_bt, n_mine, red);
}

// Blocks of moe_tc_small_kernel<KIND, KB> one SM holds with the shared memory of K (a multiple of 1024 up to
// MT_MAXK), 0 if it cannot run.
template <int KIND, int KB>
int moe_tc_small_occ_kb(int64_t K) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64 || K <= 0 || K > MT_MAXK || K % 1024) return 0;
  static int allowed[64] = {};                    // per device: 0 unknown, -1 no, 1 the largest smem allowed
  static int cached[64][MT_MAXK / 1024 + 1] = {};  // per device and K / 1024: 0 unknown, -1 no, else blocks per SM
  if (allowed[dev] == 0)
    allowed[dev] = cudaFuncSetAttribute(moe_tc_small_kernel<KIND, KB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(moe_tc_smem(KIND, KB, MT_MAXK))) == cudaSuccess ? 1 : -1;
  int& c = cached[dev][K / 1024];
  if (c == 0) {
    int occ = 0;
    c = allowed[dev] > 0 &&
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, moe_tc_small_kernel<KIND, KB>, MT_THREADS,
                                                              int(moe_tc_smem(KIND, KB, K))) == cudaSuccess && occ > 0
            ? occ : -1;
  }
  return c > 0 ? c : 0;
}
template <int KIND>
int moe_tc_small_occ(int64_t K) {
  return mt_kb(K) == 2 ? moe_tc_small_occ_kb<KIND, 2>(K) : moe_tc_small_occ_kb<KIND, 1>(K);
}

// The shapes gemv_tc_kernel takes (and a device and binary with FP8 mma, sm_89+; its shared memory allowed).
// blocks_per_sm: how many of its blocks one SM holds at the largest shared memory (the persistent grid's bound).
bool gemv_tc_ok(const WeightView& W, int64_t r0, int64_t nout, int* blocks_per_sm = nullptr) {
  if (W.fmt != GemmFormat::fp8 || W.block_cols != 128 || W.block_rows % GT_ROWS != 0) return false;
  if (W.cols % (128 * GT_WARPS) != 0 || W.cols > GT_MAXK || nout % GT_ROWS != 0 || r0 % GT_ROWS != 0) return false;
  if ((reinterpret_cast<uintptr_t>(W.w) & 15) != 0) return false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  static int cached[64] = {};  // per device: 0 unknown, -1 no, else blocks per SM
  if (cached[dev] == 0) {
    cudaFuncAttributes fa{};
    int major = 0, minor = 0, occ = 0;
    const int smem = int(gemv_tc_smem(GT_MAXTOK, GT_MAXK));
    const bool ok = cudaFuncGetAttributes(&fa, gemv_tc_kernel) == cudaSuccess &&
                    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                    fa.binaryVersion >= 89 && major * 10 + minor >= 89 &&
                    cudaFuncSetAttribute(gemv_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
                        cudaSuccess &&
                    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_tc_kernel, GT_THREADS, smem) ==
                        cudaSuccess &&
                    occ > 0;
    cached[dev] = ok ? occ : -1;
  }
  if (blocks_per_sm != nullptr) *blocks_per_sm = cached[dev];
  return cached[dev] > 0;
}

// ---- gemv_tc16_kernel: (D) FP8 grouped linear of 1..8 tokens on f16 tensor cores (fast mode; wo_a) --------------
// The reference runs wo_a as a BF16 product of the dequantized weight and bf16 activations (no activation quant).
// Here y[g, m, n] = 2^-k_m * sum over 128-column blocks kb of sw[n / 128, kb] * (sum_k w[n, k] x16[m, k]) with the
// weight codes as f16 (cvt e4m3x2 -> f16x2: exact) and x16 = f16(x * 2^k_m), k_m the power of two that puts the
// token's max |x| in [2^14, 2^15): exact for bf16-valued x down to 2^-28 of that max (below: f16 subnormals), so
// the products are the reference's up to the tensor core's fp32 sums. Taken with weight_as_bf16 and E8M0 scales
// only (reference numerics, where x is bf16): a power-of-two scale makes bf16(code * sw) the exact dequantized
// weight, applied to the item's sum. (Dense numerics keep the fp32 activations on gemv_kernel.)
// Work: blockIdx.y = group; a block of 8 warps takes 8 / KS 16-row tiles (KS warps split K), every warp its slice
// of kbw 128-column items through a ring of G16_PF items in registers. Lane (g, t) loads 16 bytes at 16 t and
// 64 + 16 t of each item's rows g and g + 8 (as gemv_tc_kernel); word j of them (columns c .. c + 3) feeds mma j
// (m16n8k16): its bytes c, c + 1 as a0 / a1 and c + 2, c + 3 as a2 / a3, and token g's x16 at the same columns as
// b0 / b1 (the same products, columns permuted alike). The 8 mma of an item chain their fp32 accumulator; items
// are added in ascending kb, the KS slices in slice order: the order depends on the shape only, and column m of D
// is token m, so a token's result is the same alone or with up to 7 others.
constexpr int G16_THREADS = 256, G16_WARPS = 8, G16_ROWS = 16, G16_MAXK = 8192, G16_PF = 4, G16_MAXTOK = 8;
constexpr int G16_XPAD = 8;  // halves of row padding of the staged x16 (conflict-free 16-byte reads)

size_t gemv_tc16_smem(int64_t n_tok, int64_t K) { return size_t(n_tok * (K + G16_XPAD)) * 2; }

// Two e4m3 codes (bits 0..15 of w) -> f16x2 and bits 16..31 -> f16x2 (exact).
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  lo = hi = 0u;
  __trap();  // gemv_tc16_ok() keeps the launchers off this path
#endif
}


__global__ void __launch_bounds__(G16_THREADS, 2) gemv_tc16_kernel(const GArgs A) {
  extern __shared__ __align__(16) uint8_t g16_smem[];
  __shared__ float red[G16_WARPS][G16_MAXTOK][G16_ROWS];
  __shared__ float inv[G16_MAXTOK];  // 2^-k_m
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t M = A.M, K = A.W.cols, nkb = K / 128, Kp = K + G16_XPAD, grp = blockIdx.y;
  const int KS = A.gv_ks, tpb = G16_WARPS / KS, wt = warp / KS, ks = warp % KS;
  const int64_t kbw = nkb / KS, kbs = int64_t(ks) * kbw;
  const int64_t tile = int64_t(blockIdx.x) * tpb + wt, n_tiles = A.nout / G16_ROWS;
  const bool tile_ok = tile < n_tiles;
  __half* xh = reinterpret_cast<__half*>(g16_smem);  // x16 [M, Kp]
  const WDesc wd = make_wdesc(A.W);
  const int64_t row = A.r0 + int64_t(grp) * A.grp_r + tile * G16_ROWS;  // the tile's first weight row
  const uint8_t* wp = wd.w + (row + g) * wd.row_bytes + kbs * 128 + 16 * t;
  const int64_t si0 = (wd.br_sh >= 0 ? row >> wd.br_sh : row / wd.br) * wd.scols + kbs;  // (br % 16 == 0)

  uint4 wv[G16_PF][4];
  uint32_t sv[G16_PF];
  int64_t l_kb = 0;  // next item to load
  auto load = [&](uint4 (&w)[4], uint32_t& s) {
    if (tile_ok && l_kb < kbw) {
      const uint8_t* p = wp + l_kb * 128;
      w[0] = __ldg(reinterpret_cast<const uint4*>(p));
      w[1] = __ldg(reinterpret_cast<const uint4*>(p + 64));
      w[2] = __ldg(reinterpret_cast<const uint4*>(p + 8 * wd.row_bytes));
      w[3] = __ldg(reinterpret_cast<const uint4*>(p + 8 * wd.row_bytes + 64));
      s = wd.sf32 ? __float_as_uint(__ldg(reinterpret_cast<const float*>(wd.scale) + si0 + l_kb))
                  : uint32_t(__ldg(wd.scale + si0 + l_kb));
    }
    ++l_kb;
  };
#pragma unroll
  for (int s = 0; s < G16_PF; ++s) load(wv[s], sv[s]);  // in flight while the block stages x
  // (PDL, device_pdl.cuh: the loads above read weights only; x and y belong to the kernels around this one)
  pdl_wait();
  pdl_launch_dependents();

  // x16 of the group's tokens: warp m takes token m (max |x|, the power of two, the f16 codes)
  const float* xg = A.a + int64_t(grp) * A.grp_a;
  for (int64_t m = warp; m < M; m += G16_WARPS) {
    const float4* xr = reinterpret_cast<const float4*>(xg + m * A.lda);
    float amax = 0.0f;
    for (int64_t c = lane; c < K / 4; c += 32) {
      const float4 v = __ldg(xr + c);
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    int e = 0;  // amax = f 2^e, f in [0.5, 1): amax 2^(15 - e) in [2^14, 2^15)
    if (amax > 0.0f && amax <= 3.4e38f) (void)frexpf(amax, &e);
    const int k = (amax > 0.0f && amax <= 3.4e38f) ? min(max(15 - e, -126), 127) : 0;
    const float up = ldexpf(1.0f, k);
    if (lane == 0) inv[m] = ldexpf(1.0f, -k);
    for (int64_t c = lane; c < K / 4; c += 32) {
      const float4 v = __ldg(xr + c);
      __half2* d = reinterpret_cast<__half2*>(xh + m * Kp + 4 * c);
      d[0] = __floats2half2_rn(__fmul_rn(v.x, up), __fmul_rn(v.y, up));
      d[1] = __floats2half2_rn(__fmul_rn(v.z, up), __fmul_rn(v.w, up));
    }
  }
  __syncthreads();

  const bool has_tok = g < M;            // lane (g, t) supplies token g's x16 (column g of B)
  const int m0 = 2 * t, m1 = 2 * t + 1;  // D columns of this lane
  const float i0 = m0 < M ? inv[m0] : 0.0f, i1 = m1 < M ? inv[m1] : 0.0f;
  float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // (row g, m0), (row g, m1), (row g + 8, m0), (row g + 8, m1)
  for (int64_t c0 = 0; c0 < kbw; c0 += G16_PF) {
#pragma unroll
    for (int s = 0; s < G16_PF; ++s) {
      if (c0 + s < kbw) {  // (uniform over the block)
        const int64_t kb = kbs + c0 + s;
        uint4 x[4] = {};
        if (has_tok) {
          const __half* xr = xh + g * Kp + kb * 128;
          x[0] = *reinterpret_cast<const uint4*>(xr + 16 * t);        // columns 16 t .. + 7
          x[1] = *reinterpret_cast<const uint4*>(xr + 16 * t + 8);    // 16 t + 8 .. + 15
          x[2] = *reinterpret_cast<const uint4*>(xr + 64 + 16 * t);
          x[3] = *reinterpret_cast<const uint4*>(xr + 64 + 16 * t + 8);
        }
        const uint32_t rg[8] = {wv[s][0].x, wv[s][0].y, wv[s][0].z, wv[s][0].w,
                                wv[s][1].x, wv[s][1].y, wv[s][1].z, wv[s][1].w};
        const uint32_t r8[8] = {wv[s][2].x, wv[s][2].y, wv[s][2].z, wv[s][2].w,
                                wv[s][3].x, wv[s][3].y, wv[s][3].z, wv[s][3].w};
        float blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          uint32_t a[4];
          e4m3x4_to_f16x4(rg[j], a[0], a[2]);
          e4m3x4_to_f16x4(r8[j], a[1], a[3]);
          const uint4& xv = x[j >> 1];
          mma_f16_acc(a, (j & 1) ? xv.z : xv.x, (j & 1) ? xv.w : xv.y, blk);
        }
        const float sw = wd.sf32 ? __uint_as_float(sv[s]) : e8m0_to_float(sv[s]);
        load(wv[s], sv[s]);  // the item G16_PF ahead into the slot just used
        const float s0 = __fmul_rn(sw, i0), s1 = __fmul_rn(sw, i1);
        tot[0] = __fmaf_rn(blk[0], s0, tot[0]);
        tot[1] = __fmaf_rn(blk[1], s1, tot[1]);
        tot[2] = __fmaf_rn(blk[2], s0, tot[2]);
        tot[3] = __fmaf_rn(blk[3], s1, tot[3]);
      }
    }
  }
  // the KS slices of a tile, added in slice order
  if (m0 < M) red[warp][m0][g] = tot[0], red[warp][m0][g + 8] = tot[2];
  if (m1 < M) red[warp][m1][g] = tot[1], red[warp][m1][g + 8] = tot[3];
  __syncthreads();
  float* yg = A.y + int64_t(grp) * A.grp_y;
  for (int o = tid; o < tpb * M * G16_ROWS; o += G16_THREADS) {
    const int tw = o / int(M * G16_ROWS), m = (o / G16_ROWS) % int(M), r = o % G16_ROWS;
    const int64_t tl = int64_t(blockIdx.x) * tpb + tw;
    if (tl >= n_tiles) continue;
    float v = red[tw * KS][m][r];
    for (int q = 1; q < KS; ++q) v = __fadd_rn(v, red[tw * KS + q][m][r]);
    yg[m * A.ldy + tl * G16_ROWS + r] = A.out_bf16 ? round_bf16(v) : v;
  }
}

// Warps per tile (K slices) of gemv_tc16_kernel: the fewest (1, 2, 4, 8) giving kGtWarpTarget warp tasks over all
// groups, and dividing K's 128-column blocks.
int gemv_tc16_ks(int64_t tiles, int64_t nkb) {
  int ks = 1;
  while (ks < G16_WARPS && tiles * ks < kGtWarpTarget && nkb % (2 * ks) == 0) ks *= 2;
  return ks;
}

// The grouped shapes gemv_tc16_kernel takes (FP8 128-column blocks, 16-row aligned groups, E8M0 scales,
// weight_as_bf16, 16-byte aligned x and weights) and a device and binary with FP8 conversions (sm_89+).
bool gemv_tc16_ok(const WeightView& W, int64_t R, int64_t n_tok, const LinearOpts& o, const float* x) {
  if (W.fmt != GemmFormat::fp8 || W.block_cols != 128 || W.block_rows % G16_ROWS != 0) return false;
  if (o.act_quant_fp8 || !o.weight_as_bf16 || W.scale_f32 || n_tok < 1 || n_tok > G16_MAXTOK) return false;
  if (W.cols % 128 != 0 || W.cols > G16_MAXK || R % G16_ROWS != 0) return false;
  if (((reinterpret_cast<uintptr_t>(W.w) | reinterpret_cast<uintptr_t>(x)) & 15) != 0) return false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  static int cached[64] = {};  // per device: 0 unknown, -1 no, 1 yes
  if (cached[dev] == 0) {
    cudaFuncAttributes fa{};
    int major = 0, minor = 0;
    const int smem = int(gemv_tc16_smem(G16_MAXTOK, G16_MAXK));
    const bool ok = cudaFuncGetAttributes(&fa, gemv_tc16_kernel) == cudaSuccess &&
                    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                    fa.binaryVersion >= 89 && major * 10 + minor >= 89 &&
                    cudaFuncSetAttribute(gemv_tc16_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
                        cudaSuccess;
    cached[dev] = ok ? 1 : -1;
  }
  return cached[dev] > 0;
}

// ---- dispatch -------------------------------------------------------------------------------------------------------
// The decode ("small") kernel of a product: (Q) small_kernel (32 rows x 4 tokens per 256-thread block), (D)
// rowchain_kernel (32 rows x MT tokens per 32-thread block). Both cover 32 output rows per block.
constexpr int kSmallRows = 32;
static_assert(SBN == kSmallRows && RC_ROWS == kSmallRows, "grids of the two decode kernels are sized alike");

// Tokens (sorted rows) per pass of the decode kernel: (Q) SMG; (D) 1 for single-token calls (no predicated
// accumulators), else 4.
int small_mt(bool Q, int64_t n_tok) { return Q ? SMG : (n_tok == 1 ? 1 : 4); }

// grid = n_slots * ceil(nout / rows per block), blockIdx.x = row tile * n_slots + slot.
template <int KIND, bool SMALL>
void launch_kind(int fmt, bool Q, int mt, const GArgs& A, int64_t grid, cudaStream_t st) {
  if (grid <= 0) return;
  const dim3 g(static_cast<unsigned>(grid)), b(256), bw(RC_ROWS);
#define DSV4_GEMM_Q(F)                                            \
  if (fmt == F && Q) {                                            \
    if constexpr (SMALL)                                          \
      small_kernel<F, true, KIND><<<g, b, 0, st>>>(A);            \
    else                                                          \
      tile_kernel<F, true, KIND><<<g, b, 0, st>>>(A);             \
    return;                                                       \
  }
#define DSV4_GEMM_D(F)                                            \
  if (fmt == F && !Q) {                                           \
    if constexpr (SMALL) {                                        \
      if (mt == 1)                                                \
        rowchain_kernel<F, KIND, 1><<<g, bw, 0, st>>>(A);         \
      else                                                        \
        rowchain_kernel<F, KIND, 4><<<g, bw, 0, st>>>(A);         \
    } else {                                                      \
      tile_kernel<F, false, KIND><<<g, b, 0, st>>>(A);            \
    }                                                             \
    return;                                                       \
  }
  DSV4_GEMM_Q(kFmtFp8)
  DSV4_GEMM_Q(kFmtFp4)
  DSV4_GEMM_D(kFmtFp8)
  DSV4_GEMM_D(kFmtFp4)
  DSV4_GEMM_D(kFmtBf16)
  DSV4_GEMM_D(kFmtF32)
#undef DSV4_GEMM_Q
#undef DSV4_GEMM_D
  fail_msg("linear: (Q) needs an FP8 or FP4 weight");
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

int64_t grid_blocks(int64_t n, int threads) { return imin(cdiv(n, threads), 65535 * 8); }

// ---- gemv_kernel: shapes, launches ------------------------------------------------------------------------------
struct GvPlan {
  bool ok = false;
  int ks = 1;   // GArgs::gv_ks
  int rpb = 0;  // output rows per block
};

// From the shape alone (never the token count, so a token's result does not depend on its batch): KS doubles while
// the matrix gives fewer than kGvWarpTarget row-group warps and every lane keeps at least one chunk per row.
GvPlan gv_plan(GemmFormat fmt, int kind, int64_t K, int64_t nout, int64_t block_cols) {
  GvPlan p;
  const int cc = fmt == GemmFormat::fp4 ? 32 : fmt == GemmFormat::fp8 ? 16 : fmt == GemmFormat::bf16 ? 8 : 4;
  if (K <= 0 || nout <= 0 || K % cc != 0) return p;
  if (fmt == GemmFormat::fp8 && block_cols % 16 != 0) return p;
  const int64_t C = K / cc;
  const int R = kind == kW13 ? 2 : 4;
  int ks = 1;
  while (ks < GV_WARPS && C / (int64_t(ks) * 2) >= 32 && cdiv(nout, R) * ks < kGvWarpTarget) ks *= 2;
  p.ok = true;
  p.ks = ks;
  p.rpb = R * (GV_WARPS / ks);
  return p;
}

// Tokens per pass: linear 1, 2, 4 or 8 (n_tok <= 8); MoE segments 1 (single-token calls) or 4.
int gv_mt_linear(int64_t n_tok) { return n_tok <= 1 ? 1 : n_tok == 2 ? 2 : n_tok <= 4 ? 4 : 8; }
int gv_mt_moe(int64_t n_tok) { return n_tok <= 1 ? 1 : 4; }

template <int FMT, bool Q, int KIND>
void launch_gv_mt(int mt, const GArgs& A, int64_t grid, cudaStream_t st, int64_t groups = 1) {
  const dim3 g(static_cast<unsigned>(grid), static_cast<unsigned>(groups)), b(GV_THREADS);
  if constexpr (KIND == kLinear) {
    switch (mt) {
      case 1: launch_pdl(gemv_kernel<FMT, Q, KIND, 1>, g, b, 0, st, A); return;
      case 2: launch_pdl(gemv_kernel<FMT, Q, KIND, 2>, g, b, 0, st, A); return;
      case 4: launch_pdl(gemv_kernel<FMT, Q, KIND, 4>, g, b, 0, st, A); return;
      default: launch_pdl(gemv_kernel<FMT, Q, KIND, 8>, g, b, 0, st, A); return;
    }
  } else {
    if (mt == 1)
      launch_pdl(gemv_kernel<FMT, Q, KIND, 1>, g, b, 0, st, A);
    else
      launch_pdl(gemv_kernel<FMT, Q, KIND, 4>, g, b, 0, st, A);
  }
}

// Single-token (Q) linear with act_quant fused (A.a = raw activations, K % 128 == 0).
void launch_gemv_fq(int fmt, const GArgs& A, int64_t grid, cudaStream_t st) {
  if (grid <= 0) return;
  const dim3 g(static_cast<unsigned>(grid)), b(GV_THREADS);
  if (fmt == kFmtFp8)
    launch_pdl(gemv_kernel<kFmtFp8, true, kLinear, 1, true>, g, b, 0, st, A);
  else if (fmt == kFmtFp4)
    launch_pdl(gemv_kernel<kFmtFp4, true, kLinear, 1, true>, g, b, 0, st, A);
  else
    fail_msg("linear: (Q) needs an FP8 or FP4 weight");
}

template <int KIND>
void launch_gemv(int fmt, bool Q, int mt, const GArgs& A, int64_t grid, cudaStream_t st, int64_t groups = 1) {
  if (grid <= 0) return;
  if (Q) {
    if (fmt == kFmtFp8) return launch_gv_mt<kFmtFp8, true, KIND>(mt, A, grid, st, groups);
    if (fmt == kFmtFp4) return launch_gv_mt<kFmtFp4, true, KIND>(mt, A, grid, st, groups);
    fail_msg("linear: (Q) needs an FP8 or FP4 weight");
  }
  if (fmt == kFmtFp8) return launch_gv_mt<kFmtFp8, false, KIND>(mt, A, grid, st, groups);
  if (fmt == kFmtFp4) return launch_gv_mt<kFmtFp4, false, KIND>(mt, A, grid, st, groups);
  if constexpr (KIND == kLinear) {
    if (fmt == kFmtBf16) return launch_gv_mt<kFmtBf16, false, KIND>(mt, A, grid, st, groups);
    if (fmt == kFmtF32) return launch_gv_mt<kFmtF32, false, KIND>(mt, A, grid, st, groups);
  }
  fail_msg("gemv: unsupported weight format");
}

}  // namespace

// ---- internal interfaces ----------------------------------------------------------------------------------------
namespace gemm_internal {

void act_quant_f32(const float* x, int64_t rows, int64_t K, float* q, float* s, cudaStream_t stream) {
  const int64_t warps = rows * cdiv(K, 128);
  if (warps <= 0) return;
  launch_pdl(act_quant_kernel<false>, static_cast<unsigned>(cdiv(warps, 8)), 256, 0, stream, x, rows, rows, K, q, s,
             nullptr, nullptr);
}

void act_quant_e4m3(const float* x, int64_t rows, int64_t rows_pad, int64_t K, uint8_t* q8, float* s_t,
                    cudaStream_t stream) {
  const int64_t warps = rows_pad * cdiv(K, 128);
  if (warps <= 0) return;
  act_quant_kernel<true><<<static_cast<unsigned>(cdiv(warps, 8)), 256, 0, stream>>>(x, rows, rows_pad, K, nullptr,
                                                                                     nullptr, q8, s_t);
}

void finish_rows(const float* src, int64_t rows, int64_t cols, bool bf16, float* y, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  finish_kernel<<<static_cast<unsigned>(grid_blocks(n, 256)), 256, 0, stream>>>(src, n, bf16, y);
}

void swiglu_rows(const float* g, const float* up, int64_t rows, int64_t dim, float limit, bool bf16, float* h,
                 cudaStream_t stream) {
  const int64_t n = rows * dim;
  if (n <= 0) return;
  launch_pdl(swiglu_kernel, static_cast<unsigned>(grid_blocks(n, 256)), 256, 0, stream, g, up, n, limit, bf16, h);
}

namespace {
GArgs moe_args(const MoeGemmArgs& g) {
  GArgs A;
  A.table = g.table;
  A.n_experts = g.n_experts;
  A.d_model = g.d_model;
  A.inter = g.inter;
  A.seg_start = g.seg_start;
  A.big_tile_start = g.big_tile_start;
  A.small_list = g.small_list;
  A.n_small = g.n_small;
  A.row_tok = g.row_tok;
  A.row_w = g.row_w;
  A.out_bf16 = g.out_bf16;
  A.weight_as_bf16 = g.weight_as_bf16;
  return A;
}

// Whether tc_kernel can take the big segments: fast (Q) mode on the auto path, FP8 / FP4 experts, K of both
// products a multiple of 128, 16-byte activation rows, and a device + build with e4m3 mma (sm_89+).
bool tc_ok(const MoeGemmArgs& g, int kind, const GArgs& A) {
  if (!g.quant || deterministic() || gemm_path() != GemmPath::auto_ || !A.a_vec) return false;
  if (g.fmt != GemmFormat::fp4 && !(g.fmt == GemmFormat::fp8 && g.block_cols == 128)) return false;
  if (g.d_model % TC_KT != 0 || g.inter % TC_KT != 0 || (kind != kW13 && kind != kW2)) return false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  static int cached[64] = {};  // per device: 0 unknown, 1 yes, 2 no
  if (dev < 0 || dev >= 64) return false;
  if (cached[dev] == 0) {
    cudaFuncAttributes fa{};
    int major = 0, minor = 0;
    const bool ok = cudaFuncGetAttributes(&fa, tc_kernel<kFmtFp4, kW2>) == cudaSuccess &&
                    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                    fa.binaryVersion >= 89 && major * 10 + minor >= 89;
    cached[dev] = ok ? 1 : 2;
  }
  return cached[dev] == 1;
}

template <int KIND>
void launch_tc(int fmt, const GArgs& A, int64_t grid, cudaStream_t st) {
  if (grid <= 0) return;
  const dim3 gr(static_cast<unsigned>(grid)), b(TC_THREADS);
  if (fmt == kFmtFp4)
    tc_kernel<kFmtFp4, KIND><<<gr, b, 0, st>>>(A);
  else
    tc_kernel<kFmtFp8, KIND><<<gr, b, 0, st>>>(A);
}

// Whether moe_tc_small_kernel takes the small segments: fast (Q) mode on the auto path, FP4 experts, K of both
// products a multiple of 1024 and outputs of 16, and what tc_ok asks of the device and build.
bool moe_tc_small_ok(const MoeGemmArgs& g, int kind, const GArgs& A) {
  if (g.fmt != GemmFormat::fp4 || g.d_model % (128 * MT_WARPS) != 0 || g.inter % (128 * MT_WARPS) != 0) return false;
  if (g.d_model % MT_ROWS != 0 || g.inter % MT_ROWS != 0 || g.d_model > MT_MAXK || g.inter > MT_MAXK) return false;
  if (!g.words_ok || !g.w16_ok ||
      (kind == kW13 ? moe_tc_small_occ<kW13>(g.d_model) : moe_tc_small_occ<kW2>(g.inter)) <= 0)
    return false;
  return tc_ok(g, kind, A);
}

std::atomic<int64_t> g_small_tc_launches{0};  // moe_tc_small_launches()

// The small segments on moe_tc_small_kernel (As: n_slots set).
void launch_small_tc(int kind, const MoeGemmArgs& g, const GArgs& As, int64_t nout, cudaStream_t stream) {
  g_small_tc_launches.fetch_add(1);
  const int64_t K2 = kind == kW13 ? g.d_model : g.inter;
  // the expert slots x tile strides: about the blocks the GPU holds at once, but at most kMtMaxTiles tiles per
  // block (with many slots, e.g. 192 at batch 32, one block per slot would stream a whole expert serially)
  const int64_t resident =
      int64_t(sm_count()) * (kind == kW13 ? moe_tc_small_occ<kW13>(K2) : moe_tc_small_occ<kW2>(K2));
  const int64_t tiles = nout / MT_ROWS;
  const int64_t n_bt = std::clamp<int64_t>(std::max(resident / As.n_slots, cdiv(tiles, kMtMaxTiles)), 1, tiles);
  const int64_t gt = As.n_slots * n_bt;
  const int kb = mt_kb(K2);
  const unsigned grid = static_cast<unsigned>(gt);
  if (kind == kW13 && kb == 2)
    launch_pdl(moe_tc_small_kernel<kW13, 2>, grid, MT_THREADS, moe_tc_smem(kW13, 2, K2), stream, As);
  else if (kind == kW13)
    launch_pdl(moe_tc_small_kernel<kW13, 1>, grid, MT_THREADS, moe_tc_smem(kW13, 1, K2), stream, As);
  else if (kb == 2)
    launch_pdl(moe_tc_small_kernel<kW2, 2>, grid, MT_THREADS, moe_tc_smem(kW2, 2, K2), stream, As);
  else
    launch_pdl(moe_tc_small_kernel<kW2, 1>, grid, MT_THREADS, moe_tc_smem(kW2, 1, K2), stream, As);
}

void moe_launch_both(int kind, const MoeGemmArgs& g, GArgs A, int64_t nout, cudaStream_t stream) {
  const int fmt = fmt_code(g.fmt);
  const int64_t P = g.n_rows_bound, E = g.n_experts;
  if (P <= 0 || E <= 0) return;
  // small experts: at most min(E, P) of them
  GArgs As = A;
  As.n_slots = imin(E, P);
  const int64_t gs = As.n_slots * cdiv(nout, kSmallRows);
  const int mt = small_mt(g.quant, g.n_tok);
  // big experts (> kMoeSmallMax rows): at most ceil(P / 64) + P / (kMoeSmallMax + 1) tiles
  GArgs Ab = A;
  Ab.n_slots = cdiv(P, TBM) + imin(E, P / (kMoeSmallMax + 1));
  const int64_t gb = Ab.n_slots * cdiv(nout, TBN);
  // small experts on the fast gemv_kernel unless a path is forced or the deterministic mode is on (then the
  // small_m kernels, which repeat the CPU's order)
  const int64_t K = kind == kW13 ? g.d_model : g.inter;
  const GvPlan gv = gemm_path() == GemmPath::auto_ && !deterministic() && A.a_vec
                        ? gv_plan(g.fmt, kind, K, nout, g.fmt == GemmFormat::fp8 ? g.block_cols : 32)
                        : GvPlan{};
  if (gv.ok) As.gv_ks = gv.ks;
  const int64_t gg = gv.ok ? As.n_slots * cdiv(nout, gv.rpb) : 0;
  // no segment can exceed kMoeSmallMax rows when there are no more pairs than that: no tiled-kernel launch
  const bool any_big = P > kMoeSmallMax;
  // big segments on the tensor-core kernels in the fast (Q) mode (FP4 with scratch: moe_tc_big_kernel, k_moe_tc.cu;
  // else tc_kernel), else on the CPU-order tiled kernel
  const bool tc = any_big && tc_ok(g, kind, A);
  if (tc && g.a8_ws != nullptr && moe_tc_big_ok(g)) {
    const bool w13 = kind == kW13;
    moe_tc_big(w13, g, A.a, A.sa, A.y, A.ldy, A.limit, A.bf16, stream);
    if (moe_tc_small_ok(g, kind, A))
      launch_small_tc(kind, g, As, nout, stream);
    else if (gv.ok && w13)
      launch_gemv<kW13>(fmt, g.quant, gv_mt_moe(g.n_tok), As, gg, stream);
    else if (gv.ok)
      launch_gemv<kW2>(fmt, g.quant, gv_mt_moe(g.n_tok), As, gg, stream);
    else
      (w13 ? launch_kind<kW13, true> : launch_kind<kW2, true>)(fmt, g.quant, mt, As, gs, stream);
    return;
  }
  if (moe_tc_small_ok(g, kind, A)) {  // small segments on tensor cores
    launch_small_tc(kind, g, As, nout, stream);
    if (tc)
      (kind == kW13 ? launch_tc<kW13> : launch_tc<kW2>)(fmt, Ab, gb, stream);
    else if (any_big)
      (kind == kW13 ? launch_kind<kW13, false> : launch_kind<kW2, false>)(fmt, g.quant, mt, Ab, gb, stream);
    return;
  }
  if (kind == kW13) {
    if (gv.ok)
      launch_gemv<kW13>(fmt, g.quant, gv_mt_moe(g.n_tok), As, gg, stream);
    else
      launch_kind<kW13, true>(fmt, g.quant, mt, As, gs, stream);
    if (tc)
      launch_tc<kW13>(fmt, Ab, gb, stream);
    else if (any_big)
      launch_kind<kW13, false>(fmt, g.quant, mt, Ab, gb, stream);
  } else {
    if (gv.ok)
      launch_gemv<kW2>(fmt, g.quant, gv_mt_moe(g.n_tok), As, gg, stream);
    else
      launch_kind<kW2, true>(fmt, g.quant, mt, As, gs, stream);
    if (tc)
      launch_tc<kW2>(fmt, Ab, gb, stream);
    else if (any_big)
      launch_kind<kW2, false>(fmt, g.quant, mt, Ab, gb, stream);
  }
}
}  // namespace

void moe_w13(const MoeGemmArgs& g, const float* a, const float* sa, float swiglu_limit, bool bf16, float* h,
             cudaStream_t stream) {
  GArgs A = moe_args(g);
  A.a = a;
  A.lda = g.d_model;
  A.sa = sa;
  A.ldsa = cdiv(g.d_model, 128);
  A.a_vec = aligned16(a) && g.d_model % 4 == 0;
  A.y = h;
  A.ldy = g.inter;
  A.limit = swiglu_limit;
  A.bf16 = bf16;
  moe_launch_both(kW13, g, A, g.inter, stream);
}

void moe_w2(const MoeGemmArgs& g, const float* h, const float* sh, float* o, cudaStream_t stream) {
  GArgs A = moe_args(g);
  A.a = h;
  A.lda = g.inter;
  A.sa = sh;
  A.ldsa = cdiv(g.inter, 128);
  A.a_vec = aligned16(h) && g.inter % 4 == 0;
  A.y = o;
  A.ldy = g.d_model;
  moe_launch_both(kW2, g, A, g.d_model, stream);
}

// moe_tc_small_for_test (kernels.h): the expert as a one-expert layer whose only segment is `rows` sorted rows
// (row r's token is r).
bool moe_tc_small_test(bool w13, const ExpertView& ex, const float* a, const float* sa, int64_t rows, float* y) {
  const int kind = w13 ? kW13 : kW2;
  MoeGemmArgs g;
  g.n_experts = 1;
  g.fmt = ex.w1.fmt;
  g.d_model = ex.w1.cols;
  g.inter = ex.w1.rows;
  g.n_rows_bound = g.n_tok = rows;
  g.quant = true;
  const WeightView* ws[3] = {&ex.w1, &ex.w2, &ex.w3};
  g.words_ok = g.w16_ok = true;
  for (const WeightView* w : ws)
    g.w16_ok = g.w16_ok && aligned16(w->w) && (w->cols / 2) % 16 == 0,
    g.words_ok = g.words_ok && (reinterpret_cast<uintptr_t>(w->scale) & 3) == 0 && (w->cols / 32) % 4 == 0;
  const int64_t K = w13 ? g.d_model : g.inter, nout = w13 ? g.inter : g.d_model;
  GArgs A;
  A.a = a;
  A.lda = K;
  A.sa = sa;
  A.ldsa = K / 128;
  A.a_vec = aligned16(a) && K % 4 == 0;
  if (rows < 1 || rows > kMoeSmallMax || K % 128 != 0 || !moe_tc_small_ok(g, kind, A)) return false;
  std::vector<int32_t> meta = {0, int32_t(rows), 0, 1};  // seg_start [2], small_list [1], n_small [1], row_tok
  for (int64_t r = 0; r < rows; ++r) meta.push_back(int32_t(r));
  void *dtable = nullptr, *dmeta = nullptr;
  // (the inputs may still be in flight on the backend's streams, which do not wait for the default stream's work)
  bool ok = cudaDeviceSynchronize() == cudaSuccess && cudaMalloc(&dtable, sizeof(ExpertView)) == cudaSuccess &&
            cudaMalloc(&dmeta, meta.size() * sizeof(int32_t)) == cudaSuccess &&
            cudaMemcpy(dtable, &ex, sizeof(ExpertView), cudaMemcpyHostToDevice) == cudaSuccess &&
            cudaMemcpy(dmeta, meta.data(), meta.size() * sizeof(int32_t), cudaMemcpyHostToDevice) == cudaSuccess;
  if (ok) {
    const int32_t* m = static_cast<const int32_t*>(dmeta);
    g.table = static_cast<const ExpertView*>(dtable);
    g.seg_start = m;
    g.small_list = m + 2;
    g.n_small = m + 3;
    g.row_tok = m + 4;
    GArgs As = moe_args(g);
    As.a = A.a, As.lda = A.lda, As.sa = A.sa, As.ldsa = A.ldsa, As.a_vec = A.a_vec;
    As.y = y;
    As.ldy = nout;
    As.raw_gu = w13 ? y : nullptr;
    As.n_slots = 1;
    launch_small_tc(kind, g, As, nout, nullptr);
    ok = cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
  }
  cudaFree(dtable);
  cudaFree(dmeta);
  return ok;
}

}  // namespace gemm_internal

// ---- public launchers ---------------------------------------------------------------------------------------------
size_t weight_aux_bytes(const WeightView& W) {
  if (!gemm_internal::cublaslt_shape_ok(W, 0, W.rows)) return 0;
  return size_t(W.rows / 128) * size_t(gemm_internal::aux_scale_ld(W)) * sizeof(float);
}

void build_weight_aux(const WeightView& W, void* aux, cudaStream_t stream) {
  if (aux == nullptr || weight_aux_bytes(W) == 0 || W.scale == nullptr) return;
  const int64_t srows = W.rows / 128, scols = cdiv(W.cols, 128), ld = gemm_internal::aux_scale_ld(W);
  widen_scales_kernel<<<static_cast<unsigned>(grid_blocks(srows * ld, 256)), 256, 0, stream>>>(
      W.scale, W.scale_f32, srows, scols, ld, static_cast<float*>(aux));
}

namespace {
struct LinearPlan {
  int64_t r0 = 0, r1 = 0, nout = 0, K = 0;
  bool Q = false;
};

LinearPlan validate(const WeightView& W, int64_t n_tok, const LinearOpts& o) {
  LinearPlan p;
  if (W.w == nullptr) fail_msg("linear: weight is not bound");
  if (W.rows <= 0 || W.cols <= 0) fail_msg("linear: bad weight shape");
  if (n_tok < 0) fail_msg("linear: negative token count");
  const bool quantized = W.fmt == GemmFormat::fp8 || W.fmt == GemmFormat::fp4;
  if (quantized && W.scale == nullptr) fail_msg("linear: quantized weight without scale");
  if (W.fmt == GemmFormat::fp4 && W.cols % 2 != 0) fail_msg("linear: FP4 weight with odd cols");
  if (W.fmt == GemmFormat::fp8 && (W.block_rows <= 0 || W.block_cols <= 0)) fail_msg("linear: bad FP8 block");
  if (o.act_quant_fp8 && !quantized) fail_msg("linear: act_quant_fp8 needs an FP8 or FP4 weight");
  if (o.act_quant_fp8 && W.fmt == GemmFormat::fp8 && W.block_cols != 128)
    fail_msg("linear: act_quant_fp8 needs 128-column FP8 weight blocks");
  p.r0 = o.row_begin;
  p.r1 = o.row_end < 0 ? W.rows : o.row_end;
  if (p.r0 < 0 || p.r1 > W.rows || p.r0 >= p.r1) fail_msg("linear: bad row range");
  p.nout = p.r1 - p.r0;
  p.K = W.cols;
  p.Q = o.act_quant_fp8;
  return p;
}

size_t quant_scratch_bytes(int64_t n_tok, int64_t K) {
  return align256(size_t(n_tok * K) * 4) + align256(size_t(n_tok * cdiv(K, 128)) * 4);
}
}  // namespace

size_t linear_scratch_bytes(const WeightView& W, int64_t n_tok, const LinearOpts& o) {
  if (n_tok <= 0) return 0;
  if (!o.act_quant_fp8) return gemm_internal::linear_bf16_bytes(W, n_tok, o);
  const int64_t K = W.cols;
  const int64_t r1 = o.row_end < 0 ? W.rows : o.row_end;
  size_t b = quant_scratch_bytes(n_tok, K);
  if (W.fmt == GemmFormat::fp8 && gemm_internal::cublaslt_shape_ok(W, o.row_begin, r1))
    b = std::max(b, gemm_internal::cublaslt_scratch_bytes(W, n_tok, r1 - o.row_begin));
  return b;
}

// gemv_tc_kernel over `rows` output rows (A.nout, or A.nout + A.nout2 for a pair) of A.M tokens: K slices `ks`
// (gemv_tc_ks of each matrix), a persistent grid of every group of 8 / KS tiles, at most the blocks the GPU holds at
// once (occ per SM).
void launch_gemv_tc(GArgs& A, int64_t rows, int ks, int64_t K, int occ, cudaStream_t stream) {
  A.gv_ks = ks;
  const int64_t groups = cdiv(rows / GT_ROWS, GT_WARPS / A.gv_ks);
  const int64_t grid = imin(groups, int64_t(sm_count()) * occ);
  launch_pdl(gemv_tc_kernel, static_cast<unsigned>(grid), GT_THREADS, gemv_tc_smem(A.M, K), stream, A);
  gemm_internal::note_path(GemmPath::gemv);
}

void linear(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o, void* scratch,
            cudaStream_t stream) {
  const LinearPlan p = validate(W, n_tok, o);
  if (n_tok == 0) return;
  const GemmPath forced = gemm_path();
  const bool lt_ok = p.Q && W.fmt == GemmFormat::fp8 && W.aux != nullptr &&
                     gemm_internal::cublaslt_shape_ok(W, p.r0, p.r1) && gemm_internal::cublaslt_device_ok();
  GemmPath path;
  switch (forced) {
    case GemmPath::simt: path = GemmPath::simt; break;
    case GemmPath::small_m: path = GemmPath::small_m; break;
    case GemmPath::cublaslt: path = lt_ok ? GemmPath::cublaslt : GemmPath::simt; break;
    case GemmPath::gemv: path = GemmPath::gemv; break;
    default:
      if (deterministic())  // the kernels that repeat the CPU's order: bitwise equal to the CPU backend
        path = n_tok <= 8 ? GemmPath::small_m : GemmPath::simt;
      else
        path = n_tok <= 8 ? GemmPath::gemv : (lt_ok ? GemmPath::cublaslt : GemmPath::simt);
  }
  // the fast decode kernel where the shape allows it (else small_m, or simt for more than 8 tokens)
  GvPlan gv;
  if (path == GemmPath::gemv) {
    gv = gv_plan(W.fmt, kLinear, p.K, p.nout, W.block_cols);
    const bool x_ok = p.Q || aligned16(x);  // (Q) reads the 256-aligned scratch codes
    if (!gv.ok || !x_ok || n_tok > 8) {
      gv.ok = false;
      path = n_tok <= 8 ? GemmPath::small_m : GemmPath::simt;
    }
  }
  // BF16 weight, bf16-valued x, more than 8 tokens: cuBLAS BF16 tensor cores (k_bf16_tc.cu)
  if (forced == GemmPath::auto_ && path == GemmPath::simt &&
      gemm_internal::linear_bf16(W, x, n_tok, y, o, scratch, stream))
    return;
  if (path == GemmPath::cublaslt) {
    if (gemm_internal::cublaslt_linear(W, x, n_tok, y, p.r0, p.nout, o.out_bf16, scratch, stream)) {
      gemm_internal::note_path(GemmPath::cublaslt);
      return;
    }
    path = GemmPath::simt;
  }

  GArgs A;
  A.M = n_tok;
  A.W = W;
  A.r0 = p.r0;
  A.nout = p.nout;
  A.y = y;
  A.ldy = p.nout;
  A.out_bf16 = o.out_bf16;
  A.weight_as_bf16 = o.weight_as_bf16;
  A.lda = p.K;
  // (Q) FP8 decode (1..8 tokens, automatic path): tensor cores, act_quant inside (raw x)
  int tc_occ = 0;
  if (path == GemmPath::gemv && p.Q && forced == GemmPath::auto_ && n_tok <= GT_MAXTOK && aligned16(x) &&
      gemv_tc_ok(W, p.r0, p.nout, &tc_occ)) {
    A.a = x;
    launch_gemv_tc(A, p.nout, gemv_tc_ks(p.nout), p.K, tc_occ, stream);
    return;
  }
  // single-token (Q) decode on gemv: act_quant fused into the kernel
  const bool fq = path == GemmPath::gemv && p.Q && n_tok == 1 && p.K % 128 == 0 && aligned16(x);
  if (fq) {
    A.a = x;
  } else if (p.Q) {
    float* qa = static_cast<float*>(scratch);
    float* sa = reinterpret_cast<float*>(static_cast<char*>(scratch) + align256(size_t(n_tok * p.K) * 4));
    gemm_internal::act_quant_f32(x, n_tok, p.K, qa, sa, stream);
    A.a = qa;
    A.sa = sa;
    A.ldsa = cdiv(p.K, 128);
  } else {
    A.a = x;
  }
  A.a_vec = aligned16(A.a) && p.K % 4 == 0;
  const int fmt = fmt_code(W.fmt);
  if (path == GemmPath::gemv) {
    const int mt = gv_mt_linear(n_tok);
    A.n_slots = cdiv(n_tok, mt);
    A.gv_ks = gv.ks;
    if (fq)
      launch_gemv_fq(fmt, A, A.n_slots * cdiv(p.nout, gv.rpb), stream);
    else
      launch_gemv<kLinear>(fmt, p.Q, mt, A, A.n_slots * cdiv(p.nout, gv.rpb), stream);
  } else if (path == GemmPath::small_m) {
    const int mt = small_mt(p.Q, n_tok);
    A.n_slots = cdiv(n_tok, mt);
    launch_kind<kLinear, true>(fmt, p.Q, mt, A, A.n_slots * cdiv(p.nout, kSmallRows), stream);
  } else {
    A.n_slots = cdiv(n_tok, TBM);
    launch_kind<kLinear, false>(fmt, p.Q, 0, A, A.n_slots * cdiv(p.nout, TBN), stream);
  }
  gemm_internal::note_path(path);
}

void linear_pair(const WeightView& W1, const WeightView& W3, const float* x, int64_t n_tok, float* y1, float* y3,
                 const LinearOpts& o, void* scratch, cudaStream_t stream) {
  const bool same = W1.fmt == W3.fmt && W1.cols == W3.cols && W1.block_rows == W3.block_rows &&
                    W1.block_cols == W3.block_cols && W1.scale_f32 == W3.scale_f32;
  const bool whole = o.row_begin == 0 && (o.row_end == -1 || (o.row_end == W1.rows && o.row_end == W3.rows));
  if (same && whole && n_tok > 0 && n_tok <= GT_MAXTOK && o.act_quant_fp8 && !deterministic() &&
      gemm_path() == GemmPath::auto_ && aligned16(x)) {
    LinearOpts o1 = o, o3 = o;
    o1.row_end = W1.rows;
    o3.row_end = W3.rows;
    const LinearPlan p1 = validate(W1, n_tok, o1), p3 = validate(W3, n_tok, o3);
    int occ = 0;
    // each matrix with the K slices it would take alone (linear()): the same sums, bitwise
    const int ks = gemv_tc_ks(p1.nout);
    if (gemv_tc_ok(W1, 0, p1.nout, &occ) && gemv_tc_ok(W3, 0, p3.nout) && gemv_tc_ks(p3.nout) == ks) {
      GArgs A;
      A.M = n_tok;
      A.W = W1;
      A.W2 = W3;
      A.nout = p1.nout;
      A.nout2 = p3.nout;
      A.y = y1;
      A.y2 = y3;
      A.ldy = p1.nout;
      A.ldy2 = p3.nout;
      A.out_bf16 = o.out_bf16;
      A.lda = p1.K;
      A.a = x;
      launch_gemv_tc(A, p1.nout + p3.nout, ks, p1.K, occ, stream);
      return;
    }
  }
  linear(W1, x, n_tok, y1, o, scratch, stream);
  linear(W3, x, n_tok, y3, o, scratch, stream);
}

bool linear_grouped(const WeightView& W, const float* x, int64_t n_tok, int64_t groups, float* y, const LinearOpts& o,
                    cudaStream_t stream) {
  if (n_tok <= 0 || n_tok > 8 || groups <= 1 || o.act_quant_fp8 || deterministic() || gemm_path() != GemmPath::auto_)
    return false;
  if (W.rows % groups != 0 || o.row_begin != 0 || (o.row_end != -1 && o.row_end != W.rows)) return false;
  const int64_t R = W.rows / groups;
  LinearOpts og = o;
  og.row_begin = 0;
  og.row_end = R;
  const LinearPlan p = validate(W, n_tok, og);
  GArgs A;  // group g: x + g grp_a, y + g grp_y, weight rows g R
  A.M = n_tok;
  A.W = W;
  A.nout = R;
  A.y = y;
  A.ldy = R;
  A.out_bf16 = o.out_bf16;
  A.weight_as_bf16 = o.weight_as_bf16;
  A.lda = p.K;
  A.a = x;
  A.grp_a = n_tok * p.K;
  A.grp_y = n_tok * R;
  A.grp_r = R;
  if (gemv_tc16_ok(W, R, n_tok, o, x)) {  // FP8 (wo_a): f16 tensor cores
    const int64_t tiles = R / G16_ROWS;
    A.gv_ks = gemv_tc16_ks(tiles * groups, p.K / 128);
    const dim3 grid(static_cast<unsigned>(cdiv(tiles, G16_WARPS / A.gv_ks)), static_cast<unsigned>(groups));
    launch_pdl(gemv_tc16_kernel, grid, G16_THREADS, gemv_tc16_smem(n_tok, p.K), stream, A);
    gemm_internal::note_path(GemmPath::gemv);
    return true;
  }
  // as linear() picks for one group: (D) with n_tok <= 8 runs gemv_kernel when the shape and x allow it
  const GvPlan gv = gv_plan(W.fmt, kLinear, p.K, p.nout, W.block_cols);
  if (!gv.ok || !aligned16(x) || (n_tok * p.K) % 4 != 0) return false;
  A.a_vec = p.K % 4 == 0;
  const int mt = gv_mt_linear(n_tok);
  A.n_slots = cdiv(n_tok, mt);
  A.gv_ks = gv.ks;
  launch_gemv<kLinear>(fmt_code(W.fmt), false, mt, A, A.n_slots * cdiv(R, gv.rpb), stream, groups);
  gemm_internal::note_path(GemmPath::gemv);
  return true;
}

int64_t moe_tc_small_launches() { return gemm_internal::g_small_tc_launches.load(); }

bool moe_tc_small_for_test(bool w13, const ExpertView& dev_expert, const float* a, const float* sa, int64_t rows,
                           float* y) {
  return gemm_internal::moe_tc_small_test(w13, dev_expert, a, sa, rows, y);
}

bool linear_grouped_tc(const WeightView& W, int64_t n_tok, int64_t groups, const float* x, const LinearOpts& o) {
  if (groups <= 1 || W.rows % groups != 0 || deterministic() || gemm_path() != GemmPath::auto_) return false;
  return gemv_tc16_ok(W, W.rows / groups, n_tok, o, x);
}

}  // namespace dsv4::cuda
