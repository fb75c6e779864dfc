// The CUDA backend's upload queue (backend/upload_queue.h): host -> device copies on a copy stream of their own,
// ordered against the backend's compute stream by events only (no host waits):
//   copies into slot s run as one batch on the copy stream; the batch closes (its `filled` event is recorded on the
//   copy stream) at filled(s) or when a copy into another slot comes, so that a later batch never delays it;
//   filled(s): the compute stream waits for the last closed batch of s;
//   consumed(s): records s's `consumed` event on the compute stream; the next batch of s makes the copy stream
//   wait for it before its first copy.
// Each batch is timed by an event pair on the copy stream (copy_seconds(): the finished batches, collected without
// waiting). Copies from page-locked host memory (Backend::pin_host) run at full PCIe speed, others through the
// driver's staging (correct, slower, and they may block the calling thread while they run). The queue refuses to
// run while the compute stream is being recorded into a CUDA graph (a recording must not capture copies from host
// memory that is only valid now).
#pragma once
#include <cuda_runtime_api.h>

#include <vector>

#include "backend/upload_queue.h"

namespace dsv4::cuda {

class CudaBackend;

class CudaUploadQueue final : public UploadQueue {
 public:
  CudaUploadQueue(const CudaBackend& be, int slots);
  ~CudaUploadQueue() override;
  void synchronize() override;
  double copy_seconds() override;

 protected:
  void do_copy(int slot, void* dst, const void* src, size_t bytes) override;
  void do_filled(int slot) override;
  void do_consumed(int slot) override;

 private:
  struct Timing {
    cudaEvent_t start = nullptr, end = nullptr;
  };
  void close_batch(int slot);
  Timing take_timing();
  void collect();  // adds the finished batches' times to seconds_, without waiting

  const CudaBackend& be_;
  cudaStream_t copy_ = nullptr;
  std::vector<cudaEvent_t> filled_, consumed_;  // per slot
  std::vector<uint8_t> open_;                   // per slot: a batch of copies is open (its events not recorded)
  std::vector<uint8_t> wait_;                   // per slot: the next batch waits for consumed_[slot]
  std::vector<Timing> open_timing_;             // per slot: the open batch's timing events
  std::vector<Timing> pending_, spare_;         // closed batches not yet collected (in stream order); reusable
  double seconds_ = 0;
};

}  // namespace dsv4::cuda
