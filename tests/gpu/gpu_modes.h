// Shared by the GPU tests: scopes that switch the CUDA backend's numerics modes (backend/cuda/gemm_path.h), and one
// loaded model per (name, numerics, device) for the whole test program.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "backend/cuda/gemm_path.h"
#include "gpu_test_util.h"
#include "model/model.h"

namespace dsv4::test::gpu {

// The deterministic mode for a scope: every kernel in the CPU's summation order (the fast decode kernels off).
struct DeterministicScope {
  DeterministicScope() { dsv4::cuda::set_deterministic(true); }
  ~DeterministicScope() { dsv4::cuda::set_deterministic(false); }
};

// The deterministic mode and the same (SIMT) GEMM kernel for every token count, for a scope.
struct DeterministicGemm {
  DeterministicGemm() {
    dsv4::cuda::set_gemm_path(dsv4::cuda::GemmPath::simt);
    dsv4::cuda::set_deterministic(true);  // also the CPU-order decode kernels of hc_pre / sparse_attention
  }
  ~DeterministicGemm() {
    dsv4::cuda::set_gemm_path(dsv4::cuda::GemmPath::auto_);
    dsv4::cuda::set_deterministic(false);
  }
};

// models/dsv4-demo, or tests/data/<name>.
inline std::string model_dir(const std::string& name) {
  if (name == "dsv4-demo") return std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo";
  return std::string(DSV4_SOURCE_DIR) + "/tests/data/" + name;
}

// One loaded model per (name, numerics, device) for the whole program.
inline std::shared_ptr<const Model> cached_model(const std::string& name, Numerics num, bool on_cuda) {
  // both backends first: function statics die in reverse order of construction, so the models go before them
  (void)cuda();
  (void)cpu();
  static std::map<std::tuple<std::string, int, bool>, std::shared_ptr<const Model>> cache;
  auto& m = cache[{name, int(num), on_cuda}];
  if (!m) {
    ModelOptions o;
    o.numerics = num;
    o.backend = on_cuda ? cuda() : &cpu();
    m = Model::load(model_dir(name), o);
  }
  return m;
}

}  // namespace dsv4::test::gpu
