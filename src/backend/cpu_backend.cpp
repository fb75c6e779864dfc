#include "backend/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include <fmt/format.h>

#include "backend/gemm.h"
#include "backend/parallel.h"
#include "core/error.h"

namespace dsv4 {

CpuBackend::CpuBackend(int n_threads) {
  if (n_threads > 0) set_num_threads(n_threads);
}

CpuBackend::~CpuBackend() { release_workspace(); }

std::string CpuBackend::description() const {
  return fmt::format("cpu ({} threads, {})", max_threads(), simd_level_name(simd_level()));
}

MemoryInfo CpuBackend::memory() const {
  MemoryInfo m;
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemTotal:") m.total = kb * 1024;
    if (key == "MemAvailable:") m.free = kb * 1024;
  }
  return m;
}

void* CpuBackend::alloc(size_t bytes, const char* what) {
  const size_t n = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, n == 0 ? 64 : n);
  if (!p) fail("out of host memory: {} needs {} bytes ({:.2f} GiB)", what, bytes, double(bytes) / double(1ull << 30));
  return p;
}

void CpuBackend::free(void* p) noexcept { std::free(p); }

void CpuBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuBackend::copy_on_device(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}

CpuBackend& cpu_backend() {
  static CpuBackend be;
  return be;
}

}  // namespace dsv4
