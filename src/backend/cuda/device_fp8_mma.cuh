// Tensor-core building blocks of the expert kernels (k_gemm.cu; k_moe_tc.cu takes mma_f16_acc) and their check
// (k_mma_check.cu): FP4 nibbles placed as e4m3 bytes or as f16 values, four E8M0 scale bytes of a word as floats, one
// accumulating f16 mma.sync, and one mma.sync m16n8k32 e4m3 x e4m3 -> fp32 (sm_89+), also as the two f16 mmas sm_90
// runs it as (tc_mma_b, tc_mma_f16_pair).
#pragma once
#include <cstdint>

namespace dsv4::cuda {

// The 8 FP4 nibbles of w (low nibble = even column) as e4m3 bytes: nibble s|e1 e0 m -> byte s 0 0 e1 e0 m 0 0 (= the
// E2M1 value times 2^-6, exact); ev holds columns 0, 2, 4, 6, od columns 1, 3, 5, 7.
__device__ __forceinline__ void fp4_as_e4m3(uint32_t w, uint32_t& ev, uint32_t& od) {
  const uint32_t o = w >> 4;
  ev = ((w << 4) & 0x80808080u) | ((w << 2) & 0x1C1C1C1Cu);
  od = ((o << 4) & 0x80808080u) | ((o << 2) & 0x1C1C1C1Cu);
}

// Byte s (0..3) of four E8M0 scales (w) as a float 2^(e - 127) without e8m0_to_float's special codes: e = 0 gives 0
// (not 2^-127), e = 255 infinity (not NaN: non-finite either way). Once s is a constant: one ALU operation (an AND,
// or for byte 3 a byte permute) and one left shift (which the compiler may run on the FMA pipe).
__device__ __forceinline__ float e8m0_byte_fast(uint32_t w, int s) {
  if (s < 3) return __uint_as_float((w << (23 - 8 * s)) & 0x7F800000u);  // byte s at the exponent field
  return __uint_as_float(__byte_perm(w, 0u, 0x4443) << 23);  // (as (w >> 1) & mask it would be two ALU operations)
}

// (a & m) | (b & ~m) in one LOP3. (Written in C, the compiler narrows m by the bits of b it knows to be zero and then
// needs two.)
__device__ __forceinline__ uint32_t lop3_select(uint32_t a, uint32_t b, uint32_t m) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;\n" : "=r"(d) : "r"(a), "r"(b), "r"(m));
  return d;
}

// The 8 FP4 nibbles of w (low nibble = even column) as f16 pairs of columns 0, 2 | 1, 3 | 4, 6 | 5, 7 (the order of
// tc_mma_f16_pair's operands) by bit placement, the E2M1 values times 2^-14 exactly: nibble
// s|e1 e0 m becomes the f16 bits s 000 e1 e0 m 0000000 00, exponent field e1 e0 and mantissa m / 2, i.e.
// (1 + m / 2) 2^(e - 15) for e > 0 and m 2^-15 (an f16 subnormal) for e = 0. First the f16 high bytes
// s 0 0 0 e1 e0 m 0 of the even nibbles (ev: byte b is column 2 b's) and of the odd ones (od: column 2 b + 1's),
// then each pair by a byte permute that puts two of them over zero low bytes: 3 LOP3, 3 shifts (2 of them left: the
// compiler may make them multiplies on the FMA pipe), 4 PRMT; no conversion instruction.
__device__ __forceinline__ void fp4_as_f16x2_bits(uint32_t w, uint32_t (&r)[4]) {
  // the signs (bits 3, 7 of every byte), through the LOP3 helper so that the compiler keeps s << 4 a shift of s
  // instead of masking w << 4 anew
  const uint32_t s = lop3_select(w, 0u, 0x88888888u);
  const uint32_t ev = lop3_select(w << 1, s << 4, 0x0E0E0E0Eu);  // magnitude bits 0..2 -> 1..3, sign 3 -> 7
  const uint32_t od = lop3_select(w >> 3, s, 0x0E0E0E0Eu);       // magnitude bits 4..6 -> 1..3, sign 7 stays
  r[0] = __byte_perm(ev, 0u, 0x1404);  // columns 0, 2: bytes 0, 1 of ev over zero bytes
  r[1] = __byte_perm(od, 0u, 0x1404);  // 1, 3
  r[2] = __byte_perm(ev, 0u, 0x3424);  // 4, 6: bytes 2, 3
  r[3] = __byte_perm(od, 0u, 0x3424);  // 5, 7
}

