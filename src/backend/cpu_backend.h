// The CPU backend: host memory, CpuOps (the reference implementation of every op), OpenMP threads.
#pragma once
#include "backend/backend.h"
#include "backend/cpu_ops.h"

namespace dsv4 {

class CpuBackend : public Backend {
 public:
  // n_threads > 0 sets the OpenMP pool size (process-wide, as the engine has one CPU pool); <= 0 keeps it.
  explicit CpuBackend(int n_threads = 0);
  ~CpuBackend() override;

  Device device() const override { return Device{DeviceKind::cpu, 0}; }
  std::string description() const override;
  const Ops& ops() const override { return ops_; }
  MemoryInfo memory() const override;
  bool compact_state_rows() const override { return true; }
  void* alloc(size_t bytes, const char* what) override;
  void free(void* p) noexcept override;
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy_on_device(void* dst, const void* src, size_t bytes) override;
  void synchronize() override {}
  void fill_random(void* p, size_t bytes, RandomFill kind, float param, uint64_t seed) override;
  WeightView upload(const WeightView& host, std::vector<Buffer>&) override { return host; }
  // A BF16 head with cols % 32 == 0: a panel copy (gemm.h pack_bf16_panels) in `storage`; other heads unchanged.
  WeightView add_head_layout(const WeightView& resident, std::vector<Buffer>& storage) override;
  using Backend::upload;

 private:
  CpuOps ops_;
};

// A process-wide CPU backend (tests, tools, and models loaded without naming a backend).
CpuBackend& cpu_backend();

}  // namespace dsv4
