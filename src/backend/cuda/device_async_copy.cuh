// Asynchronous global -> shared copies (cp.async, sm_80+) and the shared-memory matrix load ldmatrix, shared by the
// expert kernels that stream weights through a ring in shared memory (k_gemm.cu moe_tc_small_kernel, k_moe_tc.cu),
// on generic pointers and on 32-bit shared-window addresses.
#pragma once
#include <cstdint>

namespace dsv4::cuda {

// The shared-window address of a pointer into shared memory (the overloads below that take a uint32_t destination
// take such an address: kernels that keep a ring's base this way add offsets to it instead of converting each one).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes (both addresses 16-byte aligned), bypassing L1.
__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
#endif
}
__device__ __forceinline__ void cp16(void* dst, const void* src) { cp16(smem_addr(dst), src); }
// 4 bytes (both addresses 4-byte aligned).
__device__ __forceinline__ void cp4(uint32_t dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
#endif
}
__device__ __forceinline__ void cp4(void* dst, const void* src) { cp4(smem_addr(dst), src); }
// Close the calling thread's group of copies issued since the last commit (an empty group is fine).
__device__ __forceinline__ void cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Wait until at most N of the calling thread's committed groups are still pending (other threads' copies need a
// barrier after it: __syncthreads, or __syncwarp when the copies came from the same warp).
template <int N>
__device__ __forceinline__ void cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ldmatrix .x4: lanes 8 j .. 8 j + 7 give the (16-byte aligned) addresses of rows 0..7 of matrix j (8 x 16 bytes);
// lane (g, t) = (lane / 4, lane % 4) receives bytes 4 t .. 4 t + 3 of row g of matrix j in r[j].
__device__ __forceinline__ void ldsm_x4(uint32_t row_addr, uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row_addr));
#else
  r[0] = r[1] = r[2] = r[3] = 0u;
#endif
}
__device__ __forceinline__ void ldsm_x4(const void* row_addr, uint32_t (&r)[4]) { ldsm_x4(smem_addr(row_addr), r); }

}  // namespace dsv4::cuda
