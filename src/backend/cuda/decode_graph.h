// CUDA graphs of forward steps (backend/step_graphs.h): one instantiated graph per step key, recorded by stream
// capture on the backend's stream and replayed with one cudaGraphLaunch.
#pragma once
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <vector>

#include "backend/step_graphs.h"

namespace dsv4::cuda {

class CudaBackend;

class DecodeGraphs final : public StepGraphs {
 public:
  explicit DecodeGraphs(CudaBackend& be) : be_(be) {}
  ~DecodeGraphs() override;
  void run(const std::vector<int64_t>& key, const std::function<void()>& body) override;
  size_t recorded() const override { return graphs_.size(); }
  int64_t replays() const override { return replays_; }
  void clear() override;

  // Recordings kept at most; a new one beyond this replaces the least recently used (shapes of a long decode come
  // back in cycles of 4 positions; a ragged batch or speculative verify steps have more, but a bounded set).
  static constexpr size_t kMaxGraphs = 64;

 private:
  struct Recording {
    cudaGraphExec_t exec = nullptr;
    int64_t last_use = 0;  // use_ at its last replay (or its recording)
  };
  CudaBackend& be_;
  std::map<std::vector<int64_t>, Recording> graphs_;
  int64_t use_ = 0;
  std::map<std::vector<int64_t>, int> seen_;   // keys run eagerly once, not recorded yet
  std::map<std::vector<int64_t>, int> eager_;  // keys whose recording failed: always run eagerly
  int64_t replays_ = 0;
};

std::unique_ptr<StepGraphs> make_decode_graphs(CudaBackend& be);

}  // namespace dsv4::cuda
