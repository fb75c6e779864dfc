// Compressor pooling (spec §5.5; semantics: Ops::compress_pool in backend/ops.h; reference: CpuOps::compress_pool in
// backend/cpu_ops.cpp).
//
// One thread per (emitted row e, feature d), one CTA per (e, 256 features): the CTA resolves the candidate rows of e
// once (shared memory), then each thread runs the CPU's three passes over the candidates in candidate order: the max
// of the scores, the sum of exp(s - max), and acc += kv * (exp(s - max) / sum) skipping -inf scores. Every operation
// is the CPU's, in its order, with explicit round-to-nearest intrinsics (no FMA contraction), and exp is glibc's expf
// algorithm (expf_glibc below), so the output is bitwise equal to the CPU's. Reads are coalesced across d.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kNegInf = -__builtin_huge_valf();

// ---- expf, bit-identical to glibc (sysdeps/ieee754/flt-32/e_expf.c, EXP2F_TABLE_BITS 5, poly order 3) ------------
// (The same function is in k_attention.cu; keep the two copies identical.) Checked bitwise against glibc 2.36 libm
// expf for all 2^32 float inputs (glibc's FMA and non-FMA code paths give the same bits).
__device__ const uint64_t kExp2fTab[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull};

__device__ __forceinline__ float expf_glibc(float x) {
  const uint32_t ux = __float_as_uint(x);
  const uint32_t abstop = (ux >> 20) & 0x7ffu;
  if (abstop >= 0x42bu) {                          // |x| >= 88 or x is NaN
    if (ux == 0xff800000u) return 0.0f;            // -inf
    if (abstop >= 0x7f8u) return __fadd_rn(x, x);  // +inf or NaN
    if (x > 0x1.62e42ep6f) return __int_as_float(0x7f800000);  // overflow
    if (x < -0x1.9fe368p6f) return 0.0f;                       // underflow
    if (x < -0x1.9d1d9ep6f) return __int_as_float(1);          // glibc __math_may_uflowf: 0x1.4p-75f^2 = 2^-149
  }
  const double InvLn2N = 0x1.71547652b82fep+0 * 32.0, Shift = 0x1.8p+52;
  const double C0 = 0x1.c6af84b912394p-5 / 32.0 / 32.0 / 32.0, C1 = 0x1.ebfce50fac4f3p-3 / 32.0 / 32.0,
               C2 = 0x1.62e42ff0c52d6p-1 / 32.0;
  const double xd = double(x);
  double kd = __fma_rn(InvLn2N, xd, Shift);
  const uint64_t ki = uint64_t(__double_as_longlong(kd));
  kd = __dsub_rn(kd, Shift);
  const double r = __fma_rn(InvLn2N, xd, -kd);
  const uint64_t t = kExp2fTab[ki % 32] + (ki << 47);
  const double s = __longlong_as_double((long long)t);
  const double z = __fma_rn(C0, r, C1);
  const double r2 = __dmul_rn(r, r);
  double y = __fma_rn(C2, r, 1.0);
  y = __fma_rn(z, r2, y);
  y = __dmul_rn(y, s);
  return __double2float_rn(y);
}

__global__ void __launch_bounds__(kThreads) compress_pool_kernel(const float* kv, const float* score, int64_t n_tok,
                                                                 const float* state_kv, const float* state_score,
                                                                 const int32_t* cand, int64_t n_cand, int coff,
                                                                 int64_t c, int64_t n_db, float* out) {
  extern __shared__ unsigned long long smem_u64[];
  const float** rk = reinterpret_cast<const float**>(smem_u64);  // [n_cand] kv row (column-offset) or nullptr
  const float** rs = rk + n_cand;                                 // [n_cand] score row

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
  compress_pool_kernel<<<unsigned(grid), threads, smem, stream>>>(kv, score, n_tok, state_kv, state_score, cand,
                                                                 n_cand, coff, c, n_db, out);
}

}  // namespace dsv4::cuda
