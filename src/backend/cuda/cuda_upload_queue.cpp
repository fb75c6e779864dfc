// CudaUploadQueue (cuda_upload_queue.h): a copy stream, per-slot filled / consumed events, timed batches.
#include "backend/cuda/cuda_upload_queue.h"

#include <cstddef>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

namespace dsv4::cuda {

CudaUploadQueue::CudaUploadQueue(const CudaBackend& be, int slots)
    : UploadQueue(slots), be_(be), filled_(size_t(slots), nullptr), consumed_(size_t(slots), nullptr),
      open_(size_t(slots), 0), wait_(size_t(slots), 0), open_timing_(size_t(slots)) {
  be_.activate();
  try {
    check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate (uploads)");
    for (int s = 0; s < slots; ++s) {
      check(cudaEventCreateWithFlags(&filled_[size_t(s)], cudaEventDisableTiming), "cudaEventCreate (uploads)");
      check(cudaEventCreateWithFlags(&consumed_[size_t(s)], cudaEventDisableTiming), "cudaEventCreate (uploads)");
    }
  } catch (...) {
    for (cudaEvent_t e : filled_)
      if (e) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : consumed_)
      if (e) (void)cudaEventDestroy(e);
    if (copy_) (void)cudaStreamDestroy(copy_);
    throw;
  }
}

CudaUploadQueue::~CudaUploadQueue() {
  be_.activate();
  if (copy_) (void)cudaStreamSynchronize(copy_);
  auto destroy = [](const Timing& t) {
    if (t.start) (void)cudaEventDestroy(t.start);
    if (t.end) (void)cudaEventDestroy(t.end);
  };
  for (size_t s = 0; s < open_.size(); ++s)
    if (open_[s]) destroy(open_timing_[s]);
  for (const Timing& t : pending_) destroy(t);
  for (const Timing& t : spare_) destroy(t);
  for (cudaEvent_t e : filled_)
    if (e) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : consumed_)
    if (e) (void)cudaEventDestroy(e);
  if (copy_) (void)cudaStreamDestroy(copy_);
  (void)cudaGetLastError();
}

CudaUploadQueue::Timing CudaUploadQueue::take_timing() {
  collect();
  if (!spare_.empty()) {
    const Timing t = spare_.back();
    spare_.pop_back();
    return t;
  }
  Timing t;
  check(cudaEventCreate(&t.start), "cudaEventCreate (upload timing)");
  const cudaError_t e = cudaEventCreate(&t.end);
  if (e != cudaSuccess) {
    (void)cudaEventDestroy(t.start);
    check(e, "cudaEventCreate (upload timing)");
  }
  return t;
}

void CudaUploadQueue::collect() {
  size_t done = 0;
  for (; done < pending_.size(); ++done) {
    const cudaError_t e = cudaEventQuery(pending_[done].end);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not yet" is no error (every op checks its own launch right after it)
      break;
    }
    check(e, "upload queue (copy timing)");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, pending_[done].start, pending_[done].end), "upload queue (copy timing)");
    seconds_ += double(ms) * 1e-3;
    spare_.push_back(pending_[done]);
  }
  pending_.erase(pending_.begin(), pending_.begin() + std::ptrdiff_t(done));
}

void CudaUploadQueue::close_batch(int s) {
  check(cudaEventRecord(filled_[size_t(s)], copy_), "upload queue (filled)");
  check(cudaEventRecord(open_timing_[size_t(s)].end, copy_), "upload queue (copy timing)");
  pending_.push_back(open_timing_[size_t(s)]);
  open_timing_[size_t(s)] = Timing{};
  open_[size_t(s)] = 0;
}

void CudaUploadQueue::do_copy(int s, void* dst, const void* src, size_t bytes) {
  be_.activate();
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(be_.stream(), &cs), "upload queue (capture status)");
  if (cs != cudaStreamCaptureStatusNone)
    fail("internal: host -> device uploads (expert staging) inside a recorded CUDA graph step");
  for (int t = 0; t < slots(); ++t)
    if (t != s && open_[size_t(t)]) close_batch(t);
  if (!open_[size_t(s)]) {
    if (wait_[size_t(s)]) {  // the ops that read the slot's previous contents come first
      check(cudaStreamWaitEvent(copy_, consumed_[size_t(s)], 0), "upload queue (wait for consumed)");
      wait_[size_t(s)] = 0;
    }
    open_timing_[size_t(s)] = take_timing();
    open_[size_t(s)] = 1;
    check(cudaEventRecord(open_timing_[size_t(s)].start, copy_), "upload queue (copy timing)");
  }
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_), "upload queue (copy to device)");
}

void CudaUploadQueue::do_filled(int s) {
  be_.activate();
  if (open_[size_t(s)]) close_batch(s);
  check(cudaStreamWaitEvent(be_.stream(), filled_[size_t(s)], 0), "upload queue (wait for filled)");
}

void CudaUploadQueue::do_consumed(int s) {
  be_.activate();
  check(cudaEventRecord(consumed_[size_t(s)], be_.stream()), "upload queue (consumed)");
  wait_[size_t(s)] = 1;
}

void CudaUploadQueue::synchronize() {
  be_.activate();
  check(cudaStreamSynchronize(copy_), "upload queue (synchronize)");
}

double CudaUploadQueue::copy_seconds() {
  be_.activate();
  collect();
  return seconds_;
}

}  // namespace dsv4::cuda
