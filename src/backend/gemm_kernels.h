// Internal interface between the GEMM driver (gemm.cpp) and its per-ISA kernels (gemm_scalar.cpp, gemm_avx2.cpp,
// gemm_avx512.cpp). Not part of the backend API.
//
// Data layout of one work item: a group of up to kGroupPanels panels of kPanel consecutive output rows. For a K chunk
// [k0, k0+kc) the weights are decoded into a panel tile P[np][kc][kPanel] (fp32, "transposed": lanes = rows), so that
// every output element accumulates its products sequentially in k (the order the header documents), whatever the
// vector width. Rows past the weight's end are zero.
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>

#include "backend/gemm.h"

namespace dsv4::gemm_detail {

constexpr int kPanel = 16;        // output rows per panel (one zmm / two ymm)
constexpr int kGroupPanels = 4;   // panels per work item
constexpr int kGroupRows = kPanel * kGroupPanels;
constexpr int kChunk = 512;       // K chunk (multiple of 128 so no quantization block straddles chunks)

// Where a panel's weights come from.
struct PanelSrc {
  GemmFormat fmt;
  const uint8_t* w;        // element (r, k) of the full weight
  int64_t row_bytes;       // stride between rows of w
  int64_t rows, cols;      // full logical shape
  bool dequant;            // multiply by the block scale (dense product), else raw code values (quantized product)
  bool round_bf16;         // then round to bf16 (weight_as_bf16)
  const uint8_t* scale;
  bool scale_f32;
  int64_t br, bc;          // scale block (fp4: 1 x 32)
  int64_t scale_cols;      // columns of the scale grid
  const uint32_t* panels = nullptr;  // BF16 only: the panel copy (gemm.h pack_bf16_panels), or null
  // What the fused GEMVs prefetch into L2 while they compute a group (set per work item by the driver): the weight
  // bytes of the next item this thread runs (a group is one contiguous block of rows) and its scale bytes, or null.
  const uint8_t* pf_w = nullptr;
  int64_t pf_w_bytes = 0;
  const uint8_t* pf_s = nullptr;
  int64_t pf_s_bytes = 0;
  // Whether this group's bytes were prefetched into L2 while the thread's previous work item ran (its pf_w): then the
  // fused GEMVs skip their per-row software prefetches.
  bool prefetched = false;
};

// Block scale of weight element (r, k) as fp32 (E8M0 decoded bitwise, or F32).
float weight_scale(const PanelSrc& s, int64_t r, int64_t k);
// Scales of row r for the scale-grid columns [c0, c0 + n) into out[i * stride] (one division per call).
void weight_scales_row(const PanelSrc& s, int64_t r, int64_t c0, int n, float* out, int stride);

// Arguments of the micro-kernels (one group, tokens [0, mr), one K chunk).
struct MkArgs {
  const float* a;     // activations of token 0 at column k0; token m at a + m*lda
  int64_t lda;
  const float* sa;    // (Q) act scales of token 0, per 128 absolute columns; token m at sa + m*ldsa
  int64_t ldsa;
  int64_t k0;         // chunk start (multiple of kChunk)
  int kc;             // chunk length (<= kChunk)
  int bk;             // (Q) K-block of the weight: 128 (fp8) or 32 (fp4)
  const float* P;     // [np][kc_pad][kPanel], kc_pad = kc rounded up to 16
  int kc_pad;
  const float* Ps;    // (Q) weight block scales: block b of panel p at Ps + p*ldps + b*kPanel, b < nbk = ceil(kc / bk)
  int64_t ldps;
  int nbk;
  int np;             // panels in the group (1..kGroupPanels)
  int64_t mr;         // tokens
  float* acc;         // [mr][ldacc]; panel p of token m at acc + m*ldacc + p*kPanel
  int64_t ldacc;
};

struct Kernels {
  // Decode rows [r0, r0 + nrows) (nrows <= kPanel), columns [k0, k0+kc) into P[kc_pad][kPanel] (zero padding).
  // Ps: when not null, the block scales of this panel for the chunk, Ps[b][j] = scale(r0 + j, k0 + b*sblk) with
  // sblk = s.bc (fp4: 32), for the dense dequantization (kernels may also look scales up themselves).
  void (*decode_panel)(const PanelSrc& s, int64_t r0, int nrows, int64_t k0, int kc, const float* Ps, float* P);
  // Optional (may be null): Ps[b][j] = scale(r0 + j, k0 + b*32) for a full FP4 panel (16 rows, E8M0), b < nps
  // (any nps >= 1; reads only bytes of the scale grid).
  void (*fp4_panel_scales)(const PanelSrc& s, int64_t r0, int64_t k0, int nps, float* Ps);
  // Optional (may be null): act_quant_fp8(x, n, 128, q, s) of act_quant.h, bitwise identical.
  void (*act_quant_row)(const float* x, int64_t n, float* q, float* s);
  // Optional (may be null): one token against one group (nrows <= kGroupRows rows from n0) over all of K, fused
  // decode + FMA without the panel tile; same semantics and order as mk_q / mk_d, accumulating from 0 into
  // acc[kGroupRows] (written whatever it held: for a full group it may be the caller's output row; the entries past
  // nrows are unspecified). Returns false (having done nothing) when this format / mode / shape is not handled.
  bool (*gemv_group)(const PanelSrc& s, int64_t n0, int nrows, const float* a, const float* sa, bool q, float* acc);
  void (*mk_q)(const MkArgs& a);   // semantics (Q) of gemm.h for this chunk
  void (*mk_d)(const MkArgs& a);   // semantics (D) of gemm.h for this chunk
  // Optional (may be null): the fused GEMV for mr (2..8) tokens at once (token m at a + m*lda, (Q) its act scales at
  // sa + m*ldsa, accumulators at acc + m*ldacc, from 0 whatever acc held): every weight word is loaded (transposed
  // unless it comes from a panel copy) and decoded once for all of them; each output keeps the chain of mk_q / mk_d.
  // Returns false (having done nothing) when this format / mode / shape is not handled.
  bool (*gemv_group_m)(const PanelSrc& s, int64_t n0, const float* a, int64_t lda, const float* sa, int64_t ldsa,
                       int mr, bool q, float* acc, int64_t ldacc) = nullptr;
};

const Kernels& scalar_kernels();
const Kernels* avx2_kernels();    // nullptr when not compiled in
const Kernels* avx512_kernels();  // nullptr when not compiled in
const Kernels* avx512vbmi_kernels();  // the same kernels built with AVX512-VBMI (gemm_avx512_vbmi.cpp), or nullptr

// Software prefetch distance of the fused GEMVs, in bytes past the row bytes about to be loaded. Rows short enough
// that a 64-row group is one small contiguous block (the lm head of a narrow model: [129280, 96] bf16 = 192-byte
// rows) are prefetched one group ahead, so the prefetches run across 4 KiB pages, where the hardware prefetchers stop;
// long rows 512 bytes ahead in each row (the group walks too many row streams for the hardware prefetchers).
inline int64_t gemv_prefetch_bytes(int64_t row_bytes) {
  return row_bytes * kGroupRows <= 16384 ? row_bytes * kGroupRows : 512;
}

// The fused GEMVs' prefetch of the next group (PanelSrc::pf_w, `bytes` long) while they make `steps` k-steps over
// theirs: step i prefetches the i-th slice of next_group_slice_bytes (a multiple of 64), split evenly by cache lines
// into one part per weight word the step computes (part c issued before word c, so the prefetches are spread over the
// step's work); next_group_part is part `part` of `parts` of step `step`'s slice as the byte range [first, second).
// Over all steps and parts the ranges tile [0, bytes) in order, whatever the words per step (a partial last step has
// fewer).
inline int64_t next_group_slice_bytes(int64_t bytes, int64_t steps) { return ((bytes + steps - 1) / steps + 63) & ~int64_t{63}; }
inline std::pair<int64_t, int64_t> next_group_part(int64_t bytes, int64_t slice, int64_t step, int part, int parts) {
  const int64_t lines = slice / 64, s0 = step * slice;
  return {std::min(s0 + lines * part / parts * 64, bytes), std::min(s0 + lines * (part + 1) / parts * 64, bytes)};
}

// Round a dequantized value to bf16 exactly as the SIMD kernels do (RNE on the bit pattern; weights are finite).
inline uint32_t bf16_round_bits(uint32_t b) { return (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u; }

}  // namespace dsv4::gemm_detail
