// Run-time CPU feature detection (the default build is not -march=native; kernels are chosen per feature set).
#pragma once

namespace dsv4 {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;    // the AVX2 kernel set needs all three
  bool avx512f = false, avx512bw = false, avx512vl = false;  // the AVX-512 kernel set needs all three (+ AVX2 set)
  bool avx512vbmi = false;
};

// Detected once (thread-safe static).
const CpuFeatures& cpu_features();
// "avx512f avx512bw ... avx2 fma f16c" — the detected features, for logs and `dsv4 bench`.
const char* cpu_features_string();

}  // namespace dsv4
