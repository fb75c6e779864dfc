// MoE router (CpuOps::route, spec §5.7): sc = sqrt(softplus(logits)), bias-corrected top-k (ties -> lower id) or
// hash routing ids[t, i] = tid2eid[tokens[t] * k + i], weights sc[id] / sum(sc[ids]) * route_scale.
//
// One warp per token. Bitwise equal to the CPU: softplus uses bit-exact ports of the glibc float functions the CPU
// build calls (std::exp -> expf, std::log1p -> log1pf; checked against the host libm on every binary32 input),
// sqrt is correctly rounded on both sides, every other operation is written without contraction in the CPU's order.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

constexpr int kMaxExperts = 512;
constexpr int kWarps = 4;

// ---- glibc 2.36 expf, FMA variant (see k_gemm.cu) ----
__device__ const unsigned long long kExp2fTab[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull};

__device__ __forceinline__ float glibc_expf(float x) {
  const uint32_t ux = __float_as_uint(x), abstop = (ux >> 20) & 0x7FFu;
  if (abstop > 0x42Au) {
    if (ux == 0xFF800000u) return 0.0f;
    if (abstop >= 0x7F8u) return __fadd_rn(x, x);
    if (x > __uint_as_float(0x42B17217u)) return __uint_as_float(0x7F800000u);
    if (x < __uint_as_float(0xC2CFF1B4u)) return 0.0f;
    if (x < __uint_as_float(0xC2CE8ECFu)) return __uint_as_float(1u);
  }
  const double kInvLn2N = __longlong_as_double(0x40471547652b82feLL);
  const double kShift = __longlong_as_double(0x4338000000000000LL);
  const double C0 = __longlong_as_double(0x3ebc6af84b912394LL);
  const double C1 = __longlong_as_double(0x3f2ebfce50fac4f3LL);
  const double C2 = __longlong_as_double(0x3f962e42ff0c52d6LL);
  const double xd = static_cast<double>(x);
  double kd = __fma_rn(kInvLn2N, xd, kShift);
  const unsigned long long ki = static_cast<unsigned long long>(__double_as_longlong(kd));
  kd = __dsub_rn(kd, kShift);
  const double r = __fma_rn(kInvLn2N, xd, -kd);
  const unsigned long long t = kExp2fTab[ki & 31] + (ki << 47);
  const double z = __fma_rn(r, C0, C1);
  const double r2 = __dmul_rn(r, r);
  double y = __fma_rn(r, C2, 1.0);
  y = __fma_rn(z, r2, y);
  y = __dmul_rn(y, __longlong_as_double(static_cast<long long>(t)));
  return __double2float_rn(y);
}

