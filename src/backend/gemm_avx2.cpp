// AVX2 + FMA + F16C GEMM kernels, compiled with a target pragma and chosen at run time. A panel of 16 output rows is
// two ymm registers; the summation order is that of gemm_scalar.cpp (lanes = rows, sequential in k), bitwise.
#include <cstdint>
#include <cstring>

#include "backend/gemm_kernels.h"
#include "format/numeric.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace dsv4::gemm_detail {
namespace {

// 8 E4M3FN bytes (low half of b) -> 8 floats (exact), as in the AVX-512 kernel.
inline __m256 dec_fp8(__m128i b) {
  __m128i w = _mm_cvtepi8_epi16(b);
  w = _mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16(static_cast<short>(0xBF80)));
  return _mm256_mul_ps(_mm256_cvtph_ps(w), _mm256_set1_ps(256.0f));
}

// 4 packed FP4 bytes (low 32 bits of b) -> 8 floats.
inline __m256 dec_fp4(__m128i b4, __m256 mag_lut) {
  const __m128i w = _mm_cvtepu8_epi16(b4);
  const __m128i n = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x0F)), _mm_slli_epi16(_mm_srli_epi16(w, 4), 8));
  const __m256i idx = _mm256_cvtepu8_epi32(n);
  const __m256 mag = _mm256_permutevar8x32_ps(mag_lut, idx);  // uses idx & 7
  const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(idx, 28), _mm256_set1_epi32(static_cast<int>(0x80000000u)));
  return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
}

inline __m256 round_bf16(__m256 v) {
  __m256i b = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  b = _mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
  return _mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Decode one row's columns [k0, k0+kc) into out[0..kc_pad) (zeros past kc); kc_pad multiple of 16.
void decode_row(const PanelSrc& s, int64_t r, int64_t k0, int kc, float* out) {
  const uint8_t* row = s.w + r * s.row_bytes;
  const int kc_pad = (kc + 15) & ~15;
  const int kfull = kc & ~7;  // full 8-element vectors
  switch (s.fmt) {
    case GemmFormat::fp8: {
      const uint8_t* p = row + k0;
      for (int k = 0; k < kfull; k += 8)
        _mm256_storeu_ps(out + k, dec_fp8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + k))));
      if (kfull < kc) {
        uint8_t t[16] = {};
        std::memcpy(t, p + kfull, kc - kfull);
        _mm256_storeu_ps(out + kfull, dec_fp8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t))));
      }
      break;
    }
    case GemmFormat::fp4: {
      const __m256 lut = _mm256_loadu_ps(e2m1_lut());
      const uint8_t* p = row + k0 / 2;
      for (int k = 0; k < kfull; k += 8) {
        int32_t v;
        std::memcpy(&v, p + k / 2, 4);
        _mm256_storeu_ps(out + k, dec_fp4(_mm_cvtsi32_si128(v), lut));
      }
      if (kfull < kc) {
        uint8_t t[4] = {};
        std::memcpy(t, p + kfull / 2, (kc - kfull) / 2);
        int32_t v;
        std::memcpy(&v, t, 4);
        _mm256_storeu_ps(out + kfull, dec_fp4(_mm_cvtsi32_si128(v), lut));
      }
      break;
    }
    case GemmFormat::bf16: {
      const uint8_t* p = row + 2 * k0;
      for (int k = 0; k < kfull; k += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * k));
        _mm256_storeu_ps(out + k, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
      }
      for (int k = kfull; k < kc; ++k) {
        uint16_t h;
        std::memcpy(&h, p + 2 * k, 2);
        out[k] = bf16_to_float(h);
      }
      break;
    }
    case GemmFormat::f32:
      std::memcpy(out, row + 4 * k0, sizeof(float) * kc);
      break;
  }
  for (int k = kc; k < kc_pad; ++k) out[k] = 0.0f;
  const bool quantized = s.fmt == GemmFormat::fp8 || s.fmt == GemmFormat::fp4;
  if (quantized && s.dequant) {
    if (s.bc % 8 == 0) {
      for (int k = 0; k < kc; k += 8)
        _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_loadu_ps(out + k), _mm256_set1_ps(weight_scale(s, r, k0 + k))));
    } else {
      for (int k = 0; k < kc; ++k) out[k] = out[k] * weight_scale(s, r, k0 + k);
    }
  }
  if (s.round_bf16)
    for (int k = 0; k < kc_pad; k += 8) _mm256_storeu_ps(out + k, round_bf16(_mm256_loadu_ps(out + k)));
}

