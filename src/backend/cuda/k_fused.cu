// Fused neighbour ops of a decode step (fused_kernels.h; semantics: backend/ops.h). Each kernel repeats the
// arithmetic of the kernels it replaces (k_elementwise.cu) in the same order, so its result is bitwise theirs; the
// launchers fall back to those kernels where a shape does not fit. All kernels follow device_pdl.cuh's rules.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/device_pdl.cuh"
#include "backend/cuda/device_rope.cuh"
#include "backend/cuda/fused_kernels.h"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Max |v| over the 32 lanes of a warp with the CPU's `a > m ? a : m` from 0 (order-independent; NaNs never win).
__device__ __forceinline__ float warp_amax(float m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float a = __shfl_xor_sync(0xFFFFFFFFu, m, o);
    m = a > m ? a : m;
  }
  return m;
}

// ---- norm_rope_fp8: a warp per row (rmsnorm_vec_kernel<32, 8>'s loads and sums), then the row's rope pairs
// (rope_kernel), then its FP8 blocks of 64 (quant_sim_kernel<false>), each stage reading what the one before wrote -----
constexpr int kNormNv = 8;        // float4 per lane: rows of <= 1024 floats
constexpr int64_t kMaxStoreIn = 64;  // store entries scanned by every warp

// Then every store entry i whose source is this row: store row store_dst[i] = the row (each entry's source row
// belongs to one warp, which wrote it: no other warp's rows are read).
__global__ void norm_rope_fp8_kernel(float* x, int64_t n_rows, int64_t dim, const float* w, float eps, int64_t rd,
                                     const float* cos_sin, bool bf16, const int32_t* store_src, float* store,
                                     const int32_t* store_dst, int64_t n_store) {
  constexpr int RPB = kThreads / 32;
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * RPB + threadIdx.x / 32;
  if (r >= n_rows) return;  // whole warps
  // 1. rmsnorm (in place)
  const int64_t d4 = dim / 4;
  float4* xr = reinterpret_cast<float4*>(x + r * dim);
  float4 v[kNormNv];
#pragma unroll
  for (int j = 0; j < kNormNv; ++j) {
    const int64_t i = lane + int64_t(j) * 32;
    v[j] = i < d4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  double ss = 0;
#pragma unroll
  for (int j = 0; j < kNormNv; ++j) {  // exact products (48 significant bits); zeros past the row add nothing
    ss += double(v[j].x) * double(v[j].x);
    ss += double(v[j].y) * double(v[j].y);
    ss += double(v[j].z) * double(v[j].z);
    ss += double(v[j].w) * double(v[j].w);
  }
  ss = row_sum<32>(ss, nullptr);
  const float s = rms_scale(ss, dim, eps);
  const float4* w4 = reinterpret_cast<const float4*>(w);
#pragma unroll
  for (int j = 0; j < kNormNv; ++j) {
    const int64_t i = lane + int64_t(j) * 32;
    if (i >= d4) continue;
    float4 o;
    const float4 wv = w ? w4[i] : make_float4(1.f, 1.f, 1.f, 1.f);
    o.x = __fmul_rn(v[j].x, s), o.y = __fmul_rn(v[j].y, s), o.z = __fmul_rn(v[j].z, s), o.w = __fmul_rn(v[j].w, s);
    if (w) o.x = __fmul_rn(wv.x, o.x), o.y = __fmul_rn(wv.y, o.y), o.z = __fmul_rn(wv.z, o.z), o.w = __fmul_rn(wv.w, o.w);
    o.x = maybe_bf16(o.x, bf16), o.y = maybe_bf16(o.y, bf16), o.z = maybe_bf16(o.z, bf16), o.w = maybe_bf16(o.w, bf16);
    xr[i] = o;
  }
  __syncwarp();
  // 2. rope of the last rd dims (one head per row: the row's own cos/sin)
  float* xs = x + r * dim;
  const float* cs = cos_sin + r * rd;
  for (int64_t i = lane; i < rd / 2; i += 32) rope_pair(xs + dim - rd + 2 * i, cs[2 * i], cs[2 * i + 1], bf16);
  __syncwarp();
  // 3. fp8_sim of columns [0, dim - rd) in blocks of 64
  const int64_t n_cols = bf16 ? dim - rd : 0;
  for (int64_t b0 = 0; b0 < n_cols; b0 += 64) {
    float* vb = xs + b0;
    const int64_t len = n_cols - b0 < 64 ? n_cols - b0 : 64;
    float m = 0.0f;
    for (int64_t i = lane; i < len; i += 32) {
      const float a = fabsf(vb[i]);
      m = a > m ? a : m;
    }
    m = warp_amax(m);
    const float sc = fp8_act_scale(m);
    const float inv = __fdiv_rn(1.0f, sc);
    for (int64_t i = lane; i < len; i += 32) vb[i] = fp8_sim_value(vb[i], sc, inv);
  }
  if (n_store == 0) return;
  __syncwarp();
  // 4. the row's store entries (scatter_rows)
  for (int64_t i = 0; i < n_store; ++i) {
    if (store_src[i] != r) continue;
    float4* d = reinterpret_cast<float4*>(store + int64_t(store_dst[i]) * dim);
    for (int64_t k = lane; k < d4; k += 32) d[k] = xr[k];
  }
}

// ---- rope_hadamard_fp4: hadamard_kernel's layout (TPR threads per row, the row in shared memory); the rope pairs
// in shared memory first (rope_kernel, bf16), the butterflies, the scaled bf16 row, then its FP4 blocks of 32
// (quant_sim_kernel<true>), a warp per block (TPR is a multiple of 32) ------------------------------------------------
__global__ void rope_hadamard_fp4_kernel(float* x, int64_t n_rows, int dim, int tpr, int64_t n_heads, int64_t rd,
                                         const float* cos_sin, float scale) {
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
  if (valid) {
    const float* cs = cos_sin + (r / n_heads) * rd;
    for (int64_t i = lane; i < rd / 2; i += tpr) rope_pair(v + dim - rd + 2 * i, cs[2 * i], cs[2 * i + 1], true);
  }
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
    for (int i = lane; i < dim; i += tpr) v[i] = round_bf16(__fmul_rn(v[i], scale));
  __syncthreads();
  if (!valid) return;  // (a row's warps are all valid or all not)
  const int l32 = lane % 32;
  for (int b = lane / 32; b < dim / 32; b += tpr / 32) {
    const float e = v[b * 32 + l32];
    const float a = fabsf(e);
    const float m = warp_amax(a > 0.0f ? a : 0.0f);
    const float sc = fp4_act_scale(m);
    const float inv = __fdiv_rn(1.0f, sc);
    xr[b * 32 + l32] = fp4_sim_value(e, sc, inv);
  }
}

// ---- frontier_update -----------------------------------------------------------------------------------------------
constexpr int kFrontierMaxRows = 32;  // rows of one fused call (decode: <= 4 per sequence and compressor)
constexpr int kFrontierThreads = 128;

__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float4 add_rn(float4 a, float4 b) {
  return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

// Array blockIdx.y (0: kv / state_kv, 1: score / state_score); each thread owns one column (V) of every row of its
// array: it adds ape to its column of the step rows (array 1), reads its column of every source row, then writes
// every destination row. No other thread touches that column, so all reads precede all writes as the gather +
// scatter they stand for.
template <class V>
__global__ void __launch_bounds__(kFrontierThreads)
frontier_update_kernel(const float* kv, float* score, int64_t n_tok, const float* ape, const int32_t* ape_row,
                       float* state_kv, float* state_score, const int32_t* idx, const int32_t* dst, int n,
                       int64_t dimv) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t c = int64_t(blockIdx.x) * kFrontierThreads + threadIdx.x;
  if (c >= dimv) return;
  const bool s_arr = blockIdx.y == 1;
  V* step = reinterpret_cast<V*>(s_arr ? score : const_cast<float*>(kv));
  V* state = reinterpret_cast<V*>(s_arr ? state_score : state_kv);
  if (s_arr && ape != nullptr)
    for (int64_t t = 0; t < n_tok; ++t)
      step[t * dimv + c] = add_rn(step[t * dimv + c], reinterpret_cast<const V*>(ape)[int64_t(ape_row[t]) * dimv + c]);
  V v[kFrontierMaxRows];
#pragma unroll
  for (int i = 0; i < kFrontierMaxRows; ++i)
    if (i < n) {
      const int64_t j = idx[i];
      v[i] = j < n_tok ? step[j * dimv + c] : state[(j - n_tok) * dimv + c];
    }
#pragma unroll
  for (int i = 0; i < kFrontierMaxRows; ++i)
    if (i < n) state[int64_t(dst[i]) * dimv + c] = v[i];
}

// Larger calls: GATHER (block (i, array)) tmp[array, i] = source row idx[i]; else state row dst[i] = tmp[array, i].
template <class V, bool GATHER>
__global__ void frontier_move_kernel(const float* kv, const float* score, int64_t n_tok, float* state_kv,
                                     float* state_score, const int32_t* idx, const int32_t* dst, int64_t n,
                                     int64_t dimv, float* tmp) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = blockIdx.x;
  const bool s_arr = blockIdx.y == 1;
  V* state = reinterpret_cast<V*>(s_arr ? state_score : state_kv);
  V* t = reinterpret_cast<V*>(tmp) + (int64_t(blockIdx.y) * n + i) * dimv;
  if (GATHER) {
    const int64_t j = idx[i];
    const V* src = j < n_tok ? reinterpret_cast<const V*>(s_arr ? score : kv) + j * dimv : state + (j - n_tok) * dimv;
    for (int64_t k = threadIdx.x; k < dimv; k += blockDim.x) t[k] = src[k];
  } else {
    V* d = state + int64_t(dst[i]) * dimv;
    for (int64_t k = threadIdx.x; k < dimv; k += blockDim.x) d[k] = t[k];
  }
}

