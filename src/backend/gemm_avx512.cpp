// AVX-512 (F+BW+VL, with AVX2/FMA/F16C) GEMM kernels, compiled with a target pragma and chosen at run time.
// They reproduce gemm_scalar.cpp bitwise: lanes are output rows, so every output's sum runs sequentially in k.
// gemm_avx512_vbmi.cpp compiles this file once more with DSV4_GEMM_AVX512_VBMI (target + AVX512-VBMI, kVbmi = true,
// the kernel set avx512vbmi_kernels()): there the quantized FP8 GEMVs decode E4M3 through byte tables (vpermi2b).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/act_quant.h"
#include "backend/gemm_kernels.h"
#include "format/numeric.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

// GCC 12's avx512fintrin.h trips -Wuninitialized on its own _mm512_undefined_*() helpers (false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#if defined(DSV4_GEMM_AVX512_VBMI)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

namespace dsv4::gemm_detail {
namespace {

#if defined(DSV4_GEMM_AVX512_VBMI)
constexpr bool kVbmi = true;
#else
constexpr bool kVbmi = false;
#endif

// 16 E4M3FN bytes -> 16 floats (exact): byte -> f16 bits (sign << 8 | magnitude << 7), f16 -> f32, * 2^8.
inline __m512 dec_fp8(__m128i b) {
  __m256i w = _mm256_cvtepi8_epi16(b);
  w = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
  return _mm512_mul_ps(_mm512_cvtph_ps(w), _mm512_set1_ps(256.0f));
}

// 8 packed FP4 bytes -> 16 floats (element 2j = low nibble of byte j).
inline __m512 dec_fp4(__m128i b8, __m512 lut) {
  const __m128i w = _mm_cvtepu8_epi16(b8);
  const __m128i n = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x0F)), _mm_slli_epi16(_mm_srli_epi16(w, 4), 8));
  return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(n), lut);
}

inline __m512 round_bf16(__m512 v) {
  __m512i b = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  b = _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(b, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Decode one row's columns [k0, k0+kc) into out[0..kc_pad) (zeros past kc).
void decode_row(const PanelSrc& s, int64_t r, int64_t k0, int kc, float* out) {
  const uint8_t* row = s.w + r * s.row_bytes;
  const int kc_pad = (kc + 15) & ~15;
  switch (s.fmt) {
    case GemmFormat::fp8: {
      const uint8_t* p = row + k0;
      for (int k = 0; k < kc_pad; k += 16) {
        const int n = kc - k < 16 ? kc - k : 16;
        const __m128i b = n == 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k))
                                  : _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << n) - 1), p + k);
        _mm512_storeu_ps(out + k, dec_fp8(b));
      }
      break;
    }
    case GemmFormat::fp4: {
      const __m512 lut = _mm512_loadu_ps(e2m1_lut());
      const uint8_t* p = row + k0 / 2;
      for (int k = 0; k < kc_pad; k += 16) {
        const int nb = (kc - k) / 2 < 8 ? (kc - k) / 2 : 8;
        const __m128i b = nb == 8 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + k / 2))
                                  : _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << nb) - 1), p + k / 2);
        __m512 v = dec_fp4(b, lut);
        if (nb < 8) v = _mm512_maskz_mov_ps(static_cast<__mmask16>((1u << (2 * nb)) - 1), v);  // code 0 is +0 anyway
        _mm512_storeu_ps(out + k, v);
      }
      break;
    }
    case GemmFormat::bf16: {
      const uint8_t* p = row + 2 * k0;
      for (int k = 0; k < kc_pad; k += 16) {
        const int n = kc - k < 16 ? kc - k : 16;
        const __m256i h = n == 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * k))
                                  : _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1), p + 2 * k);
        _mm512_storeu_ps(out + k, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
      }
      break;
    }
    case GemmFormat::f32: {
      const float* p = reinterpret_cast<const float*>(row) + k0;
      for (int k = 0; k < kc_pad; k += 16) {
        const int n = kc - k < 16 ? kc - k : 16;
        _mm512_storeu_ps(out + k, _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p + k));
      }
      break;
    }
  }
  const bool quantized = s.fmt == GemmFormat::fp8 || s.fmt == GemmFormat::fp4;
  if (quantized && s.dequant) {
    if (s.bc % 16 == 0) {
      for (int k = 0; k < kc; k += 16)  // a vector never straddles a scale block (k0, k multiples of 16)
        _mm512_storeu_ps(out + k, _mm512_mul_ps(_mm512_loadu_ps(out + k), _mm512_set1_ps(weight_scale(s, r, k0 + k))));
    } else {
      for (int k = 0; k < kc; ++k) out[k] = out[k] * weight_scale(s, r, k0 + k);
    }
  }
  if (s.round_bf16)
    for (int k = 0; k < kc_pad; k += 16) _mm512_storeu_ps(out + k, round_bf16(_mm512_loadu_ps(out + k)));
}

// P[k][0..16) = tmp[0..16)[k] for one 16x16 block.
inline void transpose16(const float* tmp, int64_t ld, float* P) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(tmp + i * ld);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 v0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88), v1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    const __m512 w0 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    const __m512 w1 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    _mm512_storeu_ps(P + (j)*16, _mm512_shuffle_f32x4(v0, w0, 0x88));
    _mm512_storeu_ps(P + (8 + j) * 16, _mm512_shuffle_f32x4(v0, w0, 0xDD));
    _mm512_storeu_ps(P + (4 + j) * 16, _mm512_shuffle_f32x4(v1, w1, 0x88));
    _mm512_storeu_ps(P + (12 + j) * 16, _mm512_shuffle_f32x4(v1, w1, 0xDD));
  }
}

// In-register 16x16 transpose of 32-bit elements: r[i] = row i on entry, r[c] = column c (element i = row i) on exit.
__attribute__((always_inline)) inline void transpose16_regs(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 v0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88), v1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    const __m512 w0 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    const __m512 w1 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    t[j] = _mm512_shuffle_f32x4(v0, w0, 0x88);
    t[8 + j] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
    t[4 + j] = _mm512_shuffle_f32x4(v1, w1, 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// An L2 prefetch, as asm volatile: GCC 12 deletes a call to a function whose loop only issues __builtin_prefetch (it
// takes it for a function without side effects), and with it the whole prefetch.
inline void prefetch_l2(const void* p) { asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p))); }

// Software prefetch of the 16 rows' bytes kPrefetchBytes ahead of the 64 bytes about to be loaded: the group walks
// 64 rows in parallel, too many streams for the hardware prefetchers. (Past a row's end it touches the next row:
// harmless; prefetches never fault.)
constexpr int64_t kPrefetchBytes = 512;
inline void prefetch_rows(const uint8_t* p, int64_t row_bytes, int64_t dist = kPrefetchBytes) {
  for (int i = 0; i < 16; ++i) _mm_prefetch(reinterpret_cast<const char*>(p + i * row_bytes + dist), _MM_HINT_T0);
}

// ---- E4M3 codes in the top byte of each 32-bit lane -> exact fp32 values ----
// srai by 4 and mask 0x87F00000 give sign | e << 23 | m << 20, the fp32 2^(e-127) * 1.m; * 2^120 rebiases exactly to
// e4m3. For the subnormal codes (e = 0, m != 0: m * 2^-9) that intermediate is an fp32 subnormal, and on some CPUs
// (Intel) every multiply with a subnormal input takes a microcode assist (~100+ cycles per instruction: the FP8 GEMV
// ran at a seventh of the FP4 one on uniformly random codes). The exact path never forms a subnormal: those lanes get
// exponent field 1 (2^-126 * 1.m, * 2^120 = 2^-6 * (1 + m/8)), then subtract 2^-6 with the lane's sign: exactly
// +-m * 2^-9, the same value (and bits) as the plain path. Codes +-0 (e = 0, m = 0) are +-0 on both paths.
// EXACT = false is valid only when no lane holds a subnormal code (e4m3_subnormals zero for its word). The constants
// are loop-invariant (hoisted by the compiler).
template <bool EXACT>
inline __m512 dec_e4m3_top(__m512i top) {
  const __m512i x = _mm512_and_si512(_mm512_srai_epi32(top, 4), _mm512_set1_epi32(static_cast<int>(0x87F00000u)));
  const __m512 rebias = _mm512_set1_ps(0x1p120f);
  if constexpr (!EXACT) {
    return _mm512_mul_ps(_mm512_castsi512_ps(x), rebias);
  } else {
    const __mmask16 sub = _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(x, _mm512_set1_epi32(0x07800000)), x,
                                                      _mm512_set1_epi32(0x00700000));  // e = 0, m != 0
    const __m512 w =  // exponent field 1 in those lanes: +-2^-6 * (1 + m/8)
        _mm512_mul_ps(_mm512_castsi512_ps(_mm512_mask_or_epi32(x, sub, x, _mm512_set1_epi32(0x00800000))), rebias);
    const __m512 c = _mm512_castsi512_ps(  // (x & sign) | 2^-6
        _mm512_ternarylogic_epi32(x, _mm512_set1_epi32(static_cast<int>(0x80000000u)), _mm512_set1_epi32(0x3C800000), 0xEA));
    return _mm512_mask_sub_ps(w, sub, w, c);
  }
}