// 8x8 transpose: P[k*16 + j] = tmp[j*ld + k] for j, k < 8.
inline void transpose8(const float* tmp, int64_t ld, float* P) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(tmp + i * ld);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    r[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    _mm256_storeu_ps(P + j * 16, _mm256_permute2f128_ps(r[j], r[4 + j], 0x20));
    _mm256_storeu_ps(P + (4 + j) * 16, _mm256_permute2f128_ps(r[j], r[4 + j], 0x31));
  }
}

void decode_panel(const PanelSrc& s, int64_t r0, int nrows, int64_t k0, int kc, const float* Ps, float* P) {
  const int kc_pad = (kc + 15) & ~15;
  alignas(32) static thread_local float tmp[kPanel * kChunk];
  for (int j = 0; j < kPanel; ++j) {
    if (j < nrows)
      decode_row(s, r0 + j, k0, kc, tmp + j * kc_pad);
    else
      std::memset(tmp + j * kc_pad, 0, sizeof(float) * kc_pad);
  }
  for (int k = 0; k < kc_pad; k += 8) {
    transpose8(tmp + k, kc_pad, P + k * kPanel);
    transpose8(tmp + 8 * kc_pad + k, kc_pad, P + k * kPanel + 8);
  }
}

// ---- fused GEMV (one token, one 64-row group), 8-row sub-panels (one ymm) ----
// Each step loads 8 rows x 64 bytes, transposes them as 32-bit words into T[16] (T[c] lane i = word c of row i), then
// decodes and multiplies in k order, four sub-panel chains at a time: the order of mk_q / mk_d, bitwise.
inline void transpose8_regs(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    r[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x20);
    t[4 + j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x31);
  }
  for (int i = 0; i < 8; ++i) r[i] = t[i];
}

inline void load_transposed8(const uint8_t* base, int64_t row_bytes, int64_t off, __m256 T[16]) {
  const int64_t pf = gemv_prefetch_bytes(row_bytes);
  for (int i = 0; i < 8; ++i)
    _mm_prefetch(reinterpret_cast<const char*>(base + i * row_bytes + off + pf), _MM_HINT_T0);
  for (int h = 0; h < 2; ++h) {
    __m256 r[8];
    for (int i = 0; i < 8; ++i)
      r[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(base + i * row_bytes + off + 32 * h));
    transpose8_regs(r);
    for (int c = 0; c < 8; ++c) T[8 * h + c] = r[c];
  }
}

inline __m256 e8m0_vec(__m256i e) {  // bitwise e8m0_to_float of the low byte of each lane (e already & 0xFF)
  __m256i bits = _mm256_slli_epi32(e, 23);
  bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x00400000), _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
  bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7FC00000), _mm256_cmpeq_epi32(e, _mm256_set1_epi32(0xFF)));
  return _mm256_castsi256_ps(bits);
}

constexpr int kSubs = 4;  // sub-panels (chains) in flight

