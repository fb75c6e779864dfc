#include "backend/cuda/gemm_path.h"

#include <atomic>

#include "core/error.h"

namespace dsv4::cuda {

namespace {
std::atomic<int> g_path{static_cast<int>(GemmPath::auto_)};
std::atomic<int> g_last{static_cast<int>(GemmPath::auto_)};
std::atomic<bool> g_det{false};
std::atomic<int> g_moe_big{static_cast<int>(MoeBigKernel::mma)};  // wgmma: opt-in until run on a GPU
}  // namespace

void set_gemm_path(GemmPath p) { g_path.store(static_cast<int>(p)); }
GemmPath gemm_path() { return static_cast<GemmPath>(g_path.load()); }
void set_moe_big_kernel(MoeBigKernel k) { g_moe_big.store(static_cast<int>(k)); }
MoeBigKernel moe_big_kernel() { return static_cast<MoeBigKernel>(g_moe_big.load()); }
void set_deterministic(bool on) { g_det.store(on); }
bool deterministic() { return g_det.load(); }
GemmPath last_gemm_path() { return static_cast<GemmPath>(g_last.load()); }

const char* gemm_path_name(GemmPath p) {
  switch (p) {
    case GemmPath::auto_: return "auto";
    case GemmPath::simt: return "simt";
    case GemmPath::small_m: return "small_m";
    case GemmPath::cublaslt: return "cublaslt";
    case GemmPath::gemv: return "gemv";
  }
  return "?";
}

namespace gemm_internal {

void fail_msg(const std::string& msg) { throw Error(msg); }
void note_path(GemmPath p) { g_last.store(static_cast<int>(p)); }

}  // namespace gemm_internal
}  // namespace dsv4::cuda