// Whether any byte of v is a subnormal E4M3 code (exponent bits 0x78 clear, mantissa bits 0x07 not all clear).
inline __mmask64 e4m3_subnormals(__m512i v) {
  return _mm512_mask_test_epi8_mask(_mm512_testn_epi8_mask(v, _mm512_set1_epi8(0x78)), v, _mm512_set1_epi8(0x07));
}

// Dense-mode post-processing of one decoded P row (16 rows at chunk column k): block scale, bf16 rounding.
template <bool DEQ, bool RND>
inline __m512 finish(__m512 v, const float* Ps, int k, int sblk) {
  if constexpr (DEQ) v = _mm512_mul_ps(v, _mm512_loadu_ps(Ps + (k / sblk) * kPanel));
  if constexpr (RND) v = round_bf16(v);
  return v;
}

// Full 16-row panels (any kc: a partial last step loads masked and goes through a tail buffer): the raw rows are transposed as 32-bit words
// (16 rows x 64 bytes -> 16 vectors, lane i = 4 bytes of row i), then every code inside a word is decoded across the
// 16 lanes at once: FP4 8 nibbles (k, k+1, ... = low nibble first), FP8 4 bytes, BF16 2 halves — little-endian order
// is the column order, so P rows come out in natural k order.
// 16 rows x nbytes (<= 64) from p (row stride row_bytes) into r, zeros past nbytes (masked loads never touch the
// bytes past a row's end), with the rows' software prefetch.
inline void load_rows(__m512 r[16], const uint8_t* p, int64_t row_bytes, int nbytes) {
  prefetch_rows(p, row_bytes);
  if (nbytes >= 64) {
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(reinterpret_cast<const float*>(p + i * row_bytes));
  } else {
    const __mmask64 m = (__mmask64{1} << nbytes) - 1;
    for (int i = 0; i < 16; ++i) r[i] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi8(m, p + i * row_bytes));
  }
}

// One step of decode_panel_fast_t: columns [kb, kb + width) of the chunk go straight to P, or, for the last step
// when it is partial (kc - kb < width), to tail, of which done() copies the rows below kc and zeros [kc, kc_pad).
struct Step {
  float* P;
  float* dst;
  int kb, kc, width;
  Step(float* P_, int kb_, int kc_, int width_, float* tail)
      : P(P_), dst(kc_ - kb_ < width_ ? tail : P_ + kb_ * kPanel), kb(kb_), kc(kc_), width(width_) {}
  void done() const {
    if (kc - kb >= width) return;
    const int kc_pad = (kc + 15) & ~15;
    std::memcpy(P + kb * kPanel, dst, sizeof(float) * kPanel * (kc - kb));
    std::memset(P + kc * kPanel, 0, sizeof(float) * kPanel * (kc_pad - kc));
  }
};

template <bool DEQ, bool RND>
void decode_panel_fast_t(const PanelSrc& s, int64_t r0, int64_t k0, int kc, const float* Ps, float* P) {
  const uint8_t* base = s.w + r0 * s.row_bytes;
  const int sblk = static_cast<int>(s.bc);
  __m512 r[16];
  alignas(64) float tail[128 * kPanel];  // the last, partial step's rows (then copied up to kc_pad, zeros past kc)
  switch (s.fmt) {
    case GemmFormat::fp4: {  // 64 bytes = 128 columns per row per step; word c holds columns 8c..8c+7
      const __m512 lut = _mm512_loadu_ps(e2m1_lut());
      for (int kb = 0; kb < kc; kb += 128) {
        Step st(P, kb, kc, 128, tail);
        load_rows(r, base + (k0 + kb) / 2, s.row_bytes, (std::min(kc - kb, 128) + 1) / 2);
        transpose16_regs(r);
        for (int c = 0; c < 16; ++c) {
          const __m512i v = _mm512_castps_si512(r[c]);
          float* out = st.dst + 8 * c * kPanel;
          // permutexvar uses the low 4 bits of each index: nibble q of the word after a 4q shift
          _mm512_storeu_ps(out + 0 * kPanel, finish<DEQ, RND>(_mm512_permutexvar_ps(v, lut), Ps, kb + 8 * c + 0, sblk));
          _mm512_storeu_ps(out + 1 * kPanel, finish<DEQ, RND>(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut), Ps,
                                                              kb + 8 * c + 1, sblk));
          _mm512_storeu_ps(out + 2 * kPanel, finish<DEQ, RND>(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 8), lut), Ps,
                                                              kb + 8 * c + 2, sblk));
          _mm512_storeu_ps(out + 3 * kPanel, finish<DEQ, RND>(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 12), lut), Ps,
                                                              kb + 8 * c + 3, sblk));
          _mm512_storeu_ps(out + 4 * kPanel, finish<DEQ, RND>(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 16), lut), Ps,
                                                              kb + 8 * c + 4, sblk));
          _mm512_storeu_ps(out + 5 * kPanel, finish<DEQ, RND>(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 20), lut), Ps,
                                                              kb + 8 * c + 5, sblk));
          _mm512_storeu_ps(out + 6 * kPanel, finish<DEQ, RND>(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 24), lut), Ps,
                                                              kb + 8 * c + 6, sblk));
          _mm512_storeu_ps(out + 7 * kPanel, finish<DEQ, RND>(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 28), lut), Ps,
                                                              kb + 8 * c + 7, sblk));
        }
        st.done();
      }
      break;
    }
    case GemmFormat::fp8: {  // 64 columns per step; word c holds columns 4c..4c+3
      // byte q moved to the top (bits 24..31), then dec_e4m3_top (the exact path only for words with subnormal codes)
      for (int kb = 0; kb < kc; kb += 64) {
        Step st(P, kb, kc, 64, tail);
        load_rows(r, base + k0 + kb, s.row_bytes, std::min(kc - kb, 64));
        transpose16_regs(r);
        for (int c = 0; c < 16; ++c) {
          const __m512i v = _mm512_castps_si512(r[c]);
          float* out = st.dst + 4 * c * kPanel;
          auto put = [&]<bool EX>() {
            _mm512_storeu_ps(out + 0 * kPanel,
                             finish<DEQ, RND>(dec_e4m3_top<EX>(_mm512_slli_epi32(v, 24)), Ps, kb + 4 * c + 0, sblk));
            _mm512_storeu_ps(out + 1 * kPanel,
                             finish<DEQ, RND>(dec_e4m3_top<EX>(_mm512_slli_epi32(v, 16)), Ps, kb + 4 * c + 1, sblk));
            _mm512_storeu_ps(out + 2 * kPanel,
                             finish<DEQ, RND>(dec_e4m3_top<EX>(_mm512_slli_epi32(v, 8)), Ps, kb + 4 * c + 2, sblk));
            _mm512_storeu_ps(out + 3 * kPanel, finish<DEQ, RND>(dec_e4m3_top<EX>(v), Ps, kb + 4 * c + 3, sblk));
          };
          if (e4m3_subnormals(v) != 0)
            put.template operator()<true>();
          else
            put.template operator()<false>();
        }
        st.done();
      }
      break;
    }
    case GemmFormat::bf16: {  // 32 columns per step; word c holds columns 2c, 2c+1
      const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
      for (int kb = 0; kb < kc; kb += 32) {
        Step st(P, kb, kc, 32, tail);
        load_rows(r, base + 2 * (k0 + kb), s.row_bytes, 2 * std::min(kc - kb, 32));
        transpose16_regs(r);
        for (int c = 0; c < 16; ++c) {
          const __m512i v = _mm512_castps_si512(r[c]);
          float* out = st.dst + 2 * c * kPanel;
          _mm512_storeu_ps(out, finish<DEQ, RND>(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), nullptr, 0, 1));
          _mm512_storeu_ps(out + kPanel, finish<DEQ, RND>(_mm512_castsi512_ps(_mm512_and_si512(v, hi)), nullptr, 0, 1));
        }
        st.done();
      }
      break;
    }
    default:
      break;
  }
}

void decode_panel_fast(const PanelSrc& s, int64_t r0, int64_t k0, int kc, const float* Ps, float* P) {
  const bool deq = s.dequant && s.fmt != GemmFormat::bf16;
  if (deq)
    s.round_bf16 ? decode_panel_fast_t<true, true>(s, r0, k0, kc, Ps, P)
                 : decode_panel_fast_t<true, false>(s, r0, k0, kc, Ps, P);
  else
    s.round_bf16 ? decode_panel_fast_t<false, true>(s, r0, k0, kc, Ps, P)
                 : decode_panel_fast_t<false, false>(s, r0, k0, kc, Ps, P);
}

