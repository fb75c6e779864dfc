// Elementwise and per-row kernels of CudaOps (semantics: backend/ops.h; reference: CpuOps in backend/cpu_ops.cpp and
// backend/act_quant.cpp).
//
// Exactness: every op whose CPU result is a fixed sequence of IEEE operations is written with explicit round-to-
// nearest intrinsics (__fmul_rn / __fadd_rn / __fsub_rn / __fdiv_rn / __fsqrt_rn), so that nvcc cannot contract
// a*b+c into an FMA: fill, round_bf16, scale, embed, rope, fp8_sim, fp4_sim, hadamard, check_finite, swiglu (its
// exp is glibc's expf, backend/cuda/glibc_math.cuh) and the row copies are bitwise equal to the CPU. The remaining
// difference:
// * rmsnorm / head_rms: the sum of squares accumulates in double (as the CPU) but in a tree order instead of the
//   CPU's sequential one; the products are exact in double, so the two sums differ by a few double ulps and the fp32
//   results agree except when float(sum) sits on a rounding boundary (vanishingly rare).
// Batch invariance: each row's reduction order depends only on the row width (never on n_rows), no atomics.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/device_pdl.cuh"
#include "backend/cuda/device_rope.cuh"
#include "backend/cuda/glibc_math.cuh"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;

// Blocks of a grid-stride loop over n elements (gridDim.x <= 2^31-1; the cap keeps the grid reasonable).
inline unsigned stride_grid(int64_t n, int threads = kThreads) {
  const int64_t g = (n + threads - 1) / threads;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(g, int64_t(1) << 16)));
}

__device__ __forceinline__ int64_t gtid() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t gstride() { return int64_t(gridDim.x) * blockDim.x; }

// ---- fill / round / scale -----------------------------------------------------------------------------------------
__global__ void fill_kernel(float* x, int64_t n, float value) {
  for (int64_t i = gtid(); i < n; i += gstride()) x[i] = value;
}
__global__ void round_bf16_kernel(float* x, int64_t n) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = gtid(); i < n; i += gstride()) x[i] = round_bf16(x[i]);
}
__global__ void scale_kernel(float* x, int64_t n, float alpha, bool bf16) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = gtid(); i < n; i += gstride()) x[i] = maybe_bf16(__fmul_rn(x[i], alpha), bf16);
}

// ---- embed: one block per token ----------------------------------------------------------------------------------
__global__ void embed_kernel(const uint8_t* table, int64_t row_bytes, bool is_bf16, const int32_t* ids, int64_t dim,
                             int copies, float* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const uint8_t* row = table + int64_t(ids[t]) * row_bytes;
  float* o = out + t * int64_t(copies) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = is_bf16 ? bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[i])
                            : reinterpret_cast<const float*>(row)[i];
    for (int c = 0; c < copies; ++c) o[int64_t(c) * dim + i] = v;
  }
}

// rmsnorm: TPR threads per row, kThreads / TPR rows per block. y may alias x: every element is read (reduction) and
// re-read + written by the same thread after the row's reduction completed.
template <int TPR>
__global__ void rmsnorm_kernel(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16,
                               float* y) {
  __shared__ double smem[kThreads / 32];
  constexpr int RPB = kThreads / TPR;
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % TPR;
  const int64_t r = int64_t(blockIdx.x) * RPB + threadIdx.x / TPR;
  if (TPR == 32 && r >= n_rows) return;  // whole warps only (no block barrier in the warp path)
  const float* xr = x + r * dim;
  float* yr = y + r * dim;
  double ss = 0;
#pragma unroll 8  // the loads of 8 iterations in flight (the summation order is unchanged)
  for (int64_t i = lane; i < dim; i += TPR) {
    const double v = double(xr[i]);
    ss += v * v;  // exact product (48 significant bits)
  }
  ss = row_sum<TPR>(ss, smem);
  const float s = rms_scale(ss, dim, eps);
#pragma unroll 8
  for (int64_t i = lane; i < dim; i += TPR) {
    const float t = __fmul_rn(xr[i], s);
    yr[i] = maybe_bf16(w ? __fmul_rn(w[i], t) : t, bf16);
  }
}