// ---- glibc 2.36 log1pf (sysdeps/ieee754/flt-32/s_log1pf.c, fdlibm), every operation rounded as written ----
__device__ __forceinline__ float fm(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float fa(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float fs(float a, float b) { return __fsub_rn(a, b); }

__device__ float glibc_log1pf(float x) {
  const float ln2_hi = 6.9313812256e-01f, ln2_lo = 9.0580006145e-06f;
  const float Lp1 = 6.6666668653e-01f, Lp2 = 4.0000000596e-01f, Lp3 = 2.8571429849e-01f, Lp4 = 2.2222198546e-01f,
              Lp5 = 1.8183572590e-01f, Lp6 = 1.5313838422e-01f, Lp7 = 1.4798198640e-01f;
  float hfsq, f = 0.0f, c = 0.0f, s, z, R, u;
  int32_t k, hu = 0;
  const int32_t hx = __float_as_int(x), ax = hx & 0x7fffffff;
  k = 1;
  if (hx < 0x3ed413d7) {                       // x < 0.41422
    if (ax >= 0x3f800000) {                    // x <= -1.0
      if (x == -1.0f) return __int_as_float(static_cast<int32_t>(0xff800000u));  // -inf
      return __int_as_float(0x7fc00000);       // NaN
    }
    if (ax < 0x31000000) {                     // |x| < 2**-29
      if (ax < 0x24800000) return x;           // |x| < 2**-54
      return fs(x, fm(fm(x, x), 0.5f));
    }
    if (hx > 0 || hx <= static_cast<int32_t>(0xbe95f61fu)) {  // -0.2929 < x < 0.41422
      k = 0;
      f = x;
      hu = 1;
    }
  }
  if (hx >= 0x7f800000) return fa(x, x);
  if (k != 0) {
    if (hx < 0x5a000000) {
      u = fa(1.0f, x);
      hu = __float_as_int(u);
      k = (hu >> 23) - 127;
      c = (k > 0) ? fs(1.0f, fs(u, x)) : fs(x, fs(u, 1.0f));  // correction term
      c = __fdiv_rn(c, u);
    } else {
      u = x;
      hu = __float_as_int(u);
      k = (hu >> 23) - 127;
      c = 0.0f;
    }
    hu &= 0x007fffff;
    if (hu < 0x3504f7) {
      u = __int_as_float(hu | 0x3f800000);  // normalize u
    } else {
      k += 1;
      u = __int_as_float(hu | 0x3f000000);  // normalize u/2
      hu = (0x00800000 - hu) >> 2;
    }
    f = fs(u, 1.0f);
  }
  hfsq = fm(fm(0.5f, f), f);
  const float kf = static_cast<float>(k);
  if (hu == 0) {  // |f| < 2**-20
    if (f == 0.0f) {
      if (k == 0) return 0.0f;
      c = fa(c, fm(kf, ln2_lo));
      return fa(fm(kf, ln2_hi), c);
    }
    R = fm(hfsq, fs(1.0f, fm(0.66666666666666666f, f)));
    if (k == 0) return fs(f, R);
    return fs(fm(kf, ln2_hi), fs(fs(R, fa(fm(kf, ln2_lo), c)), f));
  }
  s = __fdiv_rn(f, fa(2.0f, f));
  z = fm(s, s);
  {  // R = z*(Lp1+z*(Lp2+z*(Lp3+z*(Lp4+z*(Lp5+z*(Lp6+z*Lp7))))))
    float r = fm(z, Lp7);
    r = fm(z, fa(Lp6, r));
    r = fm(z, fa(Lp5, r));
    r = fm(z, fa(Lp4, r));
    r = fm(z, fa(Lp3, r));
    r = fm(z, fa(Lp2, r));
    R = fm(z, fa(Lp1, r));
  }
  if (k == 0) return fs(f, fs(hfsq, fm(s, fa(hfsq, R))));
  return fs(fm(kf, ln2_hi), fs(fs(hfsq, fa(fm(s, fa(hfsq, R)), fa(fm(kf, ln2_lo), c))), f));
}

// (value, id) order of the top-k: higher value first, ties -> lower id; id < 0 = no candidate (worst).
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  return va > vb || (va == vb && ia < ib);
}

__global__ void __launch_bounds__(kWarps * 32) route_kernel(const float* logits, int64_t n_tok, int64_t E, int64_t k,
                                                            const float* bias, const int32_t* tid2eid,
                                                            const int32_t* tokens, float route_scale, int32_t* ids_out,
                                                            float* w_out) {
  __shared__ float sc_s[kWarps][kMaxExperts];
  __shared__ float sel_s[kWarps][kMaxExperts];
  __shared__ int32_t ids_s[kWarps][8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * kWarps + warp;
  if (t >= n_tok) return;
  float* sc = sc_s[warp];
  float* sel = sel_s[warp];
  for (int64_t e = lane; e < E; e += 32) {
    const float l = logits[t * E + e];
    const float sp = l > 20.0f ? l : glibc_log1pf(glibc_expf(l));
    const float v = __fsqrt_rn(sp);
    sc[e] = v;
    sel[e] = bias ? __fadd_rn(v, bias[e]) : v;
  }
  __syncwarp();
  int32_t* ids = ids_out + t * k;
  if (tid2eid) {
    if (lane < k) ids_s[warp][lane] = tid2eid[int64_t(tokens[t]) * k + lane];
  } else {
    uint32_t taken = 0;  // bit j: expert lane + 32 j already selected
    for (int64_t i = 0; i < k; ++i) {
      float bv = 0.0f;
      int bi = -1;
      for (int j = 0; lane + 32 * j < E; ++j) {
        const int e = lane + 32 * j;
        if ((taken >> j) & 1u) continue;
        if (better(sel[e], e, bv, bi)) bv = sel[e], bi = e;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
        if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
      }
      if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
      if (lane == 0) ids_s[warp][i] = bi;
    }
  }
  __syncwarp();
  if (lane == 0) {
    // out-of-range ids (a bad hash table) read sc = 0 instead of faulting
    float s = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t id = ids_s[warp][i];
      s = __fadd_rn(s, (id >= 0 && id < E) ? sc[id] : 0.0f);
    }
    for (int64_t i = 0; i < k; ++i) {
      const int32_t id = ids_s[warp][i];
      ids[i] = id;
      w_out[t * k + i] = __fmul_rn(__fdiv_rn((id >= 0 && id < E) ? sc[id] : 0.0f, s), route_scale);
    }
  }
}

}  // namespace

void route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias, const int32_t* tid2eid,
           const int32_t* tokens, float route_scale, int32_t* ids_out, float* w_out, cudaStream_t stream) {
  if (n_tok <= 0) return;
  if (n_experts <= 0 || n_experts > kMaxExperts) gemm_internal::fail_msg("route: n_experts must be in 1..512");
  if (k <= 0 || k > 8 || k > n_experts) gemm_internal::fail_msg("route: k must be in 1..min(8, n_experts)");
  const int64_t blocks = (n_tok + kWarps - 1) / kWarps;
  route_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(logits, n_tok, n_experts, k, bias, tid2eid,
                                                                          tokens, route_scale, ids_out, w_out);
}

}  // namespace dsv4::cuda