// MODE: 0 = quantized (Q), 1 = dense (D), 2 = dense with bf16(w * sw).
template <int MODE>
void gemv_fp4(const PanelSrc& s, int64_t rb, const float* a, const float* sa, float* acc) {
  const int64_t K = s.cols;
  const __m256 lut = _mm256_loadu_ps(e2m1_lut());  // magnitudes 0..7 (the sign is bit 3 of the nibble)
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u)), ff = _mm256_set1_epi32(0xFF);
  alignas(32) __m256 T[kSubs][16];
  __m256 accv[kSubs], sv[kSubs], sw[kSubs][4];
  for (int sp = 0; sp < kSubs; ++sp) accv[sp] = _mm256_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += 128) {
    for (int sp = 0; sp < kSubs; ++sp) {
      const int64_t r = rb + 8 * sp;
      load_transposed8(s.w + r * s.row_bytes, s.row_bytes, k0 / 2, T[sp]);
      const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                             _mm256_set1_epi32(static_cast<int>(s.scale_cols)));
      const __m256i e4 =
          _mm256_i32gather_epi32(reinterpret_cast<const int*>(s.scale + r * s.scale_cols + k0 / 32), idx, 1);
      for (int b = 0; b < 4; ++b) sw[sp][b] = e8m0_vec(_mm256_and_si256(_mm256_srli_epi32(e4, 8 * b), ff));
    }
    for (int blk = 0; blk < 4; ++blk) {
      for (int sp = 0; sp < kSubs; ++sp) sv[sp] = MODE == 0 ? _mm256_setzero_ps() : accv[sp];
      for (int c = 4 * blk; c < 4 * blk + 4; ++c) {
        const float* ak = a + k0 + 8 * c;
        for (int qq = 0; qq < 8; ++qq) {
          const __m256 ab = _mm256_broadcast_ss(ak + qq);
          for (int sp = 0; sp < kSubs; ++sp) {
            const __m256i v = _mm256_castps_si256(T[sp][c]);
            const __m256 mag = _mm256_permutevar8x32_ps(lut, _mm256_srli_epi32(v, 4 * qq));
            __m256 w =
                _mm256_xor_ps(mag, _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 28 - 4 * qq), sign)));
            if constexpr (MODE >= 1) w = _mm256_mul_ps(w, sw[sp][blk]);
            if constexpr (MODE == 2) w = round_bf16(w);
            sv[sp] = _mm256_fmadd_ps(ab, w, sv[sp]);
          }
        }
      }
      if constexpr (MODE == 0) {
        const __m256 sab = _mm256_set1_ps(sa[(k0 + 32 * blk) / 128]);
        for (int sp = 0; sp < kSubs; ++sp)
          accv[sp] = _mm256_add_ps(accv[sp], _mm256_mul_ps(sv[sp], _mm256_mul_ps(sab, sw[sp][blk])));
      } else {
        for (int sp = 0; sp < kSubs; ++sp) accv[sp] = sv[sp];
      }
    }
  }
  for (int sp = 0; sp < kSubs; ++sp) _mm256_storeu_ps(acc + 8 * sp, accv[sp]);
}

inline __m256 fp8_sub_scale(const PanelSrc& s, int64_t r0, int64_t c) {
  if (r0 / s.br == (r0 + 7) / s.br) return _mm256_set1_ps(weight_scale(s, r0, c * s.bc));
  alignas(32) float v[8];
  for (int j = 0; j < 8; ++j) v[j] = weight_scale(s, r0 + j, c * s.bc);
  return _mm256_load_ps(v);
}

// E4M3 code in the top byte of each lane -> exact fp32 (see gemm_avx512.cpp dec_e4m3_top): sign | e << 23 | m << 20
// times 2^120; the EXACT path keeps fp32 subnormals out of the multiply (microcode assists on Intel) by giving the
// subnormal codes (e = 0, m != 0) exponent field 1 and subtracting their signed 2^-6 afterwards (other lanes: - +0,
// exact). EXACT = false only for words without subnormal codes (e4m3_subnormals8).
template <bool EXACT>
inline __m256 dec_e4m3_top8(__m256i top) {
  const __m256i x = _mm256_and_si256(_mm256_srai_epi32(top, 4), _mm256_set1_epi32(static_cast<int>(0x87F00000u)));
  const __m256 rebias = _mm256_set1_ps(0x1p120f);
  if constexpr (!EXACT) {
    return _mm256_mul_ps(_mm256_castsi256_ps(x), rebias);
  } else {
    const __m256i zero = _mm256_setzero_si256();
    const __m256i e0 = _mm256_cmpeq_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x07800000)), zero);
    const __m256i m0 = _mm256_cmpeq_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x00700000)), zero);
    const __m256i sub = _mm256_andnot_si256(m0, e0);
    const __m256i xs = _mm256_or_si256(x, _mm256_and_si256(sub, _mm256_set1_epi32(0x00800000)));
    const __m256 w = _mm256_mul_ps(_mm256_castsi256_ps(xs), rebias);
    const __m256i c = _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0x80000000u))),
                                      _mm256_set1_epi32(0x3C800000));  // +-2^-6
    return _mm256_sub_ps(w, _mm256_castsi256_ps(_mm256_and_si256(c, sub)));
  }
}