// rmsnorm with the row held in registers: every thread loads its NV float4 of the row at once (one memory round trip
// instead of dim / TPR dependent loads per pass; x is read once), sums their squares in double in a fixed order, and
// scales them. The row width alone picks (TPR, NV) (rmsnorm()), so the order never depends on n_rows.
template <int TPR, int NV>
__global__ void rmsnorm_vec_kernel(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16,
                                   float* y) {
  __shared__ double smem[kThreads / 32];
  constexpr int RPB = kThreads / TPR;
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % TPR;
  const int64_t r = int64_t(blockIdx.x) * RPB + threadIdx.x / TPR;
  if (TPR == 32 && r >= n_rows) return;  // whole warps only (no block barrier in the warp path)
  const int64_t d4 = dim / 4;
  const float4* xr = reinterpret_cast<const float4*>(x + r * dim);
  float4 v[NV];
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = lane + int64_t(j) * TPR;
    v[j] = i < d4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  double ss = 0;
#pragma unroll
  for (int j = 0; j < NV; ++j) {  // exact products (48 significant bits); zeros past the row add nothing
    ss += double(v[j].x) * double(v[j].x);
    ss += double(v[j].y) * double(v[j].y);
    ss += double(v[j].z) * double(v[j].z);
    ss += double(v[j].w) * double(v[j].w);
  }
  ss = row_sum<TPR>(ss, smem);
  const float s = rms_scale(ss, dim, eps);
  float4* yr = reinterpret_cast<float4*>(y + r * dim);
  const float4* w4 = reinterpret_cast<const float4*>(w);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = lane + int64_t(j) * TPR;
    if (i >= d4) continue;
    float4 o;
    const float4 wv = w ? w4[i] : make_float4(1.f, 1.f, 1.f, 1.f);
    o.x = __fmul_rn(v[j].x, s), o.y = __fmul_rn(v[j].y, s), o.z = __fmul_rn(v[j].z, s), o.w = __fmul_rn(v[j].w, s);
    if (w) o.x = __fmul_rn(wv.x, o.x), o.y = __fmul_rn(wv.y, o.y), o.z = __fmul_rn(wv.z, o.z), o.w = __fmul_rn(wv.w, o.w);
    o.x = maybe_bf16(o.x, bf16), o.y = maybe_bf16(o.y, bf16), o.z = maybe_bf16(o.z, bf16), o.w = maybe_bf16(o.w, bf16);
    yr[i] = o;
  }
}

// ROPE (head_rms_rope): after the row (head r of token r / n_heads) is normalized, its forward rope on the last rd
// dims by the same TPR threads (rope_kernel's arithmetic on the normalized values).
template <int TPR, bool ROPE = false>
__global__ void head_rms_kernel(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16, int64_t n_heads = 1,
                                int64_t rd = 0, const float* cos_sin = nullptr) {
  __shared__ double smem[kThreads / 32];
  constexpr int RPB = kThreads / TPR;
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % TPR;
  const int64_t r = int64_t(blockIdx.x) * RPB + threadIdx.x / TPR;
  if (TPR == 32 && r >= n_rows) return;
  float* xr = x + r * dim;
  double ss = 0;
#pragma unroll 8  // the loads of 8 iterations in flight (the summation order is unchanged)
  for (int64_t i = lane; i < dim; i += TPR) {
    const float v = xr[i];
    if (bf16) {
      ss += double(round_bf16(__fmul_rn(v, v)));  // q.square() -> bf16
    } else {
      ss += double(v) * double(v);
    }
  }
  ss = row_sum<TPR>(ss, smem);
  float rs;
  if (bf16) {
    const float mean = round_bf16(__double2float_rn(__ddiv_rn(ss, double(dim))));  // .mean() -> bf16
    const float t = round_bf16(__fadd_rn(mean, eps));                               // + eps -> bf16
    rs = round_bf16(__fdiv_rn(1.0f, __fsqrt_rn(t)));                                // rsqrt -> bf16
  } else {
    rs = rms_scale(ss, dim, eps);
  }
#pragma unroll 8
  for (int64_t i = lane; i < dim; i += TPR) xr[i] = maybe_bf16(__fmul_rn(xr[i], rs), bf16);
  if constexpr (ROPE) {
    if constexpr (TPR == 32)
      __syncwarp();
    else
      __syncthreads();
    const float* cs = cos_sin + (r / n_heads) * rd;
    for (int64_t i = lane; i < rd / 2; i += TPR) rope_pair(xr + dim - rd + 2 * i, cs[2 * i], cs[2 * i + 1], bf16);
  }
}

