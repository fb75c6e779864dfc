// Compressor pooling (spec §5.5; semantics: Ops::compress_pool in backend/ops.h; reference: CpuOps::compress_pool in
// backend/cpu_ops.cpp).
//
// One thread per (emitted row e, feature d), one CTA per (e, 256 features): the CTA resolves the candidate rows of e
// once (shared memory), then each thread runs the CPU's three passes over the candidates in candidate order: the max
// of the scores, the sum of exp(s - max), and acc += kv * (exp(s - max) / sum) skipping -inf scores. Every operation
// is the CPU's, in its order, with explicit round-to-nearest intrinsics (no FMA contraction), and exp is glibc's expf
// algorithm (expf_glibc, backend/cuda/glibc_math.cuh), so the output is bitwise equal to the CPU's. Reads are
// coalesced across d.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/device_pdl.cuh"
#include "backend/cuda/glibc_math.cuh"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kNegInf = -__builtin_huge_valf();

__global__ void __launch_bounds__(kThreads) compress_pool_kernel(const float* kv, const float* score, int64_t n_tok,
                                                                 const float* state_kv, const float* state_score,
                                                                 const int32_t* cand, int64_t n_cand, int coff,
                                                                 int64_t c, int64_t n_db, float* out) {
  extern __shared__ unsigned long long smem_u64[];
  const float** rk = reinterpret_cast<const float**>(smem_u64);  // [n_cand] kv row (column-offset) or nullptr
  const float** rs = rk + n_cand;                                 // [n_cand] score row
  pdl_wait();
  pdl_launch_dependents();

  const int64_t e = int64_t(blockIdx.x) / n_db, db = int64_t(blockIdx.x) % n_db;
  const int64_t width = int64_t(coff) * c, half = n_cand / 2;
  const int32_t* ce = cand + e * n_cand;
  for (int64_t j = threadIdx.x; j < n_cand; j += blockDim.x) {
    const int64_t i = ce[j];
    const float *pk = nullptr, *ps = nullptr;
    if (i >= 0) {
      const int64_t col = (coff == 2 && j >= half) ? c : 0;
      pk = (i < n_tok ? kv + i * width : state_kv + (i - n_tok) * width) + col;
      ps = (i < n_tok ? score + i * width : state_score + (i - n_tok) * width) + col;
    }
    rk[j] = pk;
    rs[j] = ps;
  }
  __syncthreads();
  const int64_t d = db * blockDim.x + threadIdx.x;
  if (d >= c) return;

  float mx = kNegInf;
  for (int64_t j = 0; j < n_cand; ++j) {
    const float v = rs[j] ? rs[j][d] : kNegInf;
    mx = mx < v ? v : mx;  // std::max(mx, v)
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n_cand; ++j) {
    const float v = rs[j] ? rs[j][d] : kNegInf;
    sum = __fadd_rn(sum, expf_glibc(__fsub_rn(v, mx)));
  }
  float acc = 0.0f;
  for (int64_t j = 0; j < n_cand; ++j) {
    const float v = rs[j] ? rs[j][d] : kNegInf;
    if (v == kNegInf) continue;
    acc = __fadd_rn(acc, __fmul_rn(rk[j][d], __fdiv_rn(expf_glibc(__fsub_rn(v, mx)), sum)));
  }
  out[e * c + d] = acc;
}

}  // namespace

void compress_pool(const float* kv, const float* score, int64_t n_tok, const float* state_kv, const float* state_score,
                   const int32_t* cand, int64_t n_emit, int64_t n_cand, int coff, int64_t c, float* out,
                   cudaStream_t stream) {
  if (n_emit <= 0 || c <= 0) return;
  const int threads = int(std::min<int64_t>(kThreads, (c + 31) / 32 * 32));
  const int64_t n_db = (c + threads - 1) / threads;
  const int64_t grid = n_emit * n_db;
  const size_t smem = size_t(std::max<int64_t>(n_cand, 1)) * 2 * sizeof(const float*);
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(compress_pool_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  launch_pdl(compress_pool_kernel, unsigned(grid), threads, smem, stream, kv, score, n_tok, state_kv, state_score, cand,
             n_cand, coff, c, n_db, out);
}

}  // namespace dsv4::cuda
