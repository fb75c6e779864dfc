// Shared helpers of the GPU tests (tests/gpu, built only with -DDSV4_CUDA=ON): the CPU and CUDA backends, host <->
// device copies, random inputs and weights in the checkpoint formats, and CPU-vs-CUDA comparisons that print one
// line per check (the log scripts/test-gpu.sh keeps under tests/gpu/results/ is the evidence).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdarg>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu_backend.h"
#include "backend/ops.h"
#include "format/numeric.h"

namespace dsv4::test::gpu {

// printf into a std::string (test names and messages; at most 511 characters).
inline std::string strf(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

inline Backend& cpu() { return cpu_backend(); }

// The CUDA backend on cuda:0, or nullptr when this machine has no usable GPU (tests then skip).
inline Backend* cuda() {
  static std::unique_ptr<Backend> be = []() -> std::unique_ptr<Backend> {
    if (cuda_device_count() <= 0) return nullptr;
    return make_backend(Device{DeviceKind::cuda, 0});
  }();
  return be.get();
}

#define DSV4_REQUIRE_GPU()                                    \
  do {                                                        \
    if (::dsv4::test::gpu::cuda() == nullptr) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// ---- copies ------------------------------------------------------------------------------------------------------
template <class T>
Buffer to_device(Backend& be, const std::vector<T>& v) {
  return be.upload_bytes(v.data(), v.size() * sizeof(T), "test input");
}
template <class T>
std::vector<T> to_host(Backend& be, const Buffer& b, size_t n) {
  std::vector<T> v(n);
  be.copy_to_host(v.data(), b.data(), n * sizeof(T));
  return v;
}
template <class T>
std::vector<T> to_host(Backend& be, const T* p, size_t n) {
  std::vector<T> v(n);
  be.copy_to_host(v.data(), p, n * sizeof(T));
  return v;
}
// An output buffer of n elements of T on `be`, filled with a NaN pattern (so unwritten elements are caught).
template <class T>
Buffer out_buffer(Backend& be, size_t n) {
  std::vector<T> init(n);
  std::memset(init.data(), 0xFF, n * sizeof(T));
  return to_device(be, init);
}

// n random token ids in [2, vocab) (ids 0 and 1 are BOS / EOS in the test models).
inline std::vector<int32_t> random_ids(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(2, vocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// ---- random inputs -----------------------------------------------------------------------------------------------
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f, bool bf16 = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16 ? round_to_bf16(d(rng)) : d(rng);
  return v;
}

// A weight in host memory (its own storage) with a WeightView over it.
struct HostWeight {
  std::vector<uint8_t> w, scale;
  WeightView view;
};

// Random weight of the given format and logical shape [rows, cols]: every e4m3 code except NaN, every e2m1 nibble,
// E8M0 scales jittered around 2^-7 (fp8) / 2^-4 (fp4) so products stay O(1). bf16 / f32: N(0, 0.05).
inline HostWeight random_weight(GemmFormat fmt, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  HostWeight h;
  WeightView& v = h.view;
  v.fmt = fmt;
  v.rows = rows;
  v.cols = cols;
  std::normal_distribution<float> nd(0.0f, 0.05f);
  switch (fmt) {
    case GemmFormat::bf16: {
      h.w.resize(size_t(rows * cols) * 2);
      for (int64_t i = 0; i < rows * cols; ++i) {
        const uint16_t b = float_to_bf16_rne(nd(rng));
        std::memcpy(&h.w[size_t(i) * 2], &b, 2);
      }
      break;
    }
    case GemmFormat::f32: {
      h.w.resize(size_t(rows * cols) * 4);
      for (int64_t i = 0; i < rows * cols; ++i) {
        const float f = nd(rng);
        std::memcpy(&h.w[size_t(i) * 4], &f, 4);
      }
      break;
    }
    case GemmFormat::fp8: {
      h.w.resize(size_t(rows * cols));
      for (auto& b : h.w) {
        uint8_t c = uint8_t(rng());
        if ((c & 0x7F) == 0x7F) c ^= 0x01;  // no NaN codes
        b = c;
      }
      v.block_rows = 128;
      v.block_cols = 128;
      const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
      h.scale.resize(size_t(sr * sc));
      for (auto& s : h.scale) s = uint8_t(127 - 7 - int(rng() % 3));
      break;
    }
    case GemmFormat::fp4: {
      h.w.resize(size_t(rows * cols / 2));
      for (auto& b : h.w) b = uint8_t(rng());
      v.block_rows = 1;
      v.block_cols = 32;
      const int64_t sc = (cols + 31) / 32;
      h.scale.resize(size_t(rows * sc));
      for (auto& s : h.scale) s = uint8_t(127 - 4 - int(rng() % 3));
      break;
    }
  }
  v.w = h.w.data();
  v.scale = h.scale.empty() ? nullptr : h.scale.data();
  return h;
}

// ---- comparisons -------------------------------------------------------------------------------------------------
struct DiffStats {
  double max_abs = 0, max_rel = 0, mean_abs = 0;
  int64_t n = 0, n_bad = 0;  // elements compared / outside atol + rtol*|ref|
  int64_t first_bad = -1;
};

inline DiffStats compare(const std::vector<float>& ref, const std::vector<float>& got, double atol, double rtol) {
  DiffStats s;
  s.n = int64_t(std::min(ref.size(), got.size()));
  double sum = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    const double r = ref[size_t(i)], g = got[size_t(i)];
    double d = std::abs(r - g);
    if (std::isnan(d)) d = (std::isnan(r) && std::isnan(g)) ? 0.0 : INFINITY;
    sum += std::isfinite(d) ? d : 0.0;
    s.max_abs = std::max(s.max_abs, d);
    if (std::abs(r) > atol) s.max_rel = std::max(s.max_rel, d / std::abs(r));
    if (!(d <= atol + rtol * std::abs(r))) {
      if (s.first_bad < 0) s.first_bad = i;
      ++s.n_bad;
    }
  }
  if (ref.size() != got.size()) s.n_bad += 1;
  s.mean_abs = s.n ? sum / double(s.n) : 0;
  return s;
}

// Prints "[op] shape: max_abs .. max_rel .. mean_abs .. bad n/N (tol atol+rtol|ref|) PASS|FAIL" and records a test
// failure when any element is outside the tolerance.
inline void expect_close(const std::string& op, const std::string& shape, const std::vector<float>& ref,
                         const std::vector<float>& got, double atol, double rtol) {
  const DiffStats s = compare(ref, got, atol, rtol);
  std::printf("[%s] %s: max_abs %.3g max_rel %.3g mean_abs %.3g bad %lld/%lld (tol %.1g+%.1g|ref|) %s\n", op.c_str(),
              shape.c_str(), s.max_abs, s.max_rel, s.mean_abs, (long long)s.n_bad, (long long)s.n, atol, rtol,
              s.n_bad == 0 ? "PASS" : "FAIL");
  std::fflush(stdout);
  if (s.n_bad) {
    const size_t i = size_t(s.first_bad);
    ADD_FAILURE() << op << " " << shape << ": " << s.n_bad << " of " << s.n << " elements outside tolerance; first at "
                  << i << ": ref " << (i < ref.size() ? ref[i] : NAN) << " got " << (i < got.size() ? got[i] : NAN);
  }
}

}  // namespace dsv4::test::gpu
