// One MoE layer whose routed experts are split between the backend's device and the host CPU (issue 11; placement:
// model/expert_placement.h). Per call, on the backend's queue:
//   1. the layer's input rows x [n, D] and the routing (ids, weights [n, k]) are copied to pinned host memory,
//      without waiting (Backend::copy_to_host_async);
//   2. the device runs its resident experts on their pairs (Ops::moe_resident -> one row per pair) and the shared
//      expert, while
//   3. the host waits for the copy only (wait_copies_to_host) and runs the host experts on their pairs
//      (cpu_expert_rows, OpenMP) into pinned memory;
//   4. only those rows (and their pair ids) go back to the device, are scattered into the per-pair rows, and
//      Ops::moe_combine sums every token's slots in ascending (expert id, slot) order, then the shared expert —
//      the order of the unsplit `moe`, so the result does not depend on the placement: rows of host experts are the
//      CPU backend's bitwise, and the whole output equals the unsplit op's wherever the device's expert rows equal
//      the CPU's (the CPU backend; CUDA --deterministic).
// Any routing works (all pairs on one side, duplicates of one expert in a token, every expert). On the CPU backend
// the "device" half is CpuOps and the copies are memcpy: the same machinery, run one half after the other (tests).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/ops.h"

namespace dsv4 {

struct SplitMoeLayer {
  MoeWeights device;                     // device views; host experts' views unbound (shapes kept); + shared
  MoeWeights host;                       // host views of the host experts (the others unbound); no shared
  std::vector<uint8_t> on_host;          // [E] 1 = the host runs it
  const uint8_t* resident = nullptr;     // [E] on the device: 1 = the device runs it (= !on_host)
  int64_t n_host = 0;                    // experts on the host
};

// Totals since the last reset (host clock).
struct SplitMoeStats {
  int64_t calls = 0;                     // split layer calls
  int64_t host_pairs = 0, device_pairs = 0;
  uint64_t to_host_bytes = 0, to_device_bytes = 0;  // PCIe traffic of the split (input rows + routing; rows back)
  double host_s = 0;                     // the host experts' compute
  double wait_s = 0;                     // waiting for the input rows to land on the host
};

class SplitMoe {
 public:
  explicit SplitMoe(Backend& be) : be_(be) {}
  ~SplitMoe();
  SplitMoe(const SplitMoe&) = delete;
  SplitMoe& operator=(const SplitMoe&) = delete;

  // y [n, D] = the layer's MoE output (Ops::moe semantics) for x [n, D], ids / wts [n, k] (device pointers of the
  // backend; ops: the backend's ops or a decorator of them). D = the experts' input width.
  void run(const Ops& ops, const SplitMoeLayer& L, int64_t D, const float* x, int64_t n, const int32_t* ids,
           const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* y);

  const SplitMoeStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  void reserve(size_t bytes);
  Backend& be_;
  void* pin_ = nullptr;  // pinned staging: x, ids, wts, host rows, their pair ids
  size_t pin_bytes_ = 0;
  SplitMoeStats stats_;
};

}  // namespace dsv4