// Whether any byte of v is a subnormal E4M3 code (exponent bits 0x78 clear, mantissa bits 0x07 not all clear).
inline bool e4m3_subnormals8(__m256i v) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i e0 = _mm256_cmpeq_epi8(_mm256_and_si256(v, _mm256_set1_epi8(0x78)), zero);
  const __m256i m0 = _mm256_cmpeq_epi8(_mm256_and_si256(v, _mm256_set1_epi8(0x07)), zero);
  return _mm256_movemask_epi8(_mm256_andnot_si256(m0, e0)) != 0;
}

template <int MODE>
void gemv_fp8(const PanelSrc& s, int64_t rb, const float* a, const float* sa, float* acc) {
  const int64_t K = s.cols;
  alignas(32) __m256 T[kSubs][16];
  __m256 accv[kSubs], sv[kSubs], sw[kSubs];
  for (int sp = 0; sp < kSubs; ++sp) accv[sp] = _mm256_setzero_ps();
  for (int64_t kb = 0; kb < K; kb += 128) {
    for (int sp = 0; sp < kSubs; ++sp) {
      sw[sp] = fp8_sub_scale(s, rb + 8 * sp, kb / 128);
      sv[sp] = MODE == 0 ? _mm256_setzero_ps() : accv[sp];
    }
    for (int h = 0; h < 2; ++h) {
      const int64_t k0 = kb + 64 * h;
      for (int sp = 0; sp < kSubs; ++sp) load_transposed8(s.w + (rb + 8 * sp) * s.row_bytes, s.row_bytes, k0, T[sp]);
      for (int c = 0; c < 16; ++c) {
        const float* ak = a + k0 + 4 * c;
        auto step = [&]<bool EX>() {
          for (int qq = 0; qq < 4; ++qq) {
            const __m256 ab = _mm256_broadcast_ss(ak + qq);
            for (int sp = 0; sp < kSubs; ++sp) {
              const __m256i top = _mm256_slli_epi32(_mm256_castps_si256(T[sp][c]), 24 - 8 * qq);
              __m256 w = dec_e4m3_top8<EX>(top);
              if constexpr (MODE >= 1) w = _mm256_mul_ps(w, sw[sp]);
              if constexpr (MODE == 2) w = round_bf16(w);
              sv[sp] = _mm256_fmadd_ps(ab, w, sv[sp]);
            }
          }
        };
        bool sub = false;
        for (int sp = 0; sp < kSubs; ++sp) sub = sub || e4m3_subnormals8(_mm256_castps_si256(T[sp][c]));
        if (sub)
          step.template operator()<true>();
        else
          step.template operator()<false>();
      }
    }
    if constexpr (MODE == 0) {
      const __m256 sab = _mm256_set1_ps(sa[kb / 128]);
      for (int sp = 0; sp < kSubs; ++sp)
        accv[sp] = _mm256_add_ps(accv[sp], _mm256_mul_ps(sv[sp], _mm256_mul_ps(sab, sw[sp])));
    } else {
      for (int sp = 0; sp < kSubs; ++sp) accv[sp] = sv[sp];
    }
  }
  for (int sp = 0; sp < kSubs; ++sp) _mm256_storeu_ps(acc + 8 * sp, accv[sp]);
}

