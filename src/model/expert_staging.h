// Streaming a split layer's host experts to the device for calls with many tokens (issue 11; model/split_moe.h).
//
// In prefill every routed expert of a split layer gets many rows, and the host CPU computing all of them costs far
// more than moving their bytes over PCIe once (llama.cpp does the same for large batches). For a call of at least
// min_tokens tokens SplitMoe therefore runs the layer's host experts on the device too:
//   * the layer's host experts (ascending id) are cut into chunks that fit one of two device staging slots (the
//     plan, StagePlan, made once at load: attach());
//   * chunk c is copied into slot c mod 2 on the backend's upload queue (backend/upload_queue.h: CUDA's copy
//     stream) while the device computes chunk c - 1 from the other slot; events order the two queues, the host never
//     waits (uploads only wait for the slot's previous chunk to be computed, so they also run ahead across layers);
//   * each chunk runs through Ops::moe_resident with a mask of the chunk's experts and expert tables whose views
//     point into the slot, writing the same per-pair rows as the device's resident experts; SplitMoe's one
//     Ops::moe_combine then sums them in (expert id, slot) order.
// So the output is what the device computes with every expert resident: the same kernels, bitwise the CPU's in
// CUDA's deterministic mode and on the CPU backend (where the "device" is the CPU and the copies are memcpy: the same
// plan and protocol, tested without a GPU). Host expert memory is page-locked at load (pin_host) when it is at most
// half of the host's memory, for full PCIe speed; otherwise the copies go through the driver's staging (slower).
//
// Cost model of the default threshold (auto_stage_min_tokens): a call of n tokens routes n k h / E pairs to the h
// host experts of a layer (uniform routing). The CPU computes each in t_pair = macs / kCpuExpertMacsPerS; staging
// moves the h experts once, h bytes / PCIe bandwidth, whatever n. Staging is cheaper from
//   n* = E bytes kCpuExpertMacsPerS / (k macs pcie_bytes_per_s)     (h cancels)
// V4-Flash (E 256, k 6, 13.37 MB and 25.2 M multiply-adds per expert): n* = 227 tokens with pinned memory at
// 25 GB/s. The CPU side never hides behind the device in prefill (the device waits for its rows), while the uploads
// overlap the device's other work, so the model errs towards the CPU.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/ops.h"
#include "backend/upload_queue.h"

namespace dsv4 {

struct SplitMoeLayer;

// Throughputs of the cost model above. CPU: the 16-core Xeon of the GPU machine computes a V4-Flash (token, expert)
// pair of its routed experts in ~100 us (98-114 us measured in bench/results/bench-model-flash43-hybrid-h200-
// 20261201-82e3b5e-*.json: 34,414 pairs in 3.93 s, 230,169 in 22.6 s), 25.2 M multiply-adds each. PCIe: host ->
// device from page-locked memory, the low end of PCIe 4.0 / 5.0 x16 (25-50 GB/s); memory that is not page-locked
// goes through the driver's bounce buffers at about a third of that.
constexpr double kCpuExpertMacsPerS = 2.5e11;
constexpr double kPinnedUploadBytesPerS = 25e9;
constexpr double kPageableUploadBytesPerS = 8e9;

// n* of the cost model (>= 1) for a layer of n_experts experts, top_k per token, expert_bytes and expert_macs
// (multiply-adds of one row through w1, w3 and w2) per expert.
int64_t auto_stage_min_tokens(int64_t n_experts, int64_t top_k, double expert_bytes, double expert_macs,
                              double upload_bytes_per_s);

// Whether `pinned_bytes` of host experts may be page-locked on a host of `host_bytes` RAM: at most three quarters of
// it, leaving at least 16 GiB pageable for the OS and the rest of the process (page-locked memory cannot be swapped or
// reclaimed). V4-Flash on an 80 GB GPU puts ~70-76 GiB of experts on a 125 GiB host: pinned, the staged copies run at
// ~55 GB/s instead of ~8 (bench/results/NOTES-gpu-speed.md, 2026-12-07). host_bytes 0 (unknown): no limit.
bool pin_host_fits(double pinned_bytes, double host_bytes);

// One split layer as the staged path runs it.
struct StagePlan {
  static constexpr int kSlots = 2;
  struct Copy {
    size_t offset = 0;          // in the slot
    const void* src = nullptr;  // host memory
    size_t bytes = 0;
  };
  struct Chunk {
    std::vector<Copy> copies;                           // coalesced where source and slot are both contiguous
    uint64_t bytes = 0;                                 // bytes copied
    int64_t n_experts = 0;
    Buffer mask;                                        // [E] bytes on the device: 1 = an expert of this chunk
    std::array<std::vector<ExpertView>, kSlots> views;  // per slot: device views; the chunk's point into the slot
    std::array<Buffer, kSlots> tables;                  // the same on the device
  };
  const void* owner = nullptr;  // the ExpertStaging whose slots the views point into
  std::vector<Chunk> chunks;
  uint64_t bytes = 0;           // every host expert of the layer
};

// Totals since the last reset.
struct StagingStats {
  int64_t calls = 0, chunks = 0;
  uint64_t bytes = 0;  // host expert bytes copied to the device
  double copy_s = 0;   // the time the copies took (the copy queue's clock; CPU: memcpy time)
};

class ExpertStaging {
 public:
  static constexpr int kSlots = StagePlan::kSlots;
  // Calls of at least min_tokens tokens stage (<= 0: none, until set_min_tokens); each slot holds slot_bytes (at
  // least one expert).
  ExpertStaging(Backend& be, int64_t min_tokens, size_t slot_bytes);
  ~ExpertStaging();
  ExpertStaging(const ExpertStaging&) = delete;
  ExpertStaging& operator=(const ExpertStaging&) = delete;