void decode_panel(const PanelSrc& s, int64_t r0, int nrows, int64_t k0, int kc, const float* Ps, float* P) {
  const int kc_pad = (kc + 15) & ~15;
  if (nrows == kPanel) {
    const bool quantized = s.fmt == GemmFormat::fp4 || s.fmt == GemmFormat::fp8;
    const bool fits = s.fmt == GemmFormat::fp4 || s.fmt == GemmFormat::fp8 || s.fmt == GemmFormat::bf16;
    if (fits && (!quantized || !s.dequant || Ps != nullptr)) return decode_panel_fast(s, r0, k0, kc, Ps, P);
  }
  alignas(64) static thread_local float tmp[kPanel * kChunk];
  for (int j = 0; j < kPanel; ++j) {
    if (j < nrows)
      decode_row(s, r0 + j, k0, kc, tmp + j * kc_pad);
    else
      std::memset(tmp + j * kc_pad, 0, sizeof(float) * kc_pad);
  }
  for (int k = 0; k < kc_pad; k += 16) transpose16(tmp + k, kc_pad, P + k * kPanel);
}

// E8M0 scales of 16 rows x nps blocks: one 32-bit gather per 4 blocks, decoded bitwise like
// e8m0_to_float (e = 0 -> 2^-127, e = 255 -> NaN).
void fp4_panel_scales(const PanelSrc& s, int64_t r0, int64_t k0, int nps, float* Ps) {
  const int64_t stride = s.scale_cols;  // bytes per scale row
  const uint8_t* base = s.scale + r0 * stride + k0 / 32;
  const __m512i vidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(static_cast<int>(stride)));
  const __m512i ff = _mm512_set1_epi32(0xFF), zero = _mm512_setzero_si512();
  for (int b = 0; b < nps; b += 4) {
    // a last group of n < 4 blocks: the 4 bytes ending at its last block (the bytes before it are the same row's or
    // the previous row's, never past the scale grid's end), shifted into place; at the grid's very start, per block
    const int n = nps - b < 4 ? nps - b : 4;
    if (n < 4 && r0 * stride + k0 / 32 + b + n < 4) {
      for (int q = 0; q < n; ++q)
        for (int j = 0; j < kPanel; ++j) Ps[(b + q) * kPanel + j] = e8m0_to_float(base[j * stride + b + q]);
      break;
    }
    __m512i v = _mm512_i32gather_epi32(vidx, base + b - (4 - n), 1);
    if (n < 4) v = _mm512_srli_epi32(v, 8 * (4 - n));
    for (int q = 0; q < n; ++q) {
      const __m512i e = _mm512_and_si512(_mm512_srli_epi32(v, 8 * q), ff);
      __m512i bits = _mm512_slli_epi32(e, 23);
      bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(e, zero), _mm512_set1_epi32(0x00400000));
      bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(e, ff), _mm512_set1_epi32(0x7FC00000));
      _mm512_storeu_si512(Ps + (b + q) * kPanel, bits);
    }
  }
}

// act_quant_fp8(x, n, 128, q, s) (spec §4.3), vectorized; same operations as act_quant.cpp, so bitwise equal.
void act_quant_row(const float* x, int64_t n, float* q, float* s_out) {
  const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF), signmask = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512 lo = _mm512_set1_ps(-448.0f), hi = _mm512_set1_ps(448.0f), magic = _mm512_set1_ps(16384.0f);
  const __m512i half = _mm512_set1_epi32(0x7FFFF), one = _mm512_set1_epi32(1),
                keep = _mm512_set1_epi32(static_cast<int>(~0xFFFFFu));
  const __m512i minnorm = _mm512_set1_epi32(0x3C800000);
  for (int64_t b0 = 0, bi = 0; b0 < n; b0 += 128, ++bi) {
    const int len = static_cast<int>(n - b0 < 128 ? n - b0 : 128);
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < len; i += 16) {
      const __mmask16 k = len - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (len - i)) - 1);
      const __m512 a =
          _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_maskz_loadu_ps(k, x + b0 + i)), absmask));
      m = _mm512_max_ps(a, m);  // NaN elements are ignored, as the scalar a > m ? a : m
    }
    const float s = fp8_act_scale(_mm512_reduce_max_ps(m)), inv = 1.0f / s;
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int i = 0; i < len; i += 16) {
      const __mmask16 k = len - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (len - i)) - 1);
      __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + b0 + i), vinv);
      v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
      const __m512i vb = _mm512_castps_si512(v), ab = _mm512_and_si512(vb, absmask);
      const __m512i sub = _mm512_castps_si512(_mm512_sub_ps(_mm512_add_ps(_mm512_castsi512_ps(ab), magic), magic));
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(ab, 20), one);
      const __m512i nor = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(ab, half), odd), keep);
      const __m512i r = _mm512_mask_mov_epi32(nor, _mm512_cmplt_epu32_mask(ab, minnorm), sub);
      _mm512_mask_storeu_ps(q + b0 + i, k, _mm512_castsi512_ps(_mm512_or_si512(r, _mm512_and_si512(vb, signmask))));
    }
    s_out[bi] = s;
  }
}

// ---- fused GEMV (one token, one 64-row group) ----
// Raw words of 4 panels x 64 bytes per row are transposed into T (L1), then decoded and multiplied in k order with
// four independent accumulation chains (one per panel), exactly the order of mk_q / mk_d.
constexpr int kG = kGroupPanels;

// (Long rows, unless PREFETCHED: each row's bytes 128 and 384 ahead (2 and 6 k-steps) into L2 — what the first group
// of a thread gets; the next groups come into L2 from prefetch_next_group while the one before is computed, and then
// the 128 per-row prefetches per k-step would only take load slots. The 16 rows of a panel, and all 64 of a group
// when a row is a multiple of 4 KiB, map to one L1 set, so an L1 prefetch (prefetcht0) of a k-step's lines mostly
// evicts itself; one thread on the 2-core EPYC VM, groups not prefetched (FP8 / FP4 [64, 4096] weights, each read
// once): 1.1-1.25x faster than the former prefetcht0 512 + prefetcht1 1024 bytes ahead. Short rows, a 64-row group
// <= 16 KiB, e.g. the demo lm head [129280, 96] bf16: only prefetch_next_group, whose sequential L2 prefetch of the
// next group streamed 1.7x faster than the per-row L1 prefetch a group ahead, one thread on the 2-core EPYC VM.)
constexpr int64_t kRowPrefetchNear = 128, kRowPrefetchFar = 384;
__attribute__((always_inline)) inline void load_transposed(const uint8_t* base, int64_t row_bytes, int64_t byte_off,
                                                          __m512 T[16], bool prefetched = false) {
  if (row_bytes * kGroupRows > 16384 && !prefetched) {
    for (int i = 0; i < 16; ++i) prefetch_l2(base + i * row_bytes + byte_off + kRowPrefetchNear);
    for (int i = 0; i < 16; ++i) prefetch_l2(base + i * row_bytes + byte_off + kRowPrefetchFar);
  }
  for (int i = 0; i < 16; ++i) T[i] = _mm512_loadu_ps(reinterpret_cast<const float*>(base + i * row_bytes + byte_off));
  transpose16_regs(T);
}

// The same for the edge of a product: only `rows` (0..16) rows and `bytes` (1..64) bytes of each are read, the rest
// of the 16 x 64 bytes is zero (the rows past a weight's last group, the columns past K).
__attribute__((always_inline)) inline void load_transposed_part(const uint8_t* base, int64_t row_bytes, int64_t byte_off, int rows, int bytes,
                                 __m512 T[16], bool prefetched = false) {
  if (rows == 16 && bytes == 64) return load_transposed(base, row_bytes, byte_off, T, prefetched);
  const __mmask64 m = bytes >= 64 ? ~__mmask64{0} : (__mmask64{1} << bytes) - 1;
  for (int i = 0; i < 16; ++i)
    T[i] = i < rows ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi8(m, base + i * row_bytes + byte_off))
                    : _mm512_setzero_ps();
  transpose16_regs(T);
}

// FP8 block scales of 16 rows (r0..r0+15) at scale column c: per-row, or one broadcast when the panel lies in one
// row block.
// (Rows past the weight's end, in a partial last group, take the last row's scale: their results are never used.)
inline __m512 fp8_panel_scale(const PanelSrc& s, int64_t r0, int64_t c) {
  r0 = std::min(r0, s.rows - 1);
  const int64_t r15 = std::min(r0 + 15, s.rows - 1);
  if (r0 / s.br == r15 / s.br) return _mm512_set1_ps(weight_scale(s, r0, c * s.bc));
  alignas(64) float v[16];
  for (int j = 0; j < 16; ++j) v[j] = weight_scale(s, std::min(r0 + j, s.rows - 1), c * s.bc);
  return _mm512_load_ps(v);
}

