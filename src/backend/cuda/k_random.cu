// Dummy-weight generation on the device (Backend::fill_random): the generators of backend/random_fill.h, one
// thread per element (grid-stride).
#include "backend/cuda/kernels.h"
#include "backend/random_fill.h"

namespace dsv4::cuda {
namespace {

__global__ void fill_random_kernel(uint8_t* d, int64_t n, int kind, float param, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = random_bits(seed, uint64_t(i));
    switch (kind) {
      case 0: d[i] = random_e4m3(r); break;
      case 1: d[i] = uint8_t(r); break;
      case 2: d[i] = random_e8m0(r, param); break;
      default: reinterpret_cast<uint16_t*>(d)[i] = random_bf16(r, param); break;
    }
  }
}

}  // namespace

void fill_random(void* p, size_t bytes, int kind, float param, uint64_t seed, cudaStream_t stream) {
  const int64_t n = kind == 3 ? int64_t(bytes / 2) : int64_t(bytes);
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  fill_random_kernel<<<unsigned(blocks), 256, 0, stream>>>(static_cast<uint8_t*>(p), n, kind, param, seed);
}

}  // namespace dsv4::cuda
