// FP8 tensor-core building blocks shared by the expert kernels (k_gemm.cu, k_moe_tc.cu): FP4 nibbles placed as e4m3
// bytes, four E8M0 scale bytes of a word as floats, and one mma.sync m16n8k32 e4m3 x e4m3 -> fp32 (sm_89+).
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

// Byte s of four E8M0 scales (w) as a float, e8m0_to_float's special codes (0: 2^-127, 0xFF: NaN) from sp (bytes
// 0xFF where w's byte is 0 or 0xFF: __vcmpeq4, once per word).
template <int S>
__device__ __forceinline__ float e8m0_byte(uint32_t w, uint32_t sp) {
  const uint32_t e = S <= 2 ? w << (23 - 8 * S) : w >> (8 * S - 23);    // byte S at the exponent field
  const uint32_t q = S <= 2 ? sp << (22 - 8 * S) : sp >> (8 * S - 22);  // its special flag at bit 22
  return __uint_as_float((e & 0x7F800000u) | (q & 0x00400000u));
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

}  // namespace dsv4::cuda
