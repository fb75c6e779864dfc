// Ops::prefetch on CUDA: start moving a weight's bytes from HBM into the L2 cache. A decode step runs long stretches
// of latency-bound kernels (hc_pre, norms, rope, the attention of one token, routing) that leave the memory bus idle;
// the large GEMVs after them then read their weights from L2 (lower latency per load, so the same loads in flight
// stream faster). One thread per 64 KiB issues a bulk L2 prefetch (sm_90: cp.async.bulk.prefetch.L2, no data comes
// back to the SM) and the kernel ends at once; older GPUs get the per-line prefetch instruction. Nothing is written,
// so no result changes.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace dsv4::cuda {

namespace {

constexpr int64_t kChunk = 64 << 10;  // bytes one thread prefetches
constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(const uint8_t* p, int64_t bytes) {
  const int64_t off = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * kChunk;
  if (off >= bytes) return;
  const int64_t n = (bytes - off < kChunk ? bytes - off : kChunk) & ~int64_t(15);  // a multiple of 16 bytes
  if (n <= 0) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(uint32_t(n)) : "memory");
#else
  for (int64_t i = 0; i < n; i += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off + i));
#endif
}

void prefetch_bytes(const void* p, int64_t bytes, cudaStream_t stream) {
  // the bulk copy needs a 16-byte aligned start: skip the first bytes up to one
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), a16 = (a + 15) & ~uintptr_t(15);
  bytes -= int64_t(a16 - a);
  if (p == nullptr || bytes < 16) return;
  const int64_t threads = (bytes + kChunk - 1) / kChunk;
  l2_prefetch_kernel<<<unsigned((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      reinterpret_cast<const uint8_t*>(a16), bytes);
}

}  // namespace

void prefetch(const WeightView& W, cudaStream_t stream) {
  if (!W.bound()) return;
  prefetch_bytes(W.w, W.rows * W.row_bytes(), stream);
  if (W.fmt == GemmFormat::fp4 && W.scale)  // one E8M0 byte per 32 columns per row: 1/16 of the weight's bytes
    prefetch_bytes(W.scale, W.rows * ((W.cols + 31) / 32), stream);
}

}  // namespace dsv4::cuda