  // L.stage := L's host experts in chunks. The first call allocates the slots (dsv4::Error when the device has not
  // the memory). L's views stay valid as long as this object (and L.host's memory).
  void attach(SplitMoeLayer& L);
  // Page-locks the host memory of the attached layers' host experts (Backend::pin_host) unless pin_host_fits() says
  // no or the backend is the CPU; returns whether it is pinned. Once, after the last attach().
  bool pin_host();
  bool pinned() const { return pinned_; }

  int64_t min_tokens() const { return min_tokens_; }
  void set_min_tokens(int64_t n) { min_tokens_ = n; }
  size_t slot_bytes() const { return slot_bytes_; }
  // Whether a call of n_tok tokens of L stages.
  bool applies(const SplitMoeLayer& L, int64_t n_tok) const;
  // Facts of the attached experts for the cost model (0 before the first attach).
  int64_t n_experts() const { return n_experts_; }
  double expert_bytes() const { return expert_bytes_; }
  double expert_macs() const { return expert_macs_; }

  // o_pairs[p] = the row of pair p = t * k + i for every pair routed to a host expert of L (Ops::moe_resident
  // semantics; the others untouched), computed on the device from the staged experts. x [n, D], ids / wts [n, k],
  // o_pairs [n k, D]: device memory.
  void run(const Ops& ops, const SplitMoeLayer& L, const float* x, int64_t n, const int32_t* ids, const float* wts,
           int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* o_pairs);

  StagingStats stats();
  void reset_stats();
  // Tests: copies through another queue (e.g. one that runs each copy as late as the protocol allows).
  void set_upload_queue(std::unique_ptr<UploadQueue> q);

  // Device bytes of the slots for experts of expert_bytes bytes each (what --gpu-experts auto leaves free).
  static size_t device_bytes(size_t slot_bytes, uint64_t expert_bytes);

 private:
  uint8_t* slot(int s) { return slots_[size_t(s)].as<uint8_t>(); }
  Backend& be_;
  int64_t min_tokens_;
  size_t slot_bytes_;
  std::array<Buffer, kSlots> slots_;
  std::unique_ptr<UploadQueue> queue_;
  int next_ = 0;                                           // the slot the next call's first chunk goes to
  std::vector<std::pair<const uint8_t*, size_t>> ranges_;  // host expert memory of the attached layers
  std::vector<const void*> pins_;                          // page-locked ranges (unpinned in the destructor)
  bool pinned_ = false, pin_tried_ = false;
  int64_t n_experts_ = 0;
  double expert_bytes_ = 0, expert_macs_ = 0;
  StagingStats stats_;
  double copy_s0_ = 0;  // queue seconds at the last reset
};

}  // namespace dsv4