// Sequential prefetch of the next work item's weight bytes (PanelSrc::pf_w, set by the driver: usually the next 64-row
// group of the same weight, one contiguous block, or the first group of the next weight of a linear_batch) into L2
// while this group is computed: at k-step `step` of `steps`, the step-th slice, so that the next group streams from
// DRAM in address order and is in L2 when its turn comes (its scale bytes at step 0). The first item of a thread (or
// one after an item whose kernel does not prefetch: PanelSrc::prefetched false) has load_transposed's per-row
// prefetches instead (128 / 384 bytes ahead in each of the 64 rows).

// Bytes of the next group to prefetch per k-step when a kernel makes `steps` steps over a group (a multiple of 64).
inline int64_t next_group_slice(const PanelSrc& s, int64_t steps) {
  return s.pf_w == nullptr ? 0 : next_group_slice_bytes(s.pf_w_bytes, steps);
}

// Part `part` of `parts` of that slice (gemm_kernels.h next_group_part): the fused GEMVs issue part c before they
// compute word c of the step's `parts` words, spreading the prefetches over the step: FP4 expert GEMVs 1.3-1.5x and
// BF16 [2048, 4096] 1.1x faster than with the whole slice at the step's start (64 prefetches in a burst for FP4
// [4096, 4096]), one thread on the 2-core EPYC VM. (gemv_bf16_m, 2-3 tokens one panel at a time, issues its slices
// whole, parts = 1: its steps are short, and spread it ran ~8% slower for 2 tokens.)
inline void prefetch_next_group(const PanelSrc& s, int64_t step, int64_t slice, int part = 0, int parts = 1) {
  if (s.pf_w == nullptr) return;
  const auto [b0, b1] = next_group_part(s.pf_w_bytes, slice, step, part, parts);
  for (int64_t o = b0; o < b1; o += 64) prefetch_l2(s.pf_w + o);
  if (step == 0 && part == 0)
    for (int64_t o = 0; o < s.pf_s_bytes; o += 64) prefetch_l2(s.pf_s + o);
}

// FP4 E8M0 block scales of one 16-row panel, 64 blocks (2048 columns) at a time: the 16 rows' scale bytes are loaded
// (masked past the row's last block) and transposed like the weights, so word c holds blocks 4c..4c+3 of every row
// (byte q = block 4c+q); rows past `rows` get scale 1 (their results are never used). Returns whether any byte is 0
// or 255 (the E8M0 codes that do not decode as e << 23).
inline bool fp4_scale_words(const PanelSrc& s, int64_t r0, int64_t k0, __m512 S[16], int rows = 16) {
  const int64_t nb = std::min<int64_t>(64, s.scale_cols - k0 / 32);
  const __mmask64 m = nb >= 64 ? ~__mmask64{0} : (__mmask64{1} << nb) - 1;
  const uint8_t* sb = s.scale + r0 * s.scale_cols + k0 / 32;
  __mmask64 special = 0;
  for (int i = 0; i < 16; ++i) {
    const __m512i v = i < rows ? _mm512_maskz_loadu_epi8(m, sb + i * s.scale_cols) : _mm512_set1_epi8(127);
    special |= _mm512_mask_cmpeq_epi8_mask(m, v, _mm512_setzero_si512()) | _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(-1));
    S[i] = _mm512_castsi512_ps(v);
  }
  transpose16_regs(S);
  return special != 0;
}

// Block q (0..3) of a transposed scale word as fp32, bitwise e8m0_to_float: e << 23, with e = 0 -> 2^-127
// (0x00400000) and e = 255 -> NaN (0x7FC00000) when SPECIAL (some byte of the span is 0 or 255).
template <int Q>
inline __m512 fp4_word_scale(__m512i w, bool special) {
  const __m512i m = _mm512_set1_epi32(0x7F800000);
  __m512i x = Q == 3 ? _mm512_and_si512(_mm512_srli_epi32(w, 1), m) : _mm512_and_si512(_mm512_slli_epi32(w, 23 - 8 * Q), m);
  if (special) {
    x = _mm512_mask_mov_epi32(x, _mm512_testn_epi32_mask(x, x), _mm512_set1_epi32(0x00400000));
    x = _mm512_mask_mov_epi32(x, _mm512_cmpeq_epi32_mask(x, m), _mm512_set1_epi32(0x7FC00000));
  }
  return _mm512_castsi512_ps(x);
}

inline __m512 fp4_word_scale_rt(__m512i w, int q, bool special) {
  switch (q) {
    case 0: return fp4_word_scale<0>(w, special);
    case 1: return fp4_word_scale<1>(w, special);
    case 2: return fp4_word_scale<2>(w, special);
    default: return fp4_word_scale<3>(w, special);
  }
}

// MODE: 0 = quantized (Q: block partial sums scaled by sa * sw), 1 = dense (D: one chain over K with w * sw),
// 2 = dense with bf16(w * sw) (weight_as_bf16).
// The single-token GEMVs take any group of nrows <= 64 rows (rows past nrows are zero, their results unused) and any
// K that is a multiple of the codes in a 32-bit word (FP4 8, FP8 4, BF16 2): a last partial k-step loads only the
// bytes before K and runs only its words, so no activation past K is read and the chains are the reference's.
template <int MODE>
void gemv_fp4(const PanelSrc& s, int64_t n0, int nrows, const float* a, const float* sa, __m512 accv[kG]) {
  const int64_t K = s.cols;
  const __m512 lut = _mm512_loadu_ps(e2m1_lut());
  alignas(64) __m512 T[kG][16];
  alignas(64) __m512 S[kG][16];  // transposed scale words of the current 2048 columns
  bool special = false;
  __m512 sv[kG];
  int prow[kG];  // rows of each panel
  for (int p = 0; p < kG; ++p) prow[p] = std::clamp(nrows - p * kPanel, 0, kPanel);
  const int64_t slice = next_group_slice(s, (K + 127) / 128);
  for (int64_t k0 = 0, st = 0; k0 < K; k0 += 128, ++st) {
    const int cols = static_cast<int>(std::min<int64_t>(128, K - k0));  // a multiple of 8
    if (k0 % 2048 == 0) {
      special = false;
      for (int p = 0; p < kG; ++p) special |= fp4_scale_words(s, n0 + p * kPanel, k0, S[p], prow[p]);
    }
    for (int p = 0; p < kG; ++p)
      load_transposed_part(s.w + (n0 + p * kPanel) * s.row_bytes, s.row_bytes, k0 / 2, prow[p], cols / 2, T[p], s.prefetched);
    __m512i sword[kG];
    for (int p = 0; p < kG; ++p) sword[p] = _mm512_castps_si512(S[p][(k0 % 2048) / 128]);
    auto block = [&]<int BLK>() {
      const int words = std::min(4, cols / 8 - 4 * BLK);  // words of this 32-column block before K
      if (words <= 0) return;
      __m512 sw[kG];
      for (int p = 0; p < kG; ++p) {
        sw[p] = fp4_word_scale<BLK>(sword[p], special);
        sv[p] = MODE == 0 ? _mm512_setzero_ps() : accv[p];
      }
      for (int c = 4 * BLK; c < 4 * BLK + words; ++c) {
        prefetch_next_group(s, st, slice, c, cols / 8);
        const float* ak = a + k0 + 8 * c;
        for (int qq = 0; qq < 8; ++qq) {
          const __m512 ab = _mm512_set1_ps(ak[qq]);
          for (int p = 0; p < kG; ++p) {
            __m512 w = _mm512_permutexvar_ps(_mm512_srli_epi32(_mm512_castps_si512(T[p][c]), 4 * qq), lut);
            if constexpr (MODE >= 1) w = _mm512_mul_ps(w, sw[p]);
            if constexpr (MODE == 2) w = round_bf16(w);
            sv[p] = _mm512_fmadd_ps(ab, w, sv[p]);
          }
        }
      }
      if constexpr (MODE == 0) {
        const __m512 sab = _mm512_set1_ps(sa[(k0 + 32 * BLK) / 128]);
        for (int p = 0; p < kG; ++p) accv[p] = _mm512_add_ps(accv[p], _mm512_mul_ps(sv[p], _mm512_mul_ps(sab, sw[p])));
      } else {
        for (int p = 0; p < kG; ++p) accv[p] = sv[p];
      }
    };
    block.template operator()<0>();
    block.template operator()<1>();
    block.template operator()<2>();
    block.template operator()<3>();
  }
}