void gemv_bf16(const PanelSrc& s, int64_t rb, const float* a, float* acc) {
  const int64_t K = s.cols;
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  alignas(32) __m256 T[kSubs][16];
  __m256 accv[kSubs];
  for (int sp = 0; sp < kSubs; ++sp) accv[sp] = _mm256_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += 32) {
    for (int sp = 0; sp < kSubs; ++sp) load_transposed8(s.w + (rb + 8 * sp) * s.row_bytes, s.row_bytes, 2 * k0, T[sp]);
    for (int c = 0; c < 16; ++c) {
      const __m256 a0 = _mm256_broadcast_ss(a + k0 + 2 * c), a1 = _mm256_broadcast_ss(a + k0 + 2 * c + 1);
      for (int sp = 0; sp < kSubs; ++sp)
        accv[sp] =
            _mm256_fmadd_ps(a0, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(T[sp][c]), 16)), accv[sp]);
      for (int sp = 0; sp < kSubs; ++sp)
        accv[sp] =
            _mm256_fmadd_ps(a1, _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(T[sp][c]), hi)), accv[sp]);
    }
  }
  for (int sp = 0; sp < kSubs; ++sp) _mm256_storeu_ps(acc + 8 * sp, accv[sp]);
}

bool gemv_group(const PanelSrc& s, int64_t n0, int nrows, const float* a, const float* sa, bool q, float* acc) {
  if (nrows != kGroupRows) return false;
  const int64_t K = s.cols;
  const int mode = q ? 0 : (s.round_bf16 ? 2 : 1);
  const bool fp4 = s.fmt == GemmFormat::fp4 && K % 128 == 0;
  const bool fp8 = s.fmt == GemmFormat::fp8 && K % 128 == 0 && s.bc == 128;
  const bool bf16 = !q && s.fmt == GemmFormat::bf16 && K % 32 == 0;
  if (!fp4 && !fp8 && !bf16) return false;
  for (int half = 0; half < 2; ++half) {  // 2 x 32 rows = 4 sub-panels of 8
    const int64_t rb = n0 + 32 * half;
    float* ac = acc + 32 * half;
    if (fp4) {
      if (mode == 0) gemv_fp4<0>(s, rb, a, sa, ac);
      if (mode == 1) gemv_fp4<1>(s, rb, a, sa, ac);
      if (mode == 2) gemv_fp4<2>(s, rb, a, sa, ac);
    } else if (fp8) {
      if (mode == 0) gemv_fp8<0>(s, rb, a, sa, ac);
      if (mode == 1) gemv_fp8<1>(s, rb, a, sa, ac);
      if (mode == 2) gemv_fp8<2>(s, rb, a, sa, ac);
    } else {
      gemv_bf16(s, rb, a, ac);
    }
  }
  return true;
}

// ---- micro-kernels: MR tokens x NP panels (2 ymm each) ----
template <int MR, int NP>
inline void tile_q(const MkArgs& A, int64_t m0, int p0) {
  for (int b = 0; b < A.nbk; ++b) {
    const int kb0 = b * A.bk, kb1 = kb0 + A.bk < A.kc ? kb0 + A.bk : A.kc;
    __m256 s[MR][NP][2];
    for (int m = 0; m < MR; ++m)
      for (int p = 0; p < NP; ++p) s[m][p][0] = s[m][p][1] = _mm256_setzero_ps();
    const float* a = A.a + m0 * A.lda;
    for (int k = kb0; k < kb1; ++k) {
      __m256 w[NP][2];
      for (int p = 0; p < NP; ++p) {
        const float* wp = A.P + (static_cast<int64_t>(p0 + p) * A.kc_pad + k) * kPanel;
        w[p][0] = _mm256_loadu_ps(wp);
        w[p][1] = _mm256_loadu_ps(wp + 8);
      }
      for (int m = 0; m < MR; ++m) {
        const __m256 av = _mm256_broadcast_ss(a + m * A.lda + k);
        for (int p = 0; p < NP; ++p) {
          s[m][p][0] = _mm256_fmadd_ps(av, w[p][0], s[m][p][0]);
          s[m][p][1] = _mm256_fmadd_ps(av, w[p][1], s[m][p][1]);
        }
      }
    }
    for (int m = 0; m < MR; ++m) {
      const __m256 sav = _mm256_set1_ps(A.sa[(m0 + m) * A.ldsa + (A.k0 + kb0) / 128]);
      for (int p = 0; p < NP; ++p) {
        const float* ps = A.Ps + (p0 + p) * A.ldps + b * kPanel;
        float* acc = A.acc + (m0 + m) * A.ldacc + (p0 + p) * kPanel;
        for (int h = 0; h < 2; ++h) {
          const __m256 sc = _mm256_mul_ps(sav, _mm256_loadu_ps(ps + 8 * h));
          _mm256_storeu_ps(acc + 8 * h, _mm256_add_ps(_mm256_loadu_ps(acc + 8 * h), _mm256_mul_ps(s[m][p][h], sc)));
        }
      }
    }
  }
}

