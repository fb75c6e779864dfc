// The upload queue's protocol checks and the in-order queue (upload_queue.h).
#include "backend/upload_queue.h"

#include "backend/backend.h"
#include "core/error.h"

namespace dsv4 {

UploadQueue::UploadQueue(int slots) {
  if (slots < 1) fail("internal: an upload queue needs at least one slot (got {})", slots);
  reading_.assign(size_t(slots), 0);
}

void UploadQueue::check_slot(int slot, const char* what) const {
  if (slot < 0 || slot >= slots()) fail("internal: upload queue {}: slot {} of {}", what, slot, slots());
}

void UploadQueue::copy(int slot, void* dst, const void* src, size_t bytes) {
  check_slot(slot, "copy");
  if (reading_[size_t(slot)])
    fail("internal: upload queue: a copy into slot {} while ops may still read it (filled without consumed)", slot);
  if (bytes == 0) return;
  do_copy(slot, dst, src, bytes);
  bytes_ += bytes;
}

void UploadQueue::filled(int slot) {
  check_slot(slot, "filled");
  do_filled(slot);
  reading_[size_t(slot)] = 1;
}

void UploadQueue::consumed(int slot) {
  check_slot(slot, "consumed");
  do_consumed(slot);
  reading_[size_t(slot)] = 0;
}

void InOrderUploadQueue::do_copy(int, void* dst, const void* src, size_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  be_.copy_to_device(dst, src, bytes);
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace dsv4