// ---- E4M3 words -> fp32 values * 2^-8 (the quantized FP8 GEMVs) ----
// The (Q) chains of the FP8 GEMVs run on w' = w * 2^-8 (s' = s * 2^-8 at every step: all values are scaled by a power
// of two and stay normal — products >= 2^-26 — so every rounding is the same) and the block sum is scaled back
// (s' * 2^8, exact) before the reference's acc + s * (sa * sw). Two decoders give w':
//  - codes in the top byte of each 32-bit lane, no subnormal code among them: dec_e4m3_top's bits times 2^112;
//  - any codes: the f16 route. A word vector (lane i = 4 codes of row i) is permuted as 16-bit halves so that its low
//    256 bits hold codes 0/1 and its high 256 bits codes 2/3 of the 16 rows; a code in the high byte of a 16-bit
//    element becomes the f16 (x >>a 1) & 0xBF80 (sign, the 4 exponent bits, 3 mantissa bits: f16 2^(e-15) (1 + m/8),
//    f16 subnormal m * 2^-17 for e = 0: exactly w * 2^-8), and vcvtph2ps converts it exactly, subnormals included,
//    without fp32 subnormals.
inline __m512 dec_e4m3_top_q(__m512i top) {
  const __m512i x = _mm512_and_si512(_mm512_srai_epi32(top, 4), _mm512_set1_epi32(static_cast<int>(0x87F00000u)));
  return _mm512_mul_ps(_mm512_castsi512_ps(x), _mm512_set1_ps(0x1p112f));
}

// The 4 codes of a word vector v as w' vectors: w[q] = code q of the 16 rows.
inline void dec_e4m3_word_f16(__m512i v, __m512 w[4]) {
  const __m512i idx = _mm512_setr_epi32(0x00020000, 0x00060004, 0x000A0008, 0x000E000C, 0x00120010, 0x00160014,
                                        0x001A0018, 0x001E001C, 0x00030001, 0x00070005, 0x000B0009, 0x000F000D,
                                        0x00130011, 0x00170015, 0x001B0019, 0x001F001D);
  const __m512i fmask = _mm512_set1_epi16(static_cast<short>(0xBF80));
  const __m512i x = _mm512_permutexvar_epi16(idx, v);  // [codes 0,1 of rows 0..15 | codes 2,3 of rows 0..15]
  const __m512i hi = _mm512_and_si512(_mm512_srai_epi16(x, 1), fmask);                         // codes 1, 3
  const __m512i lo = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(x, 8), 1), fmask);  // codes 0, 2
  w[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(lo));
  w[1] = _mm512_cvtph_ps(_mm512_castsi512_si256(hi));
  w[2] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(lo, 1));
  w[3] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(hi, 1));
}

// The same w' through byte tables (kVbmi only): w' is a bf16 value for every code (3 mantissa bits; the subnormal
// codes' m * 2^-17 are normal), so its fp32 bits are hi << 24 | lo << 16, two bytes that depend on the code alone:
// lo on its 7 magnitude bits, hi on those and the sign. vpermi2b looks lo and hi up for all 64 codes of a word
// vector at once (128-entry tables, index = code & 0x7F), the sign bit is or'ed into hi, and one byte permute per
// code position q places the 16 rows' lo / hi in bytes 2 / 3 of their lanes (bytes 0, 1 zero): 7 permutes per 64
// codes instead of shift, shift, mask and multiply per 16, and no subnormal special case. Same values, bit for bit,
// as dec_e4m3_top_q / dec_e4m3_word_f16 (the NaN codes 0x7F / 0xFF too: +-480 * 2^-8).
constexpr uint16_t e4m3_q_bf16(int c) {  // bf16 bits of w' for the magnitude code c (0..127)
  const int e = c >> 3, m = c & 7;
  if (e != 0) return static_cast<uint16_t>((e + 112) << 7 | m << 4);  // 2^(e-15) * (1 + m/8)
  if (m == 0) return 0;
  const int p = m >= 4 ? 2 : m >= 2 ? 1 : 0;  // m * 2^-17 = 2^(p-17) * (m / 2^p)
  return static_cast<uint16_t>((p + 110) << 7 | ((m << (7 - p)) & 0x7F));
}

struct E4m3Tables {
  alignas(64) uint8_t lo[128], hi[128];
};
constexpr E4m3Tables make_e4m3_tables() {
  E4m3Tables t{};
  for (int c = 0; c < 128; ++c) {
    t.lo[c] = static_cast<uint8_t>(e4m3_q_bf16(c) & 0xFF);
    t.hi[c] = static_cast<uint8_t>(e4m3_q_bf16(c) >> 8);
  }
  return t;
}
constexpr E4m3Tables kE4m3Tables = make_e4m3_tables();

// The tables in registers (loaded once per kernel call).
struct E4m3Lut {
  __m512i lo0, lo1, hi0, hi1;
  E4m3Lut()
      : lo0(_mm512_load_si512(kE4m3Tables.lo)), lo1(_mm512_load_si512(kE4m3Tables.lo + 64)),
        hi0(_mm512_load_si512(kE4m3Tables.hi)), hi1(_mm512_load_si512(kE4m3Tables.hi + 64)) {}
};

// The 4 codes of a word vector v as w' vectors: w[q] = code q of the 16 rows.
inline void dec_e4m3_word_lut(__m512i v, const E4m3Lut& t, __m512 w[4]) {
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, v, t.lo1);
  const __m512i hi =  // table | (v & 0x80)
      _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t.hi0, v, t.hi1), v, _mm512_set1_epi8(-128), 0xF8);
  // byte 2 of lane i <- lo byte 4i + q, byte 3 <- hi byte 4i + q (index 64 + 4i + q of the pair lo, hi)
  const __m512i base = _mm512_setr_epi32(0x40000000, 0x44040000, 0x48080000, 0x4C0C0000, 0x50100000, 0x54140000,
                                         0x58180000, 0x5C1C0000, 0x60200000, 0x64240000, 0x68280000, 0x6C2C0000,
                                         0x70300000, 0x74340000, 0x78380000, 0x7C3C0000);
  constexpr __mmask64 bytes23 = 0xCCCCCCCCCCCCCCCCull;
  for (int q = 0; q < 4; ++q) {
    const __m512i idx = _mm512_add_epi32(base, _mm512_set1_epi32(q * 0x01010000));
    w[q] = _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(bytes23, lo, idx, hi));
  }
}

template <int MODE>
void gemv_fp8(const PanelSrc& s, int64_t n0, int nrows, const float* a, const float* sa, __m512 accv[kG]) {
  const int64_t K = s.cols;
  alignas(64) __m512 T[kG][16];
  __m512 sv[kG], sw[kG];
  int prow[kG];  // rows of each panel
  for (int p = 0; p < kG; ++p) prow[p] = std::clamp(nrows - p * kPanel, 0, kPanel);
  const int64_t slice = next_group_slice(s, (K + 63) / 64);
  const E4m3Lut lut;
  for (int64_t kb = 0, st = 0; kb < K; kb += 128) {
    for (int p = 0; p < kG; ++p) {
      sw[p] = fp8_panel_scale(s, n0 + p * kPanel, kb / 128);
      sv[p] = MODE == 0 ? _mm512_setzero_ps() : accv[p];
    }
    for (int h = 0; h < 2 && kb + 64 * h < K; ++h, ++st) {
      const int64_t k0 = kb + 64 * h;
      const int cols = static_cast<int>(std::min<int64_t>(64, K - k0));  // a multiple of 4
      for (int p = 0; p < kG; ++p)
        load_transposed_part(s.w + (n0 + p * kPanel) * s.row_bytes, s.row_bytes, k0, prow[p], cols, T[p], s.prefetched);
      for (int c = 0; c < cols / 4; ++c) {
        prefetch_next_group(s, st, slice, c, cols / 4);
        const float* ak = a + k0 + 4 * c;
        if constexpr (MODE == 0 && kVbmi) {
          for (int p = 0; p < kG; ++p) {
            __m512 w[4];
            dec_e4m3_word_lut(_mm512_castps_si512(T[p][c]), lut, w);
            for (int qq = 0; qq < 4; ++qq) sv[p] = _mm512_fmadd_ps(_mm512_set1_ps(ak[qq]), w[qq], sv[p]);
          }
          continue;
        }
        // the f16 decode only for the 4 panels' words with a subnormal code (a real checkpoint: ~1e-4 of codes)
        __mmask64 sub = 0;
        for (int p = 0; p < kG; ++p) sub |= e4m3_subnormals(_mm512_castps_si512(T[p][c]));
        if constexpr (MODE == 0) {
          if (sub != 0) {
            for (int p = 0; p < kG; ++p) {
              __m512 w[4];
              dec_e4m3_word_f16(_mm512_castps_si512(T[p][c]), w);
              for (int qq = 0; qq < 4; ++qq) sv[p] = _mm512_fmadd_ps(_mm512_set1_ps(ak[qq]), w[qq], sv[p]);
            }
          } else {
            for (int qq = 0; qq < 4; ++qq) {
              const __m512 ab = _mm512_set1_ps(ak[qq]);
              for (int p = 0; p < kG; ++p)
                sv[p] = _mm512_fmadd_ps(
                    ab, dec_e4m3_top_q(_mm512_slli_epi32(_mm512_castps_si512(T[p][c]), 24 - 8 * qq)), sv[p]);
            }
          }
        } else {
          auto step = [&]<bool EX>() {
            for (int qq = 0; qq < 4; ++qq) {
              const __m512 ab = _mm512_set1_ps(ak[qq]);
              for (int p = 0; p < kG; ++p) {
                const __m512i top = _mm512_slli_epi32(_mm512_castps_si512(T[p][c]), 24 - 8 * qq);
                __m512 w = _mm512_mul_ps(dec_e4m3_top<EX>(top), sw[p]);
                if constexpr (MODE == 2) w = round_bf16(w);
                sv[p] = _mm512_fmadd_ps(ab, w, sv[p]);
              }
            }
          };
          if (sub != 0)
            step.template operator()<true>();
          else
            step.template operator()<false>();
        }
      }
    }
    if constexpr (MODE == 0) {
      const __m512 sab = _mm512_set1_ps(sa[kb / 128]), s8 = _mm512_set1_ps(256.0f);
      for (int p = 0; p < kG; ++p)
        accv[p] = _mm512_add_ps(accv[p], _mm512_mul_ps(_mm512_mul_ps(sv[p], s8), _mm512_mul_ps(sab, sw[p])));
    } else {
      for (int p = 0; p < kG; ++p) accv[p] = sv[p];
    }
  }
}