template <class V>
void launch_frontier(const float* kv, float* score, int64_t n_tok, const float* ape, const int32_t* ape_row,
                     float* state_kv, float* state_score, const int32_t* idx, const int32_t* dst, int64_t n,
                     int64_t dim, float* tmp, cudaStream_t stream) {
  const int64_t dimv = dim / int64_t(sizeof(V) / sizeof(float));
  if (n <= kFrontierMaxRows) {
    const dim3 grid(unsigned((dimv + kFrontierThreads - 1) / kFrontierThreads), 2u);
    launch_pdl(frontier_update_kernel<V>, grid, kFrontierThreads, 0, stream, kv, score, n_tok, ape, ape_row, state_kv,
               state_score, idx, dst, int(n), dimv);
    return;
  }
  const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (dimv + 31) / 32 * 32)));
  const dim3 grid(unsigned(n), 2u);
  launch_pdl(frontier_move_kernel<V, true>, grid, threads, 0, stream, kv, static_cast<const float*>(score), n_tok,
             state_kv, state_score, idx, dst, n, dimv, tmp);
  launch_pdl(frontier_move_kernel<V, false>, grid, threads, 0, stream, kv, static_cast<const float*>(score), n_tok,
             state_kv, state_score, idx, dst, n, dimv, tmp);
}

}  // namespace

