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
//
// Calls with many tokens (prefill; SplitMoeOptions::stage_min_tokens) skip steps 1, 3 and 4: the layer's host
// experts are streamed to the device and run there (model/expert_staging.h), into the same per-pair rows, and the
// same combine follows. No host wait: the result is the device's with every expert resident.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/ops.h"

namespace dsv4 {

struct StagePlan;  // model/expert_staging.h
class ExpertStaging;

struct SplitMoeLayer {
  MoeWeights device;                     // device views; host experts' views unbound (shapes kept); + shared
  MoeWeights host;                       // host views of the host experts (the others unbound); no shared
  std::vector<uint8_t> on_host;          // [E] 1 = the host runs it
  const uint8_t* resident = nullptr;     // [E] on the device: 1 = the device runs it (= !on_host)
  int64_t n_host = 0;                    // experts on the host
  std::shared_ptr<const StagePlan> stage;  // the staged path's chunks (SplitMoe::attach), or null
};

struct SplitMoeOptions {
  // Calls of at least this many tokens stream the layer's host experts to the device and run them there
  // (model/expert_staging.h); 0: never; < 0: the cost model's choice, set by finish().
  int64_t stage_min_tokens = 0;
  size_t stage_slot_bytes = size_t(256) << 20;  // each of the two device staging slots (at least one expert)
};

// Totals since the last reset (host clock, but staged_copy_s).
struct SplitMoeStats {
  int64_t calls = 0;                     // split layer calls (both paths)
  int64_t host_pairs = 0, device_pairs = 0;  // of the calls run by the CPU
  uint64_t to_host_bytes = 0, to_device_bytes = 0;  // PCIe traffic of the split (input rows + routing; rows back)
  double host_s = 0;                     // the host experts' compute
  double wait_s = 0;                     // waiting for the input rows to land on the host
  int64_t staged_calls = 0;              // of calls: those whose host experts ran on the device (staged)
  int64_t staged_chunks = 0;             // slot-sized chunks they streamed
  uint64_t staged_bytes = 0;             // host expert bytes streamed to the device
  double staged_copy_s = 0;              // the time those copies took (the copy queue's clock)
};

class SplitMoe {
 public:
  explicit SplitMoe(Backend& be, const SplitMoeOptions& o = {});
  ~SplitMoe();
  SplitMoe(const SplitMoe&) = delete;
  SplitMoe& operator=(const SplitMoe&) = delete;

  // Prepares a split layer for the staged path when staging is on (L.stage; allocates the staging slots at the
  // first layer). Every layer this object runs with staging goes through here once, before finish().
  void attach(SplitMoeLayer& L);
  // After the last attach(): page-locks the attached host experts for the staged copies and resolves an automatic
  // threshold (top_k: experts per token) by the cost model of model/expert_staging.h.
  void finish(int64_t top_k);

  // y [n, D] = the layer's MoE output (Ops::moe semantics) for x [n, D], ids / wts [n, k] (device pointers of the
  // backend; ops: the backend's ops or a decorator of them). D = the experts' input width.
  void run(const Ops& ops, const SplitMoeLayer& L, int64_t D, const float* x, int64_t n, const int32_t* ids,
           const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* y);

  // The staged path's threshold (0: off), slot size, and whether the host experts are page-locked.
  int64_t stage_min_tokens() const;
  size_t stage_slot_bytes() const;
  bool host_experts_pinned() const;
  // The staging (null when off), e.g. for tests to swap its upload queue.
  ExpertStaging* staging() { return staging_.get(); }
  // Device bytes the staging of `o` takes for routed experts of expert_bytes each (0 when off).
  static size_t staging_device_bytes(const SplitMoeOptions& o, uint64_t expert_bytes);

  SplitMoeStats stats() const;
  void reset_stats();

 private:
  void reserve(size_t bytes);
  void run_staged(const Ops& ops, const SplitMoeLayer& L, int64_t D, const float* x, int64_t n, const int32_t* ids,
                  const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* y);
  Backend& be_;
  SplitMoeOptions opts_;
  std::unique_ptr<ExpertStaging> staging_;  // when opts_.stage_min_tokens != 0
  void* pin_ = nullptr;  // pinned staging: x, ids, wts, host rows, their pair ids
  size_t pin_bytes_ = 0;
  SplitMoeStats stats_;
};

}  // namespace dsv4