template <int MR, int NP>
inline void tile_d(const MkArgs& A, int64_t m0, int p0) {
  __m256 s[MR][NP][2];
  for (int m = 0; m < MR; ++m)
    for (int p = 0; p < NP; ++p)
      for (int h = 0; h < 2; ++h) s[m][p][h] = _mm256_loadu_ps(A.acc + (m0 + m) * A.ldacc + (p0 + p) * kPanel + 8 * h);
  const float* a = A.a + m0 * A.lda;
  for (int k = 0; k < A.kc; ++k) {
    __m256 w[NP][2];
    for (int p = 0; p < NP; ++p) {
      const float* wp = A.P + (static_cast<int64_t>(p0 + p) * A.kc_pad + k) * kPanel;
      w[p][0] = _mm256_loadu_ps(wp);
      w[p][1] = _mm256_loadu_ps(wp + 8);
    }
    for (int m = 0; m < MR; ++m) {
      const __m256 av = _mm256_broadcast_ss(a + m * A.lda + k);
      for (int p = 0; p < NP; ++p) {
        s[m][p][0] = _mm256_fmadd_ps(av, w[p][0], s[m][p][0]);
        s[m][p][1] = _mm256_fmadd_ps(av, w[p][1], s[m][p][1]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int p = 0; p < NP; ++p)
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(A.acc + (m0 + m) * A.ldacc + (p0 + p) * kPanel + 8 * h, s[m][p][h]);
}

template <bool Q, int MR, int NP>
inline void tile(const MkArgs& A, int64_t m0, int p0) {
  if constexpr (Q)
    tile_q<MR, NP>(A, m0, p0);
  else
    tile_d<MR, NP>(A, m0, p0);
}

template <bool Q>
void mk(const MkArgs& A) {
  int64_t m = 0;
  int p = 0;
  for (; p + 2 <= A.np; p += 2) {
    for (m = 0; m + 2 <= A.mr; m += 2) tile<Q, 2, 2>(A, m, p);
    for (; m < A.mr; ++m) tile<Q, 1, 2>(A, m, p);
  }
  for (; p < A.np; ++p) {
    for (m = 0; m + 2 <= A.mr; m += 2) tile<Q, 2, 1>(A, m, p);
    for (; m < A.mr; ++m) tile<Q, 1, 1>(A, m, p);
  }
}

void mk_q(const MkArgs& A) { mk<true>(A); }
void mk_d(const MkArgs& A) { mk<false>(A); }

}  // namespace
}  // namespace dsv4::gemm_detail

#pragma GCC pop_options

namespace dsv4::gemm_detail {
const Kernels* avx2_kernels() {
  static const Kernels k{decode_panel, nullptr, nullptr, gemv_group, mk_q, mk_d};
  return &k;
}
}  // namespace dsv4::gemm_detail

#else
namespace dsv4::gemm_detail {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace dsv4::gemm_detail
#endif
