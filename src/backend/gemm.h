// Linear layers y = x · Wᵀ over weights in the checkpoint formats (spec §3.6), with the reference's quantization
// points (spec §4.3–§4.5, §8) selected by LinearOpts. CPU kernels (AVX-512 / AVX2+FMA+F16C chosen at run time,
// scalar fallback), OpenMP over output rows. Weights are streamed from their storage (the mmap); no dequantized copy
// of a weight is ever materialised beyond a small per-thread tile.
//
// Exact semantics (the "summation order" is part of the contract; the SIMD kernels reproduce it bitwise, and the
// result does not depend on the thread count, the SIMD level or n_tok — row t of y depends only on row t of x):
//
// (Q) quantized product, opts.act_quant_fp8 = true (reference FP8/FP4 GEMMs, spec §4.5); W must be FP8 or FP4:
//     every row of x is act_quant'ed per 128 columns (§4.3) to e4m3 values qa with power-of-two scales sa.
//     FP8 W (blocks 128x128 or br x 128):    K-blocks kb of 128 columns
//     FP4 W (1x32 blocks):                   K-blocks kb of 32 columns
//       s   = 0;  for k in kb ascending:  s = fma(qa[m,k], qw[n,k], s)        (fp32; every product is exact)
//       acc = acc + s * (sa[m, k/128] * sw[n, kb])                             (fp32, blocks ascending, acc0 = 0)
//     qw = e4m3 / e2m1 code value, sw = the block scale (E8M0 2^(e-127), or F32 for FP8).
// (D) dense product, opts.act_quant_fp8 = false (any format):
//       acc = 0;  for k = 0..cols-1:  acc = fma(x[m,k], Wd[n,k], acc)          (fp32, one chain over all of K)
//     Wd = the exactly dequantized weight (qw * sw; bf16 / f32 as stored); with opts.weight_as_bf16, Wd = bf16(qw*sw)
//     (reference wo_a: FP8 weight dequantized to bf16 at load, bf16 x bf16 product with fp32 accumulation, §3.6).
// y[m, n - row_begin] = opts.out_bf16 ? bf16(acc) : acc.
//
// Partial edge blocks (rows or cols not multiples of the block) use the elements present (ceil-div scale grids).
// E4M3 NaN codes (0x7F/0xFF) in a weight are not supported (the SIMD decoders map them to +-480).
//
// Kernels (gemm_kernels.h): output rows are SIMD lanes (16-row panels), so each output accumulates sequentially in k
// whatever the vector width. One token (decode): a fused GEMV streams 64 rows at a time straight from the weight
// bytes (32-bit-word transposes, per-code decode, four FMA chains); on AVX-512 the same kernel serves 2-8 tokens of
// BF16 weights at once (a batch of decodes: each word decoded once for every token); while a group is computed, the
// next group's bytes are prefetched into L2 in address order, and FP4 block scales are read 2048 columns at a time
// (transposed like the weights, no gathers). Several tokens (prefill):
// 16-row x 512-column weight tiles are decoded once into fp32 and reused by a 4-token x 64-row micro-kernel, over
// tiles of <= 256 tokens. The AVX-512 FP8 decoders never form fp32 subnormals (words with E4M3 subnormal codes take an
// exact path: gemm_avx512.cpp dec_e4m3_top, and in the quantized GEMVs the f16 route, dec_e4m3_word_f16): a multiply
// with a subnormal input costs a microcode assist on Intel.
// Work is split statically over (64-row group, token tile) units; scratch is per thread (thread_local).
// A BF16 weight may come with a panel copy (WeightView::panels, pack_bf16_panels): the AVX-512 GEMVs of 1-8 tokens
// then load each panel's column-pair words directly instead of transposing 16 rows (half the work per weight word
// of a batched decode); same products in the same order, so the same bits.
// Errors (dsv4::Error): unbound / inconsistent weight, act_quant_fp8 with a BF16/F32 weight, FP8 block_cols != 128
// with act_quant_fp8, bad row range.
#pragma once
#include <cstdint>
#include <span>

#include "backend/numerics.h"
#include "backend/weight_view.h"
#include "format/dtype.h"
#include "loader/weights.h"

namespace dsv4 {

// View of a bound loader weight (BF16, F32, FP8_BLOCK128, FP4_BLOCK32); dsv4::Error for other formats.
GemmWeight gemm_weight(const WeightRef& W);

// Panel copy of a BF16 weight (WeightView::panels): ceil(rows / 16) panels of cols / 2 words of 16 lanes; lane j of
// word c of panel p = bits of W[16p + j, 2c] | bits of W[16p + j, 2c + 1] << 16 (rows past the end: 0).
// bf16_panel_words: the words it takes (0 when W is not BF16 with cols % 32 == 0: such weights get no copy).
int64_t bf16_panel_words(const GemmWeight& W);
void pack_bf16_panels(const GemmWeight& W, uint32_t* out);  // out: bf16_panel_words(W) words; OpenMP

// y[n_tok, row_end-row_begin] = x[n_tok, W.cols] · W[row_begin:row_end]ᵀ with the semantics above.
// x and y must not overlap. Runs on the OpenMP thread pool (omp_get_max_threads()).
void linear(const GemmWeight& W, const float* x, int64_t n_tok, float* y, const LinearOpts& opts);
void linear(const WeightRef& W, const float* x, int64_t n_tok, float* y, const LinearOpts& opts);
inline void linear(const WeightRef& W, std::span<const float> x, int64_t n_tok, std::span<float> y,
                   const LinearOpts& opts) {
  linear(W, x.data(), n_tok, y.data(), opts);
}

// Several independent products in one parallel region (e.g. the w1 and w3 of every expert of a decode step): each is
// exactly linear(job.W, job.x, job.n_tok, job.y, job.opts) (same results, bitwise), but their 64-row groups are split
// over the pool together, each thread taking one contiguous run of groups across the products (with the next group's
// weight bytes prefetched while one is computed), and products with the same x share its activation quantization.
// No job's y may overlap another job's x or y.
// nonfinite (optional, [n_tok]): set to 1 where token t's row of y holds a non-finite value, else 0; each thread
// checks the part of y it just wrote (Ops::linear_check_finite).
struct LinearJob {
  GemmWeight W;
  const float* x = nullptr;
  int64_t n_tok = 0;
  float* y = nullptr;
  LinearOpts opts;
  int32_t* nonfinite = nullptr;
};
void linear_batch(std::span<const LinearJob> jobs);

// Kernel selection (tests / benchmarks): the SIMD level linear() uses. Default: the best the CPU supports.
// avx512vbmi: the AVX-512 kernels compiled once more with AVX512-VBMI, whose quantized FP8 GEMVs decode E4M3 codes
// through byte lookup tables (vpermi2b) instead of shifts, masks and a multiply; same results, bitwise.
enum class SimdLevel { scalar, avx2, avx512, avx512vbmi };
const char* simd_level_name(SimdLevel l);  // "scalar", "avx2", "avx512", "avx512vbmi"
SimdLevel best_simd_level();               // what this CPU supports (and this build compiled)
// Force a level (clamped to best_simd_level()); returns the level now in use. Not thread-safe against running GEMMs.
SimdLevel set_simd_level(SimdLevel l);
SimdLevel simd_level();

}  // namespace dsv4