void gemv_bf16(const PanelSrc& s, int64_t n0, int nrows, const float* a, __m512 accv[kG]) {
  const int64_t K = s.cols;
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  alignas(64) __m512 T[kG][16];
  int prow[kG];  // rows of each panel
  for (int p = 0; p < kG; ++p) prow[p] = std::clamp(nrows - p * kPanel, 0, kPanel);
  const int64_t slice = next_group_slice(s, (K + 31) / 32);
  for (int64_t k0 = 0, st = 0; k0 < K; k0 += 32, ++st) {
    const int cols = static_cast<int>(std::min<int64_t>(32, K - k0));  // a multiple of 2
    for (int p = 0; p < kG; ++p)
      load_transposed_part(s.w + (n0 + p * kPanel) * s.row_bytes, s.row_bytes, 2 * k0, prow[p], 2 * cols, T[p],
                           s.prefetched);
    for (int c = 0; c < cols / 2; ++c) {
      prefetch_next_group(s, st, slice, c, cols / 2);
      const __m512 a0 = _mm512_set1_ps(a[k0 + 2 * c]), a1 = _mm512_set1_ps(a[k0 + 2 * c + 1]);
      for (int p = 0; p < kG; ++p)
        accv[p] =
            _mm512_fmadd_ps(a0, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(T[p][c]), 16)), accv[p]);
      for (int p = 0; p < kG; ++p)
        accv[p] = _mm512_fmadd_ps(a1, _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(T[p][c]), hi)), accv[p]);
    }
  }
}

// BF16 dense product of MR tokens (token m at a + m*lda, accumulators at acc + m*ldacc) against one group: two
// panels at a time, each transposed weight word is decoded once and used by every token, each broadcast activation
// by both panels (2*MR independent fma chains hide the fma latency); per output the chain is gemv_bf16's (k
// ascending, one fma per element).
template <int MR>
void gemv_bf16_m2(const PanelSrc& s, int64_t n0, const float* a, int64_t lda, float* acc, int64_t ldacc) {
  static_assert(kG % 2 == 0);
  const int64_t K = s.cols;
  const int64_t slice = next_group_slice(s, (kG / 2) * (K / 32));
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int p = 0; p < kG; p += 2) {
    __m512 acc0[MR], acc1[MR];
    for (int m = 0; m < MR; ++m) acc0[m] = acc1[m] = _mm512_setzero_ps();
    const uint8_t* base0 = s.w + (n0 + p * kPanel) * s.row_bytes;
    const uint8_t* base1 = base0 + kPanel * s.row_bytes;
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
      alignas(64) __m512 T0[16], T1[16];
      load_transposed(base0, s.row_bytes, 2 * k0, T0, s.prefetched);
      load_transposed(base1, s.row_bytes, 2 * k0, T1, s.prefetched);
      for (int c = 0; c < 16; ++c) {
        prefetch_next_group(s, (p / 2) * (K / 32) + k0 / 32, slice, c, 16);
        const __m512 w00 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(T0[c]), 16));
        const __m512 w10 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(T1[c]), 16));
        for (int m = 0; m < MR; ++m) {
          const __m512 x = _mm512_set1_ps(a[m * lda + k0 + 2 * c]);
          acc0[m] = _mm512_fmadd_ps(x, w00, acc0[m]);
          acc1[m] = _mm512_fmadd_ps(x, w10, acc1[m]);
        }
        const __m512 w01 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(T0[c]), hi));
        const __m512 w11 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(T1[c]), hi));
        for (int m = 0; m < MR; ++m) {
          const __m512 x = _mm512_set1_ps(a[m * lda + k0 + 2 * c + 1]);
          acc0[m] = _mm512_fmadd_ps(x, w01, acc0[m]);
          acc1[m] = _mm512_fmadd_ps(x, w11, acc1[m]);
        }
      }
    }
    for (int m = 0; m < MR; ++m) {
      _mm512_storeu_ps(acc + m * ldacc + p * kPanel, acc0[m]);
      _mm512_storeu_ps(acc + m * ldacc + (p + 1) * kPanel, acc1[m]);
    }
  }
}

// BF16 dense product of MR tokens (token m at a + m*lda, accumulators at acc + m*ldacc) against one group: panel by
// panel, each transposed weight word is decoded once and used by every token (MR accumulators + the 16 transposed
// words stay in registers); per output the chain is gemv_bf16's (k ascending, one fma per element).
template <int MR>
void gemv_bf16_m(const PanelSrc& s, int64_t n0, const float* a, int64_t lda, float* acc, int64_t ldacc) {
  const int64_t K = s.cols;
  const int64_t slice = next_group_slice(s, kG * (K / 32));
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int p = 0; p < kG; ++p) {
    __m512 accv[MR];
    for (int m = 0; m < MR; ++m) accv[m] = _mm512_setzero_ps();
    const uint8_t* base = s.w + (n0 + p * kPanel) * s.row_bytes;
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
      prefetch_next_group(s, p * (K / 32) + k0 / 32, slice);
      __m512 T[16];
      load_transposed(base, s.row_bytes, 2 * k0, T, s.prefetched);
      for (int c = 0; c < 16; ++c) {
        const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(T[c]), 16));
        const __m512 w1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(T[c]), hi));
        for (int m = 0; m < MR; ++m) accv[m] = _mm512_fmadd_ps(_mm512_set1_ps(a[m * lda + k0 + 2 * c]), w0, accv[m]);
        for (int m = 0; m < MR; ++m)
          accv[m] = _mm512_fmadd_ps(_mm512_set1_ps(a[m * lda + k0 + 2 * c + 1]), w1, accv[m]);
      }
    }
    for (int m = 0; m < MR; ++m) _mm512_storeu_ps(acc + m * ldacc + p * kPanel, accv[m]);
  }
}

// BF16 product of MR tokens (token m at a + m*lda, accumulators at acc + m*ldacc) against one group read from the
// panel copy (PanelSrc::panels, gemm.h pack_bf16_panels): NP panels at a time, each panel's column-pair words loaded
// as stored (no row transposes), each word split once for every token; per output the chain of gemv_bf16 (k
// ascending, one fma per element, from 0). Prefetch as gemv_prefetch_bytes: one group ahead (the same offset of
// the next group's panels) for short rows, else a little ahead in the same panel.
template <int MR, int NP>
void gemv_bf16_panels(const PanelSrc& s, int64_t n0, const float* a, int64_t lda, float* acc, int64_t ldacc) {
  static_assert(kG % NP == 0);
  const int64_t pairs = s.cols / 2;
  const int64_t pw = pairs * kPanel;  // words per panel
  const int64_t ahead = gemv_prefetch_bytes(s.row_bytes) / 4;
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int p = 0; p < kG; p += NP) {
    const uint32_t* base = s.panels + (n0 / kPanel + p) * pw;
    __m512 accv[MR][NP];
    for (int m = 0; m < MR; ++m)
      for (int q = 0; q < NP; ++q) accv[m][q] = _mm512_setzero_ps();
    for (int64_t c = 0; c < pairs; ++c) {
      __m512i t[NP];
      for (int q = 0; q < NP; ++q) {
        const uint32_t* wq = base + q * pw + c * kPanel;
        _mm_prefetch(reinterpret_cast<const char*>(wq + ahead), _MM_HINT_T0);
        t[q] = _mm512_loadu_si512(wq);
      }
      __m512 w[NP];
      for (int q = 0; q < NP; ++q) w[q] = _mm512_castsi512_ps(_mm512_slli_epi32(t[q], 16));  // column 2c
      for (int m = 0; m < MR; ++m) {
        const __m512 x = _mm512_set1_ps(a[m * lda + 2 * c]);
        for (int q = 0; q < NP; ++q) accv[m][q] = _mm512_fmadd_ps(x, w[q], accv[m][q]);
      }
      for (int q = 0; q < NP; ++q) w[q] = _mm512_castsi512_ps(_mm512_and_si512(t[q], hi));  // column 2c + 1
      for (int m = 0; m < MR; ++m) {
        const __m512 x = _mm512_set1_ps(a[m * lda + 2 * c + 1]);
        for (int q = 0; q < NP; ++q) accv[m][q] = _mm512_fmadd_ps(x, w[q], accv[m][q]);
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int q = 0; q < NP; ++q) _mm512_storeu_ps(acc + m * ldacc + (p + q) * kPanel, accv[m][q]);
  }
}

