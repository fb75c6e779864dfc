// A weight as an op sees it: a raw, non-owning view of a matrix in one of the checkpoint storage formats (spec §3.6),
// resident on the backend's device, plus the options of one linear() call (the spec's quantization points).
// The CPU backend's views point into the memory-mapped checkpoint; the CUDA backend's into device memory.
#pragma once
#include <cstdint>

#include "backend/numerics.h"

namespace dsv4 {

enum class GemmFormat { bf16, f32, fp8, fp4 };

struct WeightView {
  GemmFormat fmt = GemmFormat::f32;
  const uint8_t* w = nullptr;      // row-major [rows, cols] elements (fp4: [rows, cols/2] bytes, lo nibble = even col)
  const uint8_t* scale = nullptr;  // fp8: [ceil(rows/block_rows), ceil(cols/block_cols)]; fp4: [rows, ceil(cols/32)]
  bool scale_f32 = false;          // scale elements are F32 (fp8 only), else E8M0 bytes
  int64_t rows = 0, cols = 0;      // logical [out, in]
  int64_t block_rows = 128, block_cols = 128;  // fp8 scale block; fp4 is always 1 x 32
  const void* aux = nullptr;       // backend-private data of the resident copy (CUDA: fp32-widened scales), or null
  // CPU only, BF16 with cols % 32 == 0: the same weight once more in 16-row panels of column-pair words (layout:
  // gemm.h pack_bf16_panels), which the AVX-512 decode GEMVs read without transposing rows; null: none.
  const uint32_t* panels = nullptr;

  bool bound() const { return w != nullptr; }
  // Bytes of one stored row of `w`.
  int64_t row_bytes() const {
    switch (fmt) {
      case GemmFormat::fp8: return cols;
      case GemmFormat::fp4: return cols / 2;
      case GemmFormat::bf16: return 2 * cols;
      case GemmFormat::f32: return 4 * cols;
    }
    return 0;
  }
};
using GemmWeight = WeightView;

// Options of one linear(). Each flag names the spec rule it implements; the model chooses them per call site.
struct LinearOpts {
  // §4.3 + §4.5: quantize each row of x to FP8 (e4m3, ue8m0 scale per 128) and run the block-scaled FP8/FP4 product.
  // Reference numerics for every FP8 linear and the FP4 experts, except wo_a.
  bool act_quant_fp8 = false;
  // §4.5 / §8: round the output to bf16 (reference: every FP8/FP4 GEMM and the bf16 F.linear outputs).
  bool out_bf16 = false;
  // §3.6 (1): use bf16(dequantized weight) — the reference wo_a (FP8 -> BF16 at load, bf16 einsum, no act quant).
  bool weight_as_bf16 = false;
  // The caller guarantees that x holds bf16 values (reference numerics: the activations entering the BF16 linears are
  // bf16). The result is the same product; a backend may then run a BF16 weight on BF16 tensor cores, whose products
  // of two bf16 values are exact (CUDA, more than 8 tokens). The CPU ignores it.
  bool x_bf16 = false;
  // Output-row subrange [row_begin, row_end) of W (row_end = -1: W.rows), e.g. one wo_a group of o_lora_rank rows.
  int64_t row_begin = 0;
  int64_t row_end = -1;
};

// The options of an FP8/FP4 checkpoint linear (wq_a, wq_b, wkv, wo_b, shared/routed experts, indexer.wq_b,
// e_proj/h_proj): reference -> {act_quant_fp8, out_bf16}; dense -> {} (fp32, exact dequantized weight).
inline LinearOpts quantized_linear_opts(Numerics n) {
  LinearOpts o;
  if (n == Numerics::reference) {
    o.act_quant_fp8 = true;
    o.out_bf16 = true;
  }
  return o;
}

}  // namespace dsv4
