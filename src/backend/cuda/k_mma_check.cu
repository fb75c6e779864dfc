// Device check of tc_mma_b against tc_mma (device_fp8_mma.cuh), for tests: the f16 form of the FP8 mma (what sm_90
// runs every e4m3 mma.sync of the expert kernels as) gives what tc_mma gives on the same operands (on sm_90: the two
// f16 mmas ptxas makes of the FP8 mma, without its trailing + 0, whose only effect is -0 -> +0). Every lane of every
// warp draws its A and B registers from random bytes (all e4m3 codes, NaN included, and FP4 nibbles placed by
// fp4_as_e4m3), runs both and counts the output elements that differ other than by the sign of a zero or the bits of
// a NaN.
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/device_fp8_mma.cuh"
#include "backend/cuda/kernels.h"
#include "backend/random_fill.h"

namespace dsv4::cuda {
namespace {

__device__ __forceinline__ bool same_value(float x, float y) {
  return __float_as_uint(x) == __float_as_uint(y) || (x == 0.0f && y == 0.0f) || (isnan(x) && isnan(y));
}

__global__ void mma_check_kernel(uint64_t seed, int rounds, unsigned long long* bad) {
  const uint64_t lane_id = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long n = 0;
  for (int r = 0; r < rounds; ++r) {
    uint32_t w[6];
#pragma unroll
    for (int i = 0; i < 6; ++i) w[i] = uint32_t(random_bits(seed, (lane_id * uint64_t(rounds) + r) * 8 + i));
    uint32_t a[4] = {w[0], w[1], w[2], w[3]};
    if (r % 2) {  // FP4 weights as the expert kernels place them (A), random e4m3 activations (B)
      fp4_as_e4m3(w[0], a[0], a[2]);
      fp4_as_e4m3(w[1], a[1], a[3]);
    }
    float d0[4], d1[4];
    tc_mma(a, w[4], w[5], d0);
    tc_mma_b(a, mma_b_e4m3(w[4], w[5]), d1);
#pragma unroll
    for (int i = 0; i < 4; ++i) n += same_value(d0[i], d1[i]) ? 0 : 1;
  }
  if (n) atomicAdd(bad, n);
}

}  // namespace

int64_t tc_mma_b_mismatches(uint64_t seed, int rounds) {
  cudaFuncAttributes fa{};
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaFuncGetAttributes(&fa, mma_check_kernel) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
      fa.binaryVersion < 89 || major * 10 + minor < 89)
    return -1;  // no FP8 mma on this device or in this binary
  unsigned long long* bad = nullptr;
  if (cudaMalloc(&bad, sizeof *bad) != cudaSuccess) return -1;
  unsigned long long h = 0;
  const bool ok = cudaMemset(bad, 0, sizeof *bad) == cudaSuccess &&
                  (mma_check_kernel<<<64, 256>>>(seed, rounds, bad), cudaGetLastError() == cudaSuccess) &&
                  cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(bad);
  return ok ? int64_t(h) : -1;
}

}  // namespace dsv4::cuda