// ---- rope: one thread per rotated pair ---------------------------------------------------------------------------
__global__ void rope_kernel(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd,
                            const float* cos_sin, bool inverse, bool bf16) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t half = rd / 2, off = head_dim - rd, n = n_tok * n_heads * half;
  for (int64_t p = gtid(); p < n; p += gstride()) {
    const int64_t th = p / half, i = p % half, t = th / n_heads;
    const float c = cos_sin[t * rd + 2 * i];
    const float s = inverse ? -cos_sin[t * rd + 2 * i + 1] : cos_sin[t * rd + 2 * i + 1];
    rope_pair(x + th * head_dim + off + 2 * i, c, s, bf16);
  }
}

// ---- FP8 / FP4 simulation: one warp per quantization block -------------------------------------------------------
// Block b of row r covers columns [b*block, min(n_cols, (b+1)*block)). amax: max |x| with the CPU's `a > m ? a : m`
// (order-independent; NaNs never win).
template <bool FP4>
__global__ void quant_sim_kernel(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t nb = (n_cols + block - 1) / block;
  const int64_t item = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= n_rows * nb) return;  // whole warps
  const int64_t r = item / nb, b = item % nb;
  float* v = x + r * row_stride + b * block;
  const int64_t len = n_cols - b * block < block ? n_cols - b * block : block;
  float m = 0.0f;
  for (int64_t i = lane; i < len; i += 32) {
    const float a = fabsf(v[i]);
    m = a > m ? a : m;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float a = __shfl_xor_sync(0xFFFFFFFFu, m, o);
    m = a > m ? a : m;
  }
  const float s = FP4 ? fp4_act_scale(m) : fp8_act_scale(m);
  const float inv = __fdiv_rn(1.0f, s);
  for (int64_t i = lane; i < len; i += 32) v[i] = FP4 ? fp4_sim_value(v[i], s, inv) : fp8_sim_value(v[i], s, inv);
}

// ---- Walsh–Hadamard: TPR threads per row (TPR = min(dim/2, 256)), the row in shared memory -----------------------
// Stage h (1, 2, 4, ...) replaces (v[j], v[j+h]) by (a+b, a-b) for every j with (j & h) == 0: the CPU's loop nest
// computes each stage from the previous one, so any order of the butterflies within a stage gives the same bits.
__global__ void hadamard_kernel(float* x, int64_t n_rows, int dim, int tpr, float scale, bool bf16) {
  extern __shared__ float hsm[];
  pdl_wait();
  pdl_launch_dependents();
  const int rpb = blockDim.x / tpr;
  const int lr = threadIdx.x / tpr, lane = threadIdx.x % tpr;
  const int64_t r = int64_t(blockIdx.x) * rpb + lr;
  const bool valid = r < n_rows;
  float* v = hsm + lr * dim;
  float* xr = x + r * dim;
  if (valid)
    for (int i = lane; i < dim; i += tpr) v[i] = xr[i];
  __syncthreads();
  for (int h = 1; h < dim; h *= 2) {
    if (valid)
      for (int b = lane; b < dim / 2; b += tpr) {
        const int j = (b / h) * 2 * h + (b % h);
        const float a = v[j], c = v[j + h];
        v[j] = __fadd_rn(a, c);
        v[j + h] = __fsub_rn(a, c);
      }
    __syncthreads();
  }
  if (valid)
    for (int i = lane; i < dim; i += tpr) xr[i] = maybe_bf16(__fmul_rn(v[i], scale), bf16);
}

