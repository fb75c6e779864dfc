// What the two prefill expert kernels share (k_moe_tc.cu: mma.sync; k_moe_wgmma.cu: wgmma, sm_90a): their arguments,
// the E8M0 scale tests and f16 factors, and the FP4 -> f16 conversion with the scale folded in (the values and the
// column order: k_moe_tc.cu's file comment).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/weight_view.h"

namespace dsv4::cuda::moe_tc {

constexpr int kW13 = 0, kW2 = 1;

// The fast path's E8M0 code range: e2m1 x 2^(e - 127) exact in f16.
constexpr uint32_t kFastLo = 104, kFastHi = 128;

// The kernels' arguments (moe_tc_big fills them).
struct BigArgs {
  const ExpertView* table = nullptr;  // device [E]
  int64_t n_experts = 0;
  const int32_t* seg_start = nullptr;
  const int32_t* big_tile_start = nullptr;
  const int32_t* row_tok = nullptr;  // kW13: token of each sorted row (the activation row); kW2: nullptr
  const uint8_t* act = nullptr;      // f16 activation codes [*, K] in the kernel's column order (moe_a16_kernel)
  const float* ratio = nullptr;      // [*, K / 128] sa[kb - 1] / sa[kb] (1 for kb = 0)
  const float* sa = nullptr;         // activation scales [*, K / 128]
  int64_t K = 0;
  float* y = nullptr;                // kW13: h [rows, inter]; kW2: o [rows, d_model]
  int64_t ldy = 0;
  const float* row_w = nullptr;
  float limit = 0.0f;
  bool out_bf16 = false, bf16 = false;
};

// Whether every byte of a word of E8M0 codes is in [kFastLo, kFastHi] = [104, 128]: byte b + 24 (mod 256, no carry
// between bytes) must lie in [128, 152].
__device__ __forceinline__ bool e8m0_word_fast(uint32_t w) {
  static_assert(kFastLo == 104 && kFastHi == 128, "the constants below encode the range");
  const uint32_t b = ((w & 0x7F7F7F7Fu) + 0x18181818u) ^ (w & 0x80808080u);             // per byte b + 24
  const uint32_t bad = (~b & 0x80808080u) | (((b & 0x7F7F7F7Fu) + 0x67676767u) & 0x80808080u);  // < 128 or > 152
  return bad == 0u;
}

// The fast path's f16 scale factors of a word of E8M0 codes in [104, 128]: per byte 4 (e - 98), the high byte of the
// f16 2^(e - 113) (exponent field e - 98 in 6..30), so that the f16 2^-14 x e2m1 of fp4x8_as_f16x2 times it is
// e2m1 x 2^(e - 127). (No borrow or carry between bytes in that range.)
__device__ __forceinline__ uint32_t e8m0_word_f16_hi(uint32_t w) { return w * 4u + 0x76767678u; }  // 4 (w - 0x62..)
// Group G's factor as an f16 pair, from e8m0_word_f16_hi's word.
template <int G>
__device__ __forceinline__ uint32_t f16_factor(uint32_t hi4) {
  return __byte_perm(hi4, 0u, 0x0404u + 0x1010u * G);  // bytes 0, hi4.G, 0, hi4.G
}
constexpr uint32_t kF16Two14 = 0x74007400u;  // 2^14 as an f16 pair: the slow path's bare E2M1 values

// Byte G of four E8M0 scales as a float 2^(e - 127), without e8m0_to_float's special codes: e = 0 gives 0 (not
// 2^-127: a difference below 2^-100 of the products), e = 255 gives infinity (not NaN: still non-finite).
template <int G>
__device__ __forceinline__ float e8m0_fast(uint32_t w) {
  const uint32_t e = G <= 2 ? w << (23 - 8 * G) : w >> (8 * G - 23);
  return __uint_as_float(e & 0x7F800000u);
}

__device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// The 8 FP4 nibbles of w (nibble v = bits 4 v .. 4 v + 3: column v of the word) as f16 pairs times the f16 pair f:
// r[0] = columns 0, 2, r[1] = 1, 3, r[2] = 4, 6, r[3] = 5, 7 (low half first). Each nibble s e1 e0 m becomes the f16
// s 000 e1 e0 m 000000000 = its E2M1 value x 2^-14 (exact, also 0.5 x 2^-14 as a subnormal); f = 2^(14 + scale
// exponent) makes it the weight (the product exact in the fast range, f16 subnormals kept).
__device__ __forceinline__ void fp4x8_as_f16x2(uint32_t w, uint32_t f, uint32_t r[4]) {
  // the f16s' high bytes s 000 e1 e0 m 0: he byte c of nibble 2 c, ho byte c of nibble 2 c + 1 (whose sign already
  // is bit 7 of byte c)
  const uint32_t e2 = (w << 1) & 0x1E1E1E1Eu;        // byte c bits 1..4: nibble 2 c
  const uint32_t he = e2 + 7u * (e2 & 0x10101010u);  // its sign from bit 4 to bit 7
  const uint32_t ho = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
  r[0] = hmul2_u32(__byte_perm(he, 0u, 0x1404u), f);  // bytes 0, he.0, 0, he.1
  r[1] = hmul2_u32(__byte_perm(ho, 0u, 0x1404u), f);
  r[2] = hmul2_u32(__byte_perm(he, 0u, 0x3424u), f);  // bytes 0, he.2, 0, he.3
  r[3] = hmul2_u32(__byte_perm(ho, 0u, 0x3424u), f);
}

// threadIdx.x read where it is used (volatile: the compiler cannot hoist what is computed from it out of a loop).
__device__ __forceinline__ int thread_index() {
  int v;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(v));
  return v;
}

// The wgmma kernel (k_moe_wgmma.cu): whether it runs on the current device (per device, cached; no launch, so also
// while a stream captures), and its launch for the arguments and the grid of moe_tc_big_kernel.
bool wgmma_ok();
void wgmma_launch(bool w13, const BigArgs& A, dim3 grid, cudaStream_t stream);

}  // namespace dsv4::cuda::moe_tc