// Quantized (Q) product of MR tokens against one group, FP4 (1x32 E8M0 blocks) or FP8 (128-column blocks): two
// panels at a time, every transposed weight word decoded once for all tokens, 2*MR independent block chains in
// registers; per output the order of gemv_fp4 / gemv_fp8 / mk_q: s = fma chain over the K-block (k ascending), then
// acc = acc + s * (sa * sw), blocks ascending (acc kept in the caller's buffer).
// K needs only be a multiple of 32 (narrow models: the demo's 96- and 160-column linears): the last step loads the
// row bytes present (masked), uses the words present (FP4: the blocks of its scale word before K, which
// fp4_scale_words loaded), and a last FP8 block shorter than 128 ends at K (as mk_q's partial edge block).
template <int MR, bool FP4>
void gemv_q_m(const PanelSrc& s, int64_t n0, const float* a, int64_t lda, const float* sa, int64_t ldsa, float* acc,
              int64_t ldacc) {
  static_assert(kG % 2 == 0);
  const int64_t K = s.cols;
  constexpr int kStep = FP4 ? 128 : 64;  // columns per 64-byte row load
  constexpr int kBlk = FP4 ? 32 : 128;   // K-block
  const int64_t steps = (K + kStep - 1) / kStep;  // k-steps per pair of panels (the last may be partial)
  const int64_t slice = next_group_slice(s, (kG / 2) * steps);
  const __m512 lut = _mm512_loadu_ps(e2m1_lut());
  const E4m3Lut lut8;
  for (int p = 0; p < kG; p += 2) {
    const int64_t r0 = n0 + p * kPanel;
    const uint8_t* base0 = s.w + r0 * s.row_bytes;
    const uint8_t* base1 = base0 + kPanel * s.row_bytes;
    float* acc0 = acc + p * kPanel;
    for (int m = 0; m < MR; ++m) {
      _mm512_storeu_ps(acc0 + m * ldacc, _mm512_setzero_ps());
      _mm512_storeu_ps(acc0 + m * ldacc + kPanel, _mm512_setzero_ps());
    }
    __m512 sv[MR][2];
    alignas(64) __m512 S0[16], S1[16];  // FP4: the two panels' transposed scale words of the current 2048 columns
    bool special = false;
    // end of the K-block at kb; FP8 chains ran on w * 2^-8 (dec_e4m3_top_q / dec_e4m3_word_f16): s = s' * 2^8
    auto flush = [&](int64_t kb, __m512 sw0, __m512 sw1) {
      const __m512 back = _mm512_set1_ps(FP4 ? 1.0f : 256.0f);
      for (int m = 0; m < MR; ++m) {
        const __m512 sab = _mm512_set1_ps(sa[m * ldsa + kb / 128]);
        const __m512 s0 = FP4 ? sv[m][0] : _mm512_mul_ps(sv[m][0], back);
        const __m512 s1 = FP4 ? sv[m][1] : _mm512_mul_ps(sv[m][1], back);
        float* o = acc0 + m * ldacc;
        _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), _mm512_mul_ps(s0, _mm512_mul_ps(sab, sw0))));
        _mm512_storeu_ps(o + kPanel,
                         _mm512_add_ps(_mm512_loadu_ps(o + kPanel), _mm512_mul_ps(s1, _mm512_mul_ps(sab, sw1))));
        sv[m][0] = sv[m][1] = _mm512_setzero_ps();
      }
    };
    for (int m = 0; m < MR; ++m) sv[m][0] = sv[m][1] = _mm512_setzero_ps();
    __m512 sw0 = _mm512_setzero_ps(), sw1 = sw0;
    for (int64_t k0 = 0; k0 < K; k0 += kStep) {
      alignas(64) __m512 T0[16], T1[16];
      const int64_t off = FP4 ? k0 / 2 : k0;
      constexpr int kPerWord = FP4 ? 8 : 4;
      const int kn = static_cast<int>(std::min<int64_t>(kStep, K - k0));  // columns of this step (a multiple of 32)
      // (a partial last step: only the bytes before K are loaded, the words past them are zero and not used)
      load_transposed_part(base0, s.row_bytes, off, kPanel, FP4 ? kn / 2 : kn, T0, s.prefetched);
      load_transposed_part(base1, s.row_bytes, off, kPanel, FP4 ? kn / 2 : kn, T1, s.prefetched);
      if constexpr (FP4) {
        if (k0 % 2048 == 0) special = fp4_scale_words(s, r0, k0, S0) | fp4_scale_words(s, r0 + kPanel, k0, S1);
      } else if (k0 % 128 == 0) {
        sw0 = fp8_panel_scale(s, r0, k0 / 128);
        sw1 = fp8_panel_scale(s, r0 + kPanel, k0 / 128);
      }
      for (int c = 0; c < kn / kPerWord; ++c) {
        prefetch_next_group(s, (p / 2) * steps + k0 / kStep, slice, c, kn / kPerWord);
        const float* ak = a + k0 + kPerWord * c;
        if constexpr (FP4) {
          if (c % 4 == 0) {  // a new 32-column block
            const int wi = static_cast<int>((k0 % 2048) / 128);
            sw0 = fp4_word_scale_rt(_mm512_castps_si512(S0[wi]), c / 4, special);
            sw1 = fp4_word_scale_rt(_mm512_castps_si512(S1[wi]), c / 4, special);
          }
          for (int qq = 0; qq < kPerWord; ++qq) {
            const __m512 w0 = _mm512_permutexvar_ps(_mm512_srli_epi32(_mm512_castps_si512(T0[c]), 4 * qq), lut);
            const __m512 w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(_mm512_castps_si512(T1[c]), 4 * qq), lut);
            for (int m = 0; m < MR; ++m) {
              const __m512 x = _mm512_set1_ps(ak[m * lda + qq]);
              sv[m][0] = _mm512_fmadd_ps(x, w0, sv[m][0]);
              sv[m][1] = _mm512_fmadd_ps(x, w1, sv[m][1]);
            }
          }
        } else {
          __m512 w0[4], w1[4];
          if constexpr (kVbmi) {
            dec_e4m3_word_lut(_mm512_castps_si512(T0[c]), lut8, w0);
            dec_e4m3_word_lut(_mm512_castps_si512(T1[c]), lut8, w1);
          } else if ((e4m3_subnormals(_mm512_castps_si512(T0[c])) | e4m3_subnormals(_mm512_castps_si512(T1[c]))) != 0) {
            dec_e4m3_word_f16(_mm512_castps_si512(T0[c]), w0);
            dec_e4m3_word_f16(_mm512_castps_si512(T1[c]), w1);
          } else {
            for (int qq = 0; qq < 4; ++qq) {
              w0[qq] = dec_e4m3_top_q(_mm512_slli_epi32(_mm512_castps_si512(T0[c]), 24 - 8 * qq));
              w1[qq] = dec_e4m3_top_q(_mm512_slli_epi32(_mm512_castps_si512(T1[c]), 24 - 8 * qq));
            }
          }
          for (int qq = 0; qq < 4; ++qq)
            for (int m = 0; m < MR; ++m) {
              const __m512 x = _mm512_set1_ps(ak[m * lda + qq]);
              sv[m][0] = _mm512_fmadd_ps(x, w0[qq], sv[m][0]);
              sv[m][1] = _mm512_fmadd_ps(x, w1[qq], sv[m][1]);
            }
        }
        const int64_t kend = k0 + kPerWord * (c + 1);
        if (kend % kBlk == 0 || kend == K) flush((kend - 1) / kBlk * kBlk, sw0, sw1);
      }
    }
  }
}

template <bool FP4>
void gemv_q_m_dispatch(const PanelSrc& s, int64_t n0, const float* a, int64_t lda, const float* sa, int64_t ldsa,
                       int mr, float* acc, int64_t ldacc) {
  switch (mr) {
    case 8: gemv_q_m<8, FP4>(s, n0, a, lda, sa, ldsa, acc, ldacc); break;
    case 7: gemv_q_m<7, FP4>(s, n0, a, lda, sa, ldsa, acc, ldacc); break;
    case 6: gemv_q_m<6, FP4>(s, n0, a, lda, sa, ldsa, acc, ldacc); break;
    case 5: gemv_q_m<5, FP4>(s, n0, a, lda, sa, ldsa, acc, ldacc); break;
    case 4: gemv_q_m<4, FP4>(s, n0, a, lda, sa, ldsa, acc, ldacc); break;
    case 3: gemv_q_m<3, FP4>(s, n0, a, lda, sa, ldsa, acc, ldacc); break;
    default: gemv_q_m<2, FP4>(s, n0, a, lda, sa, ldsa, acc, ldacc); break;
  }
}