// ---- check_finite: bad[row] = 0, then blocks of 1024 threads x 8 loads over chunks of a row set it to 1 when they
// see a non-finite value (a 129,280-float logits row on one block was ~50 us as one SM's loads; 16 blocks per row) ---
constexpr int64_t kFiniteChunk = 1024 * 8;
__global__ void __launch_bounds__(1024) check_finite_kernel(const float* x, int64_t dim, int32_t* bad) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row = blockIdx.y, k0 = int64_t(blockIdx.x) * kFiniteChunk;
  const float* xr = x + row * dim;
  const int64_t k1 = k0 + kFiniteChunk < dim ? k0 + kFiniteChunk : dim;
  int b = 0;
#pragma unroll 8
  for (int64_t i = k0 + threadIdx.x; i < k1; i += blockDim.x) b |= (f_bits(__ldg(xr + i)) & 0x7F800000u) == 0x7F800000u;
  b = __syncthreads_or(b);
  if (threadIdx.x == 0 && b) bad[row] = 1;  // blocks of one row only ever write 1
}

// ---- row copies: one block per row; V = float4 when every row start is 16-byte aligned, else float ----------------
template <class V>
__global__ void gather_rows_kernel(const float* a, int64_t n_a, const float* b, const int32_t* idx, int64_t dimv,
                                   float* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = blockIdx.x, j = idx[i];
  const V* src = reinterpret_cast<const V*>(j < n_a ? a + j * dimv * (sizeof(V) / 4)
                                                    : b + (j - n_a) * dimv * (sizeof(V) / 4));
  V* dst = reinterpret_cast<V*>(out) + i * dimv;
  for (int64_t k = threadIdx.x; k < dimv; k += blockDim.x) dst[k] = src[k];
}

template <class V>
__global__ void scatter_rows_kernel(const float* src, const int32_t* src_idx, float* dst, const int32_t* dst_idx,
                                    int64_t dimv) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = blockIdx.x;
  const V* s = reinterpret_cast<const V*>(src) + int64_t(src_idx[i]) * dimv;
  V* d = reinterpret_cast<V*>(dst) + int64_t(dst_idx[i]) * dimv;
  for (int64_t k = threadIdx.x; k < dimv; k += blockDim.x) d[k] = s[k];
}

__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float4 add_rn(float4 a, float4 b) {
  return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

template <class V>
__global__ void add_rows_kernel(float* x, int64_t dimv, const float* table, const int32_t* rows) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const V* r = reinterpret_cast<const V*>(table) + int64_t(rows[t]) * dimv;
  V* xt = reinterpret_cast<V*>(x) + t * dimv;
  for (int64_t k = threadIdx.x; k < dimv; k += blockDim.x) xt[k] = add_rn(xt[k], r[k]);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Threads of a row-copy block: enough for one pass over short rows, at most 256.
inline int row_threads(int64_t dimv) { return int(std::min<int64_t>(256, std::max<int64_t>(32, (dimv + 31) / 32 * 32))); }

// ---- swiglu ------------------------------------------------------------------------------------------------------
// std::min / std::max semantics (NaN-propagating the way the CPU's calls are): min(a, b) = b < a ? b : a.
__global__ void swiglu_kernel(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit,
                              const float* row_w, bool bf16, float* h) {
  const int64_t n = n_rows * dim;
  for (int64_t i = gtid(); i < n; i += gstride()) {
    float gv = g[i], uv = up[i];
    if (limit > 0) {
      uv = uv < -limit ? -limit : uv;  // std::max(uv, -limit)
      uv = limit < uv ? limit : uv;    // std::min(., limit)
      gv = limit < gv ? limit : gv;    // std::min(gv, limit)
    }
    float v = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf_glibc(-gv))), uv);  // (g / (1 + exp(-g))) * up
    if (row_w) v = __fmul_rn(row_w[i / dim], v);
    h[i] = maybe_bf16(v, bf16);
  }
}

}  // namespace

void fill(float* x, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return;
  fill_kernel<<<stride_grid(n), kThreads, 0, stream>>>(x, n, value);
}

void round_bf16(float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  launch_pdl(round_bf16_kernel, stride_grid(n), kThreads, 0, stream, x, n);
}

