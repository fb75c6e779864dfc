// glibc's expf and log1pf, transcribed for the device with every operation rounded as glibc's C code rounds it, so
// that CUDA kernels reproduce the CPU backend's std::exp / std::log1p (glibc 2.36-2.39 on x86-64; expf checked
// bitwise on all 2^32 inputs, FMA and non-FMA code paths alike) and with it the CPU's results bit for bit.
// Sources: glibc sysdeps/ieee754/flt-32/e_expf.c (EXP2F_TABLE_BITS 5, polynomial order 3) and s_log1pf.c (fdlibm).
#pragma once
#include <cstdint>

namespace dsv4::cuda {
namespace glibc_detail {

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

__device__ __forceinline__ float expf_glibc(float x) {
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

__device__ __forceinline__ float log1pf_glibc(float x) {
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

}  // namespace glibc_detail
using glibc_detail::expf_glibc;
using glibc_detail::log1pf_glibc;
}  // namespace dsv4::cuda
