// An upload queue (backend/upload_queue.h) for the CPU backend that runs every copy as LATE as the protocol allows:
// at filled() of its slot (or synchronize()), never at copy(). Ops run at once on the CPU, so an op that reads a
// slot without a filled() before it reads stale bytes (the previous chunk's, or never written memory), and the
// bitwise checks of the staged path fail: the CPU-only stand-in for a GPU's copy stream racing ahead of or behind
// the compute stream. (The protocol checks of UploadQueue itself catch the opposite race: a copy into a slot still
// being read.)
#pragma once
#include <cstring>
#include <vector>

#include "backend/upload_queue.h"

namespace dsv4::test {

class DeferredUploadQueue final : public UploadQueue {
 public:
  explicit DeferredUploadQueue(int slots) : UploadQueue(slots) {}
  void synchronize() override { run_slot(-1); }
  double copy_seconds() override { return 0; }
  int64_t deferred_copies() const { return deferred_; }

 protected:
  void do_copy(int slot, void* dst, const void* src, size_t bytes) override {
    pending_.push_back({slot, dst, src, bytes});
    ++deferred_;
  }
  void do_filled(int slot) override { run_slot(slot); }
  void do_consumed(int) override {}

 private:
  struct Copy {
    int slot;
    void* dst;
    const void* src;
    size_t bytes;
  };
  void run_slot(int slot) {  // slot < 0: all
    std::vector<Copy> keep;
    for (const Copy& c : pending_) {
      if (slot < 0 || c.slot == slot) std::memcpy(c.dst, c.src, c.bytes);
      else keep.push_back(c);
    }
    pending_.swap(keep);
  }
  std::vector<Copy> pending_;
  int64_t deferred_ = 0;
};

}  // namespace dsv4::test