__device__ __forceinline__ void tc_mma(const uint32_t a[4], uint32_t b0, uint32_t b1, float d[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
#else
  d[0] = d[1] = d[2] = d[3] = 0.0f;
  __trap();  // the launchers check the device and the binary first
#endif
}

// tc_mma with B given once for several A's (mma_b_e4m3), in the form the target's mma takes. sm_90 has no FP8
// mma.sync: ptxas (CUDA 13.0, sm_90a) runs tc_mma there as two m16n8k16 f16 mmas with fp32 accumulation over the
// codes converted to f16 (exact): first bytes 0, 1 of every A and B register (with a zero accumulator), then bytes
// 2, 3 onto that result, then d = 0 + d (an FADD per element: it only turns a -0 sum into +0). tc_mma_b issues the
// same two mmas on the same f16 registers without that add, and converts B once per call of mma_b_e4m3 instead of
// per A. So its d equals tc_mma's bit for bit except that a zero may keep its sign -0; callers that add d (times
// anything finite) into sums that start at +0 give identical results (x + -0 == x + +0 for every x but -0, and such a
// sum is never -0). Elsewhere (sm_89, sm_100+: FP8 mma.sync in hardware) it is tc_mma itself.
struct MmaB {
  uint32_t r[4];  // sm_90: f16 pairs of b0 bytes 0-1, b1 bytes 0-1, b0 bytes 2-3, b1 bytes 2-3; else b0, b1, -, -
};

// Bytes 0, 1 (HI: 2, 3) of four e4m3 codes as an f16 pair (exact; sm_89+).
template <bool HI>
__device__ __forceinline__ uint32_t e4m3x2_as_f16x2(uint32_t w) {
  uint32_t h = 0u;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // the half taken by splitting the register (ptxas reads it in place: no shift)
  if constexpr (HI)
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, h; }\n" : "=r"(h) : "r"(w));
  else
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, l; }\n" : "=r"(h) : "r"(w));
#endif
  return h;
}

__device__ __forceinline__ MmaB mma_b_e4m3(uint32_t b0, uint32_t b1) {
  MmaB b;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  b.r[0] = e4m3x2_as_f16x2<false>(b0), b.r[1] = e4m3x2_as_f16x2<false>(b1);
  b.r[2] = e4m3x2_as_f16x2<true>(b0), b.r[3] = e4m3x2_as_f16x2<true>(b1);
#else
  b.r[0] = b0, b.r[1] = b1, b.r[2] = b.r[3] = 0u;
#endif
  return b;
}

// d = A (e4m3, tc_mma's layout) x B over 32 columns (see MmaB).
__device__ __forceinline__ void tc_mma_b(const uint32_t a[4], const MmaB& b, float d[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  uint32_t lo[4], hi[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) lo[i] = e4m3x2_as_f16x2<false>(a[i]), hi[i] = e4m3x2_as_f16x2<true>(a[i]);
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(lo[0]), "r"(lo[1]), "r"(lo[2]), "r"(lo[3]), "r"(b.r[0]), "r"(b.r[1]), "f"(0.0f));
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(hi[0]), "r"(hi[1]), "r"(hi[2]), "r"(hi[3]), "r"(b.r[2]), "r"(b.r[3]));
#else
  tc_mma(a, b.r[0], b.r[1], d);
#endif
}

// d += A B, one mma.sync m16n8k16 f16 x f16 -> fp32 accumulator (sm_80+; the launchers check the device first):
// a[0..3] rows g, g + 8 at k positions 2 t, 2 t + 1 and + 8 (ldmatrix x4 order), b0 / b1 column g at k positions
// 2 t, 2 t + 1 / + 8.
__device__ __forceinline__ void mma_f16_acc(const uint32_t a[4], uint32_t b0, uint32_t b1, float d[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// tc_mma on f16 operands, the two mmas ptxas runs it as on sm_90 (CUDA 13.0, sm_90a) without the final + 0 (as
// tc_mma_b): lo holds bytes 0, 1 of tc_mma's A registers as f16 pairs and hi bytes 2, 3 (e4m3x2_as_f16x2<false /
// true> of a[0..3]); b is MmaB::r of sm_90 (mma_b_e4m3) or f16 pairs of the same values. On sm_90, 0 + d equals tc_mma's d bit for
// bit; on other targets (sm_89 / sm_100+, FP8 mma in hardware) it is the same products summed by the f16 mma (the
// fp32 accumulation may round differently). sm_80+.
__device__ __forceinline__ void tc_mma_f16_pair(const uint32_t lo[4], const uint32_t hi[4], const uint32_t b[4],
                                                float d[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(lo[0]), "r"(lo[1]), "r"(lo[2]), "r"(lo[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f));
  mma_f16_acc(hi, b[2], b[3], d);
#else
  d[0] = d[1] = d[2] = d[3] = 0.0f;
  __trap();  // the launchers check the device and the binary first
#endif
}

}  // namespace dsv4::cuda
