#include "backend/cuda/decode_graph.h"

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda {

DecodeGraphs::~DecodeGraphs() { clear(); }

void DecodeGraphs::clear() {
  if (!graphs_.empty()) {
    be_.activate();
    (void)cudaStreamSynchronize(be_.stream());  // a replay may still be running
  }
  for (auto& [k, g] : graphs_) (void)cudaGraphExecDestroy(g.exec);
  graphs_.clear();
  seen_.clear();
  eager_.clear();
}

void DecodeGraphs::run(const std::vector<int64_t>& step_key, const std::function<void()>& body) {
  be_.activate();
  // the process-wide GEMM modes pick kernels on the host, the PDL switch how they are launched: part of every key
  std::vector<int64_t> key = step_key;
  key.push_back(int64_t(gemm_path()));
  key.push_back(int64_t(deterministic()));
  key.push_back(int64_t(pdl()));
  key.push_back(int64_t(moe_big_kernel()));
  if (eager_.count(key)) {
    body();
    return;
  }
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (seen_.find(key) == seen_.end()) {  // first sighting: eager (allocates workspace chunks, loads kernels)
      if (seen_.size() >= 4 * kMaxGraphs) seen_.clear();
      body();
      seen_.emplace(key, 1);
      return;
    }
    if (graphs_.size() >= kMaxGraphs) {  // replace the least recently used recording
      auto lru = graphs_.begin();
      for (auto g = graphs_.begin(); g != graphs_.end(); ++g)
        if (g->second.last_use < lru->second.last_use) lru = g;
      (void)cudaStreamSynchronize(be_.stream());  // its last replay may still be running
      (void)cudaGraphExecDestroy(lru->second.exec);
      graphs_.erase(lru);
    }
    seen_.erase(key);
    const cudaStream_t s = be_.stream();
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "record forward step (begin capture)");
    bool body_ok = false;
    try {
      body();
      body_ok = true;
    } catch (...) {
    }
    cudaGraph_t g = nullptr;
    const cudaError_t ec = cudaStreamEndCapture(s, &g);
    cudaGraphExec_t ex = nullptr;
    const cudaError_t ei = body_ok && ec == cudaSuccess && g ? cudaGraphInstantiate(&ex, g, 0) : cudaErrorUnknown;
    if (g) (void)cudaGraphDestroy(g);
    if (ei != cudaSuccess) {  // not recordable (or a failing op): run it as is, and never try this key again
      (void)cudaGetLastError();
      if (ex) (void)cudaGraphExecDestroy(ex);
      if (eager_.size() >= 4 * kMaxGraphs) eager_.clear();
      eager_.emplace(key, 1);
      body();  // rethrows what the recording run threw
      return;
    }
    it = graphs_.emplace(key, Recording{ex, 0}).first;
  } else {
    ++replays_;
  }
  it->second.last_use = ++use_;
  check(cudaGraphLaunch(it->second.exec, be_.stream()), "replay forward step");
}

std::unique_ptr<StepGraphs> make_decode_graphs(CudaBackend& be) { return std::make_unique<DecodeGraphs>(be); }

}  // namespace dsv4::cuda
