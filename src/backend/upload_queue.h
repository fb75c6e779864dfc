// Host -> device copies on a second queue beside the ops (issue 11: model/expert_staging.h streams routed experts
// that live in host memory through it and runs them on the device). The copies fill a fixed set of device regions,
// the `slots` (staging buffers the caller owns); in each slot, copies and the ops that read them take turns:
//
//   copy(s, dst, src, bytes) ... queue copies into slot s (dst inside it); they return without waiting; src must
//                                stay valid and unchanged until the copies have run (synchronize(), or the end of
//                                the ops that read the slot)
//   filled(s)                    ops queued after this see every copy into s queued before it
//   ... ops that read slot s ...
//   consumed(s)                  copies into s queued after this wait for every op queued before it
//
// so a backend with a real second queue (CUDA: a copy stream and events, cuda/cuda_upload_queue.h) fills one slot
// while the device computes from another, and the host never waits. A copy into a slot that was filled and not
// consumed since would race with the ops reading it: copy() throws dsv4::Error ("internal: ...") on every backend,
// so the CPU-only tests catch a broken protocol too.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsv4 {

class Backend;

class UploadQueue {
 public:
  explicit UploadQueue(int slots);
  virtual ~UploadQueue() = default;
  UploadQueue(const UploadQueue&) = delete;
  UploadQueue& operator=(const UploadQueue&) = delete;

  int slots() const { return int(reading_.size()); }
  void copy(int slot, void* dst, const void* src, size_t bytes);
  void filled(int slot);
  void consumed(int slot);
  // Wait until every queued copy has landed.
  virtual void synchronize() = 0;
  // Bytes queued so far, and the seconds the copies took (the device's clock where it has one: only finished
  // copies count).
  uint64_t bytes() const { return bytes_; }
  virtual double copy_seconds() = 0;

 protected:
  virtual void do_copy(int slot, void* dst, const void* src, size_t bytes) = 0;
  virtual void do_filled(int slot) = 0;
  virtual void do_consumed(int slot) = 0;

 private:
  void check_slot(int slot, const char* what) const;
  std::vector<uint8_t> reading_;  // per slot: filled and not consumed since (ops may be reading it)
  uint64_t bytes_ = 0;
};

// The queue of a backend without a second queue: every copy is Backend::copy_to_device, queued in order with the
// ops (the CPU backend: a memcpy at once), so filled() and consumed() have nothing to order.
class InOrderUploadQueue final : public UploadQueue {
 public:
  InOrderUploadQueue(Backend& be, int slots) : UploadQueue(slots), be_(be) {}
  void synchronize() override {}
  double copy_seconds() override { return seconds_; }

 protected:
  void do_copy(int slot, void* dst, const void* src, size_t bytes) override;
  void do_filled(int) override {}
  void do_consumed(int) override {}

 private:
  Backend& be_;
  double seconds_ = 0;  // host time spent in copy_to_device
};

}  // namespace dsv4
