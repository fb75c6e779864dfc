#include "backend/cuda/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_upload_queue.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace dsv4::cuda {

namespace {
double gib(size_t b) { return double(b) / double(size_t(1) << 30); }

size_t scale_bytes(const WeightView& w) {
  if (w.fmt == GemmFormat::fp8) {
    const int64_t r = (w.rows + w.block_rows - 1) / w.block_rows, c = (w.cols + w.block_cols - 1) / w.block_cols;
    return size_t(r * c) * (w.scale_f32 ? 4 : 1);
  }
  if (w.fmt == GemmFormat::fp4) return size_t(w.rows * ((w.cols + 31) / 32));
  return 0;
}
}  // namespace

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  const char* hint = "";
  switch (err) {
    case cudaErrorMemoryAllocation: hint = " (out of GPU memory: use a smaller --ctx, fewer layers, or --device cpu)"; break;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice: hint = " (no usable NVIDIA driver/GPU: check nvidia-smi, or use --device cpu)"; break;
    default: hint = " (a GPU error: rerun with -v; if it persists, report it with the command line)"; break;
  }
  fail("CUDA {}: {}{}", what, cudaGetErrorString(err), hint);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

CudaBackend::CudaBackend(int index) : index_(index) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail("--device cuda:{}: no CUDA device is usable ({}); check the NVIDIA driver with nvidia-smi, or use --device cpu",
         index, cudaGetErrorString(e));
  }
  if (index < 0 || index >= n)
    fail("--device cuda:{}: this machine has {} CUDA device(s) (cuda:0 ... cuda:{}); use one of them or --device cpu",
         index, n, n - 1);
  check(cudaSetDevice(index), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  name_ = prop.name;
  total_ = prop.totalGlobalMem;
  cc_major_ = prop.major;
  cc_minor_ = prop.minor;
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreateWithFlags(&to_host_, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaStreamCreateWithFlags(&side_.stream, cudaStreamNonBlocking), "cudaStreamCreate (side)");
  check(cudaEventCreateWithFlags(&side_.fork, cudaEventDisableTiming), "cudaEventCreate (fork)");
  check(cudaEventCreateWithFlags(&side_.join, cudaEventDisableTiming), "cudaEventCreate (join)");
  ops_ = std::make_unique<CudaOps>(*this);
}

CudaBackend::~CudaBackend() {
  activate();
  if (stream_) (void)cudaStreamSynchronize(stream_);
  if (side_.stream) (void)cudaStreamSynchronize(side_.stream);
  release_workspace();
  if (to_host_) (void)cudaEventDestroy(to_host_);
  for (cudaEvent_t e : tl_events_) (void)cudaEventDestroy(e);
  if (tl_origin_) (void)cudaEventDestroy(tl_origin_);
  if (side_.fork) (void)cudaEventDestroy(side_.fork);
  if (side_.join) (void)cudaEventDestroy(side_.join);
  if (side_.stream) (void)cudaStreamDestroy(side_.stream);
  if (stream_) (void)cudaStreamDestroy(stream_);
}

void CudaBackend::activate() const { (void)cudaSetDevice(index_); }

std::string CudaBackend::description() const {
  return fmt::format("cuda:{} {}, {:.1f} GiB, sm_{}{}", index_, name_, gib(total_), cc_major_, cc_minor_);
}

const Ops& CudaBackend::ops() const { return *ops_; }

// Hopper (sm_90): 4,096 dense FP8 flop per clock per SM (H100 SXM: 132 SMs x 1.83 GHz = 989 TFLOP/s as NVIDIA
// states it), at the device's peak clock as the driver reports it (1.98 GHz on the lent H100s: a stricter bound).
// Other architectures: not known here (0).
double CudaBackend::fp8_peak_flops() const {
  if (cc_major_ != 9) return 0.0;
  activate();
  int sms = 0, khz = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index_) != cudaSuccess ||
      cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, index_) != cudaSuccess)
    return 0.0;
  return double(sms) * double(khz) * 1e3 * 4096.0;
}

MemoryInfo CudaBackend::memory() const {
  activate();
  MemoryInfo m;
  check(cudaMemGetInfo(&m.free, &m.total), "cudaMemGetInfo");
  return m;
}

void* CudaBackend::alloc(size_t bytes, const char* what) {
  activate();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t fr = 0, tot = 0;
    (void)cudaMemGetInfo(&fr, &tot);
    fail("out of GPU memory on cuda:{}: {} needs {} bytes ({:.2f} GiB), {:.2f} GiB of {:.2f} GiB free; use a smaller "
         "--ctx, or --device cpu",
         index_, what, bytes, gib(bytes), gib(fr), gib(tot));
  }
  return p;
}

void CudaBackend::free(void* p) noexcept {
  if (!p) return;
  activate();
  (void)cudaFree(p);
}

void CudaBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  activate();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "copy to device");
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  activate();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
  check(cudaStreamSynchronize(stream_), "synchronize (copy to host)");
}

void CudaBackend::copy_on_device(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  activate();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy on device");
}

void CudaBackend::synchronize() {
  activate();
  check(cudaStreamSynchronize(stream_), "synchronize");
  check(cudaGetLastError(), "kernel launch");
}

void* CudaBackend::alloc_pinned(size_t bytes, const char* what) {
  activate();
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail("out of page-locked host memory: {} needs {} bytes ({:.2f} GiB): {}", what, bytes, gib(bytes),
         cudaGetErrorString(e));
  }
  return p;
}

void CudaBackend::free_pinned(void* p) noexcept {
  if (!p) return;
  activate();
  (void)cudaFreeHost(p);
}

