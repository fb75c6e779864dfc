// The CUDA backend: one GPU, one stream, device-resident weights (uploaded once), CudaOps.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {

class CudaOps;

class CudaBackend final : public Backend {
 public:
  // Throws dsv4::Error when the driver is missing, no GPU is present or `index` does not exist.
  explicit CudaBackend(int index);
  ~CudaBackend() override;

  Device device() const override { return Device{DeviceKind::cuda, index_}; }
  std::string description() const override;
  const Ops& ops() const override;
  MemoryInfo memory() const override;
  double fp8_peak_flops() const override;
  void* alloc(size_t bytes, const char* what) override;
  void free(void* p) noexcept override;
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy_on_device(void* dst, const void* src, size_t bytes) override;
  void synchronize() override;
  void* alloc_pinned(size_t bytes, const char* what) override;
  void free_pinned(void* p) noexcept override;
  void copy_to_host_async(void* dst, const void* src, size_t bytes) override;
  void wait_copies_to_host() override;
  std::unique_ptr<UploadQueue> make_upload_queue(int slots) override;  // cuda_upload_queue.h
  bool pin_host(const void* p, size_t bytes, std::string* why) override;
  void unpin_host(const void* p) noexcept override;
  void fill_random(void* p, size_t bytes, RandomFill kind, float param, uint64_t seed) override;
  WeightView upload(const WeightView& host, std::vector<Buffer>& storage) override;
  WeightView adopt(const WeightView& resident, std::vector<Buffer>& storage) override;
  using Backend::upload;
  size_t resident_bytes(const WeightView& host) const override;
  double timeline_start(int n_markers, double* uncertainty) override;
  void timeline_mark(int i, int queue) override;
  void timeline_read(int n, double* t) override;

  cudaStream_t stream() const { return stream_; }
  // The second stream of Ops::branch_* and of moe's shared expert, with its fork / join events (kernels.h).
  const SideStream& side() const { return side_; }
  int index() const { return index_; }
  // Make this backend's GPU current on the calling thread (every entry point does it).
  void activate() const;

 private:
  int index_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t to_host_ = nullptr;  // recorded after each copy_to_host_async
  SideStream side_;
  // timeline markers (backend.h): the origin and one timing event per marker index, created on first use, reused
  cudaEvent_t tl_origin_ = nullptr;
  std::vector<cudaEvent_t> tl_events_;
  double tl_origin_host_ = 0;
  std::unique_ptr<CudaOps> ops_;
  std::string name_;
  size_t total_ = 0;
  int cc_major_ = 0, cc_minor_ = 0;
};

// Usable CUDA devices (0 when there is no driver or GPU; never throws).
int device_count();
std::unique_ptr<Backend> make_cuda_backend(int index);

// Throws dsv4::Error "<what>: <CUDA error text> (<hint>)" when err != cudaSuccess.
void check(cudaError_t err, const char* what);

}  // namespace dsv4::cuda
