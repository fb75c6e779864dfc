// Recorded forward steps (CUDA graphs, issue 9): a batch-1 decode step queues ~1,100 small kernels, so launch
// latency and the gaps between kernels cost as much as the kernels. A backend that can record the work it queues
// records one step per step shape and replays the recording instead of launching kernel by kernel.
//
// The caller names everything the recorded work depends on besides the contents of device memory in `key`: the
// step's shape (array sizes, counts, scalars its host code passes to ops), the device buffers it reaches (state pool
// buffers, the workspace mark it starts from) and the process-wide modes. Work whose key matches a recording is the
// same sequence of kernels with the same arguments, reading the (new) contents of the same buffers, so a replay
// gives bitwise the result of running `body` (numerics never change). Host code inside `body` must not read device
// results (no copies to the host, no synchronization).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace dsv4 {

class Backend;

class StepGraphs {
 public:
  virtual ~StepGraphs() = default;
  // Queue the work of `body` for a step of shape `key`: a key seen twice before replays its recording (body is not
  // called); the first sighting runs body as is (it warms the workspace and lazily loaded kernels), the second
  // records body's work, then replays it.
  virtual void run(const std::vector<int64_t>& key, const std::function<void()>& body) = 0;
  // Recordings held / replays so far (for logs and tests).
  virtual size_t recorded() const = 0;
  virtual int64_t replays() const = 0;
  // Drop every recording (e.g. when the buffers named by keys are freed and may come back at the same addresses).
  virtual void clear() = 0;
};

// Step recording on `be` (the CUDA backend); nullptr where the backend has none (the CPU, test doubles).
std::unique_ptr<StepGraphs> make_step_graphs(Backend& be);

}  // namespace dsv4
