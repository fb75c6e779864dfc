#include "backend/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include <fmt/format.h>

#include "backend/exp_array.h"
#include "backend/gemm.h"
#include "backend/random_fill.h"
#include "backend/parallel.h"
#include "core/error.h"

namespace dsv4 {

CpuBackend::CpuBackend(int n_threads) {
  if (n_threads > 0) set_num_threads(n_threads);
  exp_array_vectorized();  // its one-time self-check (~2 ms) at load rather than in the first forward step
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

WeightView CpuBackend::add_head_layout(const WeightView& resident, std::vector<Buffer>& storage) {
  const int64_t words = bf16_panel_words(resident);
  if (words == 0) return resident;
  Buffer b(*this, size_t(words) * sizeof(uint32_t), "the lm head's panel copy");
  pack_bf16_panels(resident, b.as<uint32_t>());
  WeightView v = resident;
  v.panels = b.as<uint32_t>();
  storage.push_back(std::move(b));
  return v;
}

void CpuBackend::fill_random(void* p, size_t bytes, RandomFill kind, float param, uint64_t seed) {
  uint8_t* d = static_cast<uint8_t*>(p);
  const int64_t n = kind == RandomFill::bf16 ? int64_t(bytes / 2) : int64_t(bytes);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = random_bits(seed, uint64_t(i));
    switch (kind) {
      case RandomFill::e4m3: d[i] = random_e4m3(r); break;
      case RandomFill::fp4_pairs: d[i] = uint8_t(r); break;
      case RandomFill::e8m0: d[i] = random_e8m0(r, param); break;
      case RandomFill::bf16: {
        const uint16_t h = random_bf16(r, param);
        std::memcpy(d + 2 * i, &h, 2);
        break;
      }
    }
  }
}

CpuBackend& cpu_backend() {
  static CpuBackend be;
  return be;
}

}  // namespace dsv4
