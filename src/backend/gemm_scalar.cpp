// Portable GEMM kernels: the definition of the summation order that the SIMD kernels reproduce bitwise.
#include <cmath>
#include <cstring>

#include "backend/gemm_kernels.h"
#include "format/numeric.h"

namespace dsv4::gemm_detail {

float weight_scale(const PanelSrc& s, int64_t r, int64_t k) {
  const int64_t i = (r / s.br) * s.scale_cols + k / s.bc;
  if (s.scale_f32) {
    float f;
    std::memcpy(&f, s.scale + 4 * i, 4);
    return f;
  }
  return e8m0_to_float(s.scale[i]);
}

void weight_scales_row(const PanelSrc& s, int64_t r, int64_t c0, int n, float* out, int stride) {
  const int64_t base = (r / s.br) * s.scale_cols + c0;
  if (s.scale_f32) {
    for (int i = 0; i < n; ++i) std::memcpy(out + static_cast<int64_t>(i) * stride, s.scale + 4 * (base + i), 4);
  } else {
    for (int i = 0; i < n; ++i) out[static_cast<int64_t>(i) * stride] = e8m0_to_float(s.scale[base + i]);
  }
}

namespace {

// Code value of element (r, k) (not scaled).
inline float weight_code(const PanelSrc& s, int64_t r, int64_t k) {
  const uint8_t* row = s.w + r * s.row_bytes;
  switch (s.fmt) {
    case GemmFormat::fp8: return e4m3fn_lut()[row[k]];
    case GemmFormat::fp4: return e2m1_lut()[(row[k >> 1] >> ((k & 1) * 4)) & 0xF];
    case GemmFormat::bf16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, 2);
      return bf16_to_float(h);
    }
    case GemmFormat::f32: {
      float f;
      std::memcpy(&f, row + 4 * k, 4);
      return f;
    }
  }
  return 0.0f;
}

void decode_panel(const PanelSrc& s, int64_t r0, int nrows, int64_t k0, int kc, const float*, float* P) {
  const int kc_pad = (kc + 15) & ~15;
  std::memset(P, 0, sizeof(float) * kc_pad * kPanel);
  const bool quantized = s.fmt == GemmFormat::fp8 || s.fmt == GemmFormat::fp4;
  for (int j = 0; j < nrows; ++j) {
    const int64_t r = r0 + j;
    for (int k = 0; k < kc; ++k) {
      float v = weight_code(s, r, k0 + k);
      if (quantized && s.dequant) v = v * weight_scale(s, r, k0 + k);
      if (s.round_bf16) v = bits_to_float(bf16_round_bits(float_to_bits(v)));
      P[k * kPanel + j] = v;
    }
  }
}

void mk_q(const MkArgs& A) {
  for (int64_t m = 0; m < A.mr; ++m) {
    const float* a = A.a + m * A.lda;
    const float* sa = A.sa + m * A.ldsa;
    for (int p = 0; p < A.np; ++p) {
      const float* P = A.P + static_cast<int64_t>(p) * A.kc_pad * kPanel;
      const float* Ps = A.Ps + p * A.ldps;
      float* acc = A.acc + m * A.ldacc + p * kPanel;
      for (int j = 0; j < kPanel; ++j) {
        float c = acc[j];
        for (int b = 0; b < A.nbk; ++b) {
          const int kb0 = b * A.bk, kb1 = kb0 + A.bk < A.kc ? kb0 + A.bk : A.kc;
          float s = 0.0f;
          for (int k = kb0; k < kb1; ++k) s = std::fma(a[k], P[k * kPanel + j], s);
          const float sc = sa[(A.k0 + kb0) / 128] * Ps[b * kPanel + j];
          const float t = s * sc;
          c = c + t;
        }
        acc[j] = c;
      }
    }
  }
}

void mk_d(const MkArgs& A) {
  for (int64_t m = 0; m < A.mr; ++m) {
    const float* a = A.a + m * A.lda;
    for (int p = 0; p < A.np; ++p) {
      const float* P = A.P + static_cast<int64_t>(p) * A.kc_pad * kPanel;
      float* acc = A.acc + m * A.ldacc + p * kPanel;
      for (int j = 0; j < kPanel; ++j) {
        float c = acc[j];
        for (int k = 0; k < A.kc; ++k) c = std::fma(a[k], P[k * kPanel + j], c);
        acc[j] = c;
      }
    }
  }
}

}  // namespace

const Kernels& scalar_kernels() {
  static const Kernels k{decode_panel, nullptr, nullptr, nullptr, mk_q, mk_d};
  return k;
}

}  // namespace dsv4::gemm_detail
