// The process-wide switch of Programmatic Dependent Launch (kernels.h, device_pdl.cuh).
#include <cuda_runtime.h>

#include <atomic>

#include "backend/cuda/kernels.h"

namespace dsv4::cuda {
namespace {

std::atomic<bool> g_pdl{true};

// Compiled like every kernel of the backend: its binary version is the one this device runs.
__global__ void pdl_probe_kernel() {}

}  // namespace

void set_pdl(bool on) { g_pdl.store(on); }
bool pdl() { return g_pdl.load(); }

bool pdl_active() {
  if (!g_pdl.load(std::memory_order_relaxed)) return false;
  static std::atomic<int> cached[64] = {};  // per device: 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  int c = cached[dev].load(std::memory_order_relaxed);
  if (c == 0) {
    // the device schedules dependent launches (sm_90+) and the kernels were built for it (griddepcontrol in them)
    int major = 0;
    cudaFuncAttributes fa{};
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    major >= 9 && cudaFuncGetAttributes(&fa, pdl_probe_kernel) == cudaSuccess &&
                    fa.binaryVersion >= 90;
    if (!ok) (void)cudaGetLastError();
    c = ok ? 1 : 2;
    cached[dev].store(c, std::memory_order_relaxed);
  }
  return c == 1;
}

}  // namespace dsv4::cuda