void norm_rope_fp8(float* x, int64_t n_rows, int64_t dim, const float* w, float eps, int64_t rd, const float* cos_sin,
                   bool bf16, const int32_t* store_src, float* store, const int32_t* store_dst, int64_t n_store,
                   cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  if (store == nullptr) n_store = 0;
  // rmsnorm() takes rmsnorm_vec_kernel<32, 8> for exactly these rows
  const bool one = dim % 4 == 0 && dim <= 32 * 4 * kNormNv && aligned16(x) && (w == nullptr || aligned16(w)) &&
                   rd >= 0 && rd <= dim && rd % 2 == 0;
  // the stores inside when each warp's scan of the entries stays short (decode)
  const bool store_in = one && n_store > 0 && n_store <= kMaxStoreIn && aligned16(store);
  if (!one) {
    rmsnorm(x, n_rows, dim, w, eps, bf16, x, stream);
    rope(x, n_rows, 1, dim, rd, cos_sin, false, bf16, stream);
    if (bf16) fp8_sim(x, n_rows, dim, dim - rd, 64, stream);
  } else {
    constexpr int rpb = kThreads / 32;
    launch_pdl(norm_rope_fp8_kernel, unsigned((n_rows + rpb - 1) / rpb), kThreads, 0, stream, x, n_rows, dim, w, eps,
               rd, cos_sin, bf16, store_src, store, store_dst, store_in ? n_store : int64_t(0));
  }
  if (n_store > 0 && !store_in) scatter_rows(x, store_src, store, store_dst, n_store, dim, stream);
}