void CudaBackend::copy_to_host_async(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  activate();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
  check(cudaEventRecord(to_host_, stream_), "cudaEventRecord");
}

void CudaBackend::wait_copies_to_host() {
  activate();
  check(cudaEventSynchronize(to_host_), "synchronize (copy to host)");
}

std::unique_ptr<UploadQueue> CudaBackend::make_upload_queue(int slots) {
  return std::make_unique<CudaUploadQueue>(*this, slots);
}

bool CudaBackend::pin_host(const void* p, size_t bytes, std::string* why) {
  if (p == nullptr || bytes == 0) return false;
  activate();
  // read-only where the device supports it: the mapped checkpoint is PROT_READ, and the device only reads
  int ro = 0;
  if (cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, index_) != cudaSuccess) {
    (void)cudaGetLastError();
    ro = 0;
  }
  const unsigned flags = cudaHostRegisterPortable | (ro ? cudaHostRegisterReadOnly : 0u);
  const cudaError_t e = cudaHostRegister(const_cast<void*>(p), bytes, flags);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = cudaGetErrorString(e);
    return false;
  }
  return true;
}

void CudaBackend::unpin_host(const void* p) noexcept {
  if (p == nullptr) return;
  activate();
  if (cudaHostUnregister(const_cast<void*>(p)) != cudaSuccess) (void)cudaGetLastError();
}

void CudaBackend::fill_random(void* p, size_t bytes, RandomFill kind, float param, uint64_t seed) {
  activate();
  cuda::fill_random(p, bytes, int(kind), param, seed, stream_);
  check(cudaGetLastError(), "fill_random");
}

size_t CudaBackend::resident_bytes(const WeightView& h) const {
  size_t b = size_t(h.rows * h.row_bytes()) + scale_bytes(h);
  b += weight_aux_bytes(h);
  return b;
}

WeightView CudaBackend::upload(const WeightView& h, std::vector<Buffer>& weights_) {
  WeightView d = h;
  if (!h.w) return d;
  const size_t wb = size_t(h.rows * h.row_bytes());
  weights_.push_back(upload_bytes(h.w, wb, "weights"));
  d.w = weights_.back().as<uint8_t>();
  const size_t sb = scale_bytes(h);
  if (sb && h.scale) {
    weights_.push_back(upload_bytes(h.scale, sb, "weight scales"));
    d.scale = weights_.back().as<uint8_t>();
  }
  return adopt(d, weights_);
}

WeightView CudaBackend::adopt(const WeightView& resident, std::vector<Buffer>& weights_) {
  WeightView d = resident;
  d.aux = nullptr;
  if (!d.w) return d;
  const size_t ab = weight_aux_bytes(d);
  if (ab) {
    activate();
    weights_.emplace_back(*this, ab, "weight scales");
    build_weight_aux(d, weights_.back().data(), stream_);
    check(cudaGetLastError(), "build weight data");
    d.aux = weights_.back().data();
  }
  return d;
}

// Timeline markers (backend.h). The origin is an event recorded on the idle main stream; its device time lies
// between the host times just before the record and just after the wait for it, so the origin's host time is their
// middle, uncertain by half their distance (a few microseconds).
double CudaBackend::timeline_start(int n_markers, double* uncertainty) {
  activate();
  check(cudaStreamSynchronize(side_.stream), "synchronize (timeline)");
  synchronize();
  if (!tl_origin_) check(cudaEventCreate(&tl_origin_), "cudaEventCreate (timeline)");
  while (tl_events_.size() < size_t(std::max(n_markers, 0))) {
    cudaEvent_t e = nullptr;
    check(cudaEventCreate(&e), "cudaEventCreate (timeline)");
    tl_events_.push_back(e);
  }
  using clock = std::chrono::steady_clock;
  const auto h0 = clock::now();
  check(cudaEventRecord(tl_origin_, stream_), "cudaEventRecord (timeline)");
  check(cudaEventSynchronize(tl_origin_), "synchronize (timeline)");
  const auto h1 = clock::now();
  const double a = std::chrono::duration<double>(h0.time_since_epoch()).count();
  const double b = std::chrono::duration<double>(h1.time_since_epoch()).count();
  if (uncertainty) *uncertainty = 0.5 * (b - a);
  tl_origin_host_ = 0.5 * (a + b);
  return tl_origin_host_;
}

void CudaBackend::timeline_mark(int i, int queue) {
  if (i < 0) fail("internal: timeline marker {}", i);
  activate();
  const cudaStream_t s = queue == 1 ? side_.stream : stream_;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(s, &cs), "timeline marker");
  if (cs != cudaStreamCaptureStatusNone)
    fail("a timeline marker cannot be recorded in a recorded step (CUDA graph capture): trace eager steps only");
  while (tl_events_.size() <= size_t(i)) {
    cudaEvent_t e = nullptr;
    check(cudaEventCreate(&e), "cudaEventCreate (timeline)");
    tl_events_.push_back(e);
  }
  check(cudaEventRecord(tl_events_[size_t(i)], s), "cudaEventRecord (timeline)");
}

void CudaBackend::timeline_read(int n, double* t) {
  if (n < 0 || size_t(n) > tl_events_.size() || !tl_origin_)
    fail("internal: {} timeline markers read, {} made", n, tl_events_.size());
  activate();
  for (int i = 0; i < n; ++i) {
    check(cudaEventSynchronize(tl_events_[size_t(i)]), "synchronize (timeline)");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, tl_origin_, tl_events_[size_t(i)]), "timeline marker time");
    t[i] = tl_origin_host_ + double(ms) * 1e-3;
  }
}

std::unique_ptr<Backend> make_cuda_backend(int index) { return std::make_unique<CudaBackend>(index); }

}  // namespace dsv4::cuda