bool gemv_group_m(const PanelSrc& s, int64_t n0, const float* a, int64_t lda, const float* sa, int64_t ldsa, int mr,
                  bool q, float* acc, int64_t ldacc) {
  if (mr < 2 || mr > 8) return false;
  if (q) {
    if (s.fmt == GemmFormat::fp4 && s.cols % 32 == 0) {
      gemv_q_m_dispatch<true>(s, n0, a, lda, sa, ldsa, mr, acc, ldacc);
      return true;
    }
    if (s.fmt == GemmFormat::fp8 && s.cols % 32 == 0 && s.bc == 128) {
      gemv_q_m_dispatch<false>(s, n0, a, lda, sa, ldsa, mr, acc, ldacc);
      return true;
    }
    return false;
  }
  if (s.fmt != GemmFormat::bf16 || s.cols % 32 != 0) return false;
  if (s.panels) {
    switch (mr) {
      case 8: gemv_bf16_panels<8, 2>(s, n0, a, lda, acc, ldacc); break;
      case 7: gemv_bf16_panels<7, 2>(s, n0, a, lda, acc, ldacc); break;
      case 6: gemv_bf16_panels<6, 2>(s, n0, a, lda, acc, ldacc); break;
      case 5: gemv_bf16_panels<5, 2>(s, n0, a, lda, acc, ldacc); break;
      case 4: gemv_bf16_panels<4, 2>(s, n0, a, lda, acc, ldacc); break;
      case 3: gemv_bf16_panels<3, 4>(s, n0, a, lda, acc, ldacc); break;
      default: gemv_bf16_panels<2, 4>(s, n0, a, lda, acc, ldacc); break;
    }
    return true;
  }
  switch (mr) {
    case 8: gemv_bf16_m2<8>(s, n0, a, lda, acc, ldacc); break;
    case 7: gemv_bf16_m2<7>(s, n0, a, lda, acc, ldacc); break;
    case 6: gemv_bf16_m2<6>(s, n0, a, lda, acc, ldacc); break;
    case 5: gemv_bf16_m2<5>(s, n0, a, lda, acc, ldacc); break;
    case 4: gemv_bf16_m2<4>(s, n0, a, lda, acc, ldacc); break;
    case 3: gemv_bf16_m<3>(s, n0, a, lda, acc, ldacc); break;
    case 2: gemv_bf16_m<2>(s, n0, a, lda, acc, ldacc); break;
    default: gemv_bf16_m<1>(s, n0, a, lda, acc, ldacc); break;
  }
  return true;
}

bool gemv_group(const PanelSrc& s, int64_t n0, int nrows, const float* a, const float* sa, bool q, float* acc) {
  const int64_t K = s.cols;
  if (!q && s.fmt == GemmFormat::bf16 && K % 32 == 0 && s.panels && nrows == kGroupRows) {
    gemv_bf16_panels<1, kG>(s, n0, a, 0, acc, 0);
    return true;
  }
  __m512 accv[kG];
  for (int p = 0; p < kG; ++p) accv[p] = _mm512_setzero_ps();
  const int mode = q ? 0 : (s.round_bf16 ? 2 : 1);
  if (s.fmt == GemmFormat::fp4 && K % 8 == 0) {
    if (mode == 0) gemv_fp4<0>(s, n0, nrows, a, sa, accv);
    if (mode == 1) gemv_fp4<1>(s, n0, nrows, a, sa, accv);
    if (mode == 2) gemv_fp4<2>(s, n0, nrows, a, sa, accv);
  } else if (s.fmt == GemmFormat::fp8 && K % 4 == 0 && s.bc == 128) {
    if (mode == 0) gemv_fp8<0>(s, n0, nrows, a, sa, accv);
    if (mode == 1) gemv_fp8<1>(s, n0, nrows, a, sa, accv);
    if (mode == 2) gemv_fp8<2>(s, n0, nrows, a, sa, accv);
  } else if (!q && s.fmt == GemmFormat::bf16 && K % 2 == 0) {
    gemv_bf16(s, n0, nrows, a, accv);  // bf16(w) == w: weight_as_bf16 changes nothing
  } else {
    return false;
  }
  for (int p = 0; p < kG; ++p) _mm512_storeu_ps(acc + p * kPanel, accv[p]);
  return true;
}

// ---- micro-kernels: MR tokens x NP panels ----
template <int MR, int NP>
inline void tile_q(const MkArgs& A, int64_t m0, int p0) {
  for (int b = 0; b < A.nbk; ++b) {
    const int kb0 = b * A.bk, kb1 = kb0 + A.bk < A.kc ? kb0 + A.bk : A.kc;
    __m512 s[MR][NP];
    for (int m = 0; m < MR; ++m)
      for (int p = 0; p < NP; ++p) s[m][p] = _mm512_setzero_ps();
    const float* a = A.a + m0 * A.lda;
    for (int k = kb0; k < kb1; ++k) {
      __m512 w[NP];
      for (int p = 0; p < NP; ++p) w[p] = _mm512_loadu_ps(A.P + (static_cast<int64_t>(p0 + p) * A.kc_pad + k) * kPanel);
      for (int m = 0; m < MR; ++m) {
        const __m512 av = _mm512_set1_ps(a[m * A.lda + k]);
        for (int p = 0; p < NP; ++p) s[m][p] = _mm512_fmadd_ps(av, w[p], s[m][p]);
      }
    }
    for (int m = 0; m < MR; ++m) {
      const __m512 sav = _mm512_set1_ps(A.sa[(m0 + m) * A.ldsa + (A.k0 + kb0) / 128]);
      for (int p = 0; p < NP; ++p) {
        const __m512 sc = _mm512_mul_ps(sav, _mm512_loadu_ps(A.Ps + (p0 + p) * A.ldps + b * kPanel));
        float* acc = A.acc + (m0 + m) * A.ldacc + (p0 + p) * kPanel;
        _mm512_storeu_ps(acc, _mm512_add_ps(_mm512_loadu_ps(acc), _mm512_mul_ps(s[m][p], sc)));
      }
    }
  }
}

template <int MR, int NP>
inline void tile_d(const MkArgs& A, int64_t m0, int p0) {
  __m512 s[MR][NP];
  for (int m = 0; m < MR; ++m)
    for (int p = 0; p < NP; ++p) s[m][p] = _mm512_loadu_ps(A.acc + (m0 + m) * A.ldacc + (p0 + p) * kPanel);
  const float* a = A.a + m0 * A.lda;
  for (int k = 0; k < A.kc; ++k) {
    __m512 w[NP];
    for (int p = 0; p < NP; ++p) w[p] = _mm512_loadu_ps(A.P + (static_cast<int64_t>(p0 + p) * A.kc_pad + k) * kPanel);
    for (int m = 0; m < MR; ++m) {
      const __m512 av = _mm512_set1_ps(a[m * A.lda + k]);
      for (int p = 0; p < NP; ++p) s[m][p] = _mm512_fmadd_ps(av, w[p], s[m][p]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int p = 0; p < NP; ++p) _mm512_storeu_ps(A.acc + (m0 + m) * A.ldacc + (p0 + p) * kPanel, s[m][p]);
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
  if (A.np == kGroupPanels) {
    for (; m + 4 <= A.mr; m += 4) tile<Q, 4, 4>(A, m, 0);
    for (; m < A.mr; ++m) tile<Q, 1, 4>(A, m, 0);
  } else {
    for (; m + 4 <= A.mr; m += 4)
      for (int p = 0; p < A.np; ++p) tile<Q, 4, 1>(A, m, p);
    for (; m < A.mr; ++m)
      for (int p = 0; p < A.np; ++p) tile<Q, 1, 1>(A, m, p);
  }
}

void mk_q(const MkArgs& A) { mk<true>(A); }
void mk_d(const MkArgs& A) { mk<false>(A); }

}  // namespace
}  // namespace dsv4::gemm_detail

#pragma GCC pop_options

namespace dsv4::gemm_detail {
#if defined(DSV4_GEMM_AVX512_VBMI)
const Kernels* avx512vbmi_kernels() {
#else
const Kernels* avx512_kernels() {
#endif
  static const Kernels k{decode_panel, fp4_panel_scales, act_quant_row, gemv_group, mk_q, mk_d, gemv_group_m};
  return &k;
}
}  // namespace dsv4::gemm_detail

#else
namespace dsv4::gemm_detail {
#if defined(DSV4_GEMM_AVX512_VBMI)
const Kernels* avx512vbmi_kernels() { return nullptr; }
#else
const Kernels* avx512_kernels() { return nullptr; }
#endif
}  // namespace dsv4::gemm_detail
#endif