void scale(float* x, int64_t n, float alpha, bool bf16, cudaStream_t stream) {
  if (n <= 0) return;
  launch_pdl(scale_kernel, stride_grid(n), kThreads, 0, stream, x, n, alpha, bf16);
}

void embed(const WeightView& table, const int32_t* ids, int64_t n_tok, int copies, float* out, cudaStream_t stream) {
  if (n_tok <= 0 || copies <= 0 || table.cols <= 0) return;
  const int threads = int(std::min<int64_t>(256, (table.cols + 31) / 32 * 32));
  launch_pdl(embed_kernel, unsigned(n_tok), threads, 0, stream, table.w, table.row_bytes(),
             table.fmt == GemmFormat::bf16, ids, table.cols, copies, out);
}

void rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16, float* y,
             cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  const bool vec = dim % 4 == 0 && aligned16(x) && aligned16(y) && (w == nullptr || aligned16(w));
  if (vec && dim <= 1024) {  // a warp per row, up to 8 float4 per lane
    constexpr int rpb = kThreads / 32;
    launch_pdl(rmsnorm_vec_kernel<32, 8>, unsigned((n_rows + rpb - 1) / rpb), kThreads, 0, stream, x, n_rows, dim, w,
               eps, bf16, y);
  } else if (vec && dim <= 8192) {  // a block per row, up to 8 float4 per thread
    launch_pdl(rmsnorm_vec_kernel<kThreads, 8>, unsigned(n_rows), kThreads, 0, stream, x, n_rows, dim, w, eps, bf16, y);
  } else if (dim <= 1024) {
    constexpr int rpb = kThreads / 32;
    launch_pdl(rmsnorm_kernel<32>, unsigned((n_rows + rpb - 1) / rpb), kThreads, 0, stream, x, n_rows, dim, w, eps,
               bf16, y);
  } else {
    launch_pdl(rmsnorm_kernel<kThreads>, unsigned(n_rows), kThreads, 0, stream, x, n_rows, dim, w, eps, bf16, y);
  }
}

void head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16, cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  if (dim <= 1024) {
    constexpr int rpb = kThreads / 32;
    launch_pdl(head_rms_kernel<32, false>, unsigned((n_rows + rpb - 1) / rpb), kThreads, 0, stream, x, n_rows, dim, eps,
               bf16, int64_t(1), int64_t(0), nullptr);
  } else {
    launch_pdl(head_rms_kernel<kThreads, false>, unsigned(n_rows), kThreads, 0, stream, x, n_rows, dim, eps, bf16,
               int64_t(1), int64_t(0), nullptr);
  }
}

void rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin, bool inverse,
          bool bf16, cudaStream_t stream) {
  const int64_t n = n_tok * n_heads * (rd / 2);
  if (n <= 0) return;
  launch_pdl(rope_kernel, stride_grid(n), kThreads, 0, stream, x, n_tok, n_heads, head_dim, rd, cos_sin, inverse, bf16);
}

void head_rms_rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, float eps, int64_t rd,
                   const float* cos_sin, bool bf16, cudaStream_t stream) {
  const int64_t n_rows = n_tok * n_heads;
  if (n_rows <= 0 || head_dim <= 0) return;
  if (head_dim <= 1024) {
    constexpr int rpb = kThreads / 32;
    launch_pdl(head_rms_kernel<32, true>, unsigned((n_rows + rpb - 1) / rpb), kThreads, 0, stream, x, n_rows, head_dim,
               eps, bf16, n_heads, rd, cos_sin);
  } else {
    launch_pdl(head_rms_kernel<kThreads, true>, unsigned(n_rows), kThreads, 0, stream, x, n_rows, head_dim, eps, bf16,
               n_heads, rd, cos_sin);
  }
}

void fp8_sim(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block, cudaStream_t stream) {
  if (n_rows <= 0 || n_cols <= 0 || block <= 0) return;
  const int64_t items = n_rows * ((n_cols + block - 1) / block);
  constexpr int wpb = kThreads / 32;
  launch_pdl(quant_sim_kernel<false>, unsigned((items + wpb - 1) / wpb), kThreads, 0, stream, x, n_rows, row_stride,
             n_cols, block);
}