void rope_hadamard_fp4(float* x, int64_t n_tok, int64_t n_heads, int64_t dim, int64_t rd, const float* cos_sin,
                       cudaStream_t stream) {
  const int64_t n_rows = n_tok * n_heads;
  if (n_rows <= 0 || dim <= 0) return;
  const bool one = (dim & (dim - 1)) == 0 && dim >= 64 && dim <= 8192 && rd >= 0 && rd <= dim && rd % 2 == 0;
  if (!one) {
    rope(x, n_tok, n_heads, dim, rd, cos_sin, false, true, stream);
    hadamard(x, n_rows, dim, true, stream);
    fp4_sim(x, n_rows, dim, stream);
    return;
  }
  // hadamard()'s shape and scale
  const float scale = float(1.0 / std::sqrt(double(dim)));
  const int tpr = int(std::min<int64_t>(dim / 2, kThreads));
  const int rpb = std::max(1, kThreads / tpr);
  const size_t smem = size_t(rpb) * size_t(dim) * sizeof(float);
  launch_pdl(rope_hadamard_fp4_kernel, unsigned((n_rows + rpb - 1) / rpb), tpr * rpb, smem, stream, x, n_rows,
             int(dim), tpr, n_heads, rd, cos_sin, scale);
}

size_t frontier_update_scratch_bytes(int64_t n_tok, int64_t n, int64_t dim) {
  (void)n_tok;
  return n <= kFrontierMaxRows || dim <= 0 ? 0 : size_t(2 * n * dim) * sizeof(float);
}

void frontier_update(const float* kv, float* score, int64_t n_tok, const float* ape, const int32_t* ape_row,
                     float* state_kv, float* state_score, const int32_t* idx, const int32_t* dst, int64_t n,
                     int64_t dim, float* tmp, cudaStream_t stream) {
  if (dim <= 0) return;
  // the ape add inside the one-kernel path only (long loops per thread otherwise)
  if (ape != nullptr && (n_tok > kFrontierMaxRows || n <= 0 || n > kFrontierMaxRows)) {
    add_rows(score, n_tok, dim, ape, ape_row, stream);
    ape = nullptr;
  }
  if (n <= 0) return;
  const bool vec = dim % 4 == 0 && aligned16(kv) && aligned16(score) && aligned16(state_kv) &&
                   aligned16(state_score) && (ape == nullptr || aligned16(ape)) && (tmp == nullptr || aligned16(tmp));
  if (vec)
    launch_frontier<float4>(kv, score, n_tok, ape, ape_row, state_kv, state_score, idx, dst, n, dim, tmp, stream);
  else
    launch_frontier<float>(kv, score, n_tok, ape, ape_row, state_kv, state_score, idx, dst, n, dim, tmp, stream);
}

}  // namespace dsv4::cuda
