// Warpgroup MMA (wgmma, sm_90a only) building blocks of the prefill expert kernel (k_moe_wgmma.cu): the 64-bit
// shared-memory matrix descriptor of a K-major tile in the 128-byte swizzle, the fences, and one
// m64n128k16 (and m64n32k16) f16 x f16 -> fp32 MMA with both operands in shared memory.
//
// The 128-byte swizzle, K-major (PTX ISA, "Asynchronous Warpgroup Level Matrix Shared Memory Layout"): a tile is
// rows of 128 bytes (64 f16 of K), 8 rows (1,024 bytes, 1,024-aligned) form one swizzle atom, and the 16-byte chunk
// c of row r sits at chunk c ^ (r % 8) of that row. The descriptor of such a tile: start address, the stride byte
// offset (SBO) = 1,024 bytes between consecutive groups of 8 rows, the leading byte offset unused (1), base offset
// 0 (atoms 1,024-aligned), swizzle mode 1 (128 bytes). A k16 step s (32 bytes) of a 64-column half starts at byte
// 32 s of the rows: the hardware applies the XOR to the address bits, so the start address simply moves by 32.
//
// The accumulator fragment of m64nNk16 (f32): warp w of the warpgroup holds rows 16 w .. 16 w + 15; lane (g, t) =
// (lane / 4, lane % 4) holds d[4 j + v0 + 2 v1] = D[16 w + g + 8 v1][8 j + 2 t + v0] (j = 0 .. N / 8 - 1, as the
// m16n8 fragment of mma.sync per 8 columns).
#pragma once
#include <cstdint>

namespace dsv4::cuda {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSV4_WGMMA 1
#endif

// Descriptor of a K-major, 128-byte-swizzled tile starting at shared-window address addr (see above).
__host__ __device__ constexpr uint64_t wgmma_desc_sw128(uint32_t addr) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

#ifdef DSV4_WGMMA
// Orders this thread's register and shared-memory accesses before the wgmmas that follow (required before the first
// wgmma and whenever an accumulator was written by other instructions).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Makes this thread's generic-proxy writes to shared memory (st.shared, cp.async) visible to the async proxy that
// wgmma reads its operands through (before the barrier that hands the tile over).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accesses of v across this point (after wgmma_wait: the accumulators are final only
// there, though the asm that issued the wgmma already named them as outputs).
__device__ __forceinline__ void reg_fence(float& v) { asm volatile("" : "+f"(v)::"memory"); }

// d (+)= A x B^T: A [64 x 16] and B [128 x 16] f16 (K-major, descriptors da, db); scale_d = 0 ignores d's old value.
__device__ __forceinline__ void wgmma_m64n128k16_f16(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
}
// The same for B [32 x 16] (the other-block path's per-group products, 16 accumulators).
__device__ __forceinline__ void wgmma_m64n32k16_f16(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d));
}
#endif

}  // namespace dsv4::cuda