void fp4_sim(float* x, int64_t n_rows, int64_t dim, cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  const int64_t items = n_rows * ((dim + 31) / 32);
  constexpr int wpb = kThreads / 32;
  launch_pdl(quant_sim_kernel<true>, unsigned((items + wpb - 1) / wpb), kThreads, 0, stream, x, n_rows, dim, dim, 32);
}

// dim: a power of two <= 8192 (the row lives in shared memory; the model uses 128). Other dims are rejected by the
// caller (CpuOps fails on a non-power of two); here they launch nothing.
void hadamard(float* x, int64_t n_rows, int64_t dim, bool bf16, cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0 || (dim & (dim - 1)) != 0 || dim > 8192) return;
  const float scale = float(1.0 / std::sqrt(double(dim)));
  const int tpr = int(std::max<int64_t>(1, std::min<int64_t>(dim / 2, kThreads)));
  const int rpb = std::max(1, kThreads / tpr);
  const size_t smem = size_t(rpb) * size_t(dim) * sizeof(float);
  launch_pdl(hadamard_kernel, unsigned((n_rows + rpb - 1) / rpb), tpr * rpb, smem, stream, x, n_rows, int(dim), tpr,
             scale, bf16);
}

void check_finite(const float* x, int64_t n_rows, int64_t dim, int32_t* bad, cudaStream_t stream) {
  if (n_rows <= 0) return;
  (void)cudaMemsetAsync(bad, 0, size_t(n_rows) * sizeof(int32_t), stream);  // an error surfaces at the launch check
  const int64_t chunks = dim > 0 ? (dim + kFiniteChunk - 1) / kFiniteChunk : 1;
  for (int64_t r0 = 0; r0 < n_rows; r0 += 65535) {  // gridDim.y <= 65535
    const int64_t nr = n_rows - r0 < 65535 ? n_rows - r0 : 65535;
    launch_pdl(check_finite_kernel, dim3(unsigned(chunks), unsigned(nr)), 1024, 0, stream, x + r0 * dim, dim, bad + r0);
  }
}

void gather_rows(const float* a, int64_t n_a, const float* b, const int32_t* idx, int64_t n, int64_t dim, float* out,
                 cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return;
  if (dim % 4 == 0 && aligned16(a) && aligned16(b) && aligned16(out)) {
    launch_pdl(gather_rows_kernel<float4>, unsigned(n), row_threads(dim / 4), 0, stream, a, n_a, b, idx, dim / 4, out);
  } else {
    launch_pdl(gather_rows_kernel<float>, unsigned(n), row_threads(dim), 0, stream, a, n_a, b, idx, dim, out);
  }
}

void scatter_rows(const float* src, const int32_t* src_idx, float* dst, const int32_t* dst_idx, int64_t n,
                  int64_t dim, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return;
  if (dim % 4 == 0 && aligned16(src) && aligned16(dst)) {
    launch_pdl(scatter_rows_kernel<float4>, unsigned(n), row_threads(dim / 4), 0, stream, src, src_idx, dst, dst_idx,
               dim / 4);
  } else {
    launch_pdl(scatter_rows_kernel<float>, unsigned(n), row_threads(dim), 0, stream, src, src_idx, dst, dst_idx, dim);
  }
}

void add_rows(float* x, int64_t n, int64_t dim, const float* table, const int32_t* rows, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return;
  if (dim % 4 == 0 && aligned16(x) && aligned16(table)) {
    launch_pdl(add_rows_kernel<float4>, unsigned(n), row_threads(dim / 4), 0, stream, x, dim / 4, table, rows);
  } else {
    launch_pdl(add_rows_kernel<float>, unsigned(n), row_threads(dim), 0, stream, x, dim, table, rows);
  }
}

void swiglu(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit, const float* row_w, bool bf16,
            float* h, cudaStream_t stream) {
  const int64_t n = n_rows * dim;
  if (n <= 0) return;
  swiglu_kernel<<<stride_grid(n), kThreads, 0, stream>>>(g, up, n_rows, dim, limit, row_w, bf16, h);
}

}  // namespace dsv4::cuda
