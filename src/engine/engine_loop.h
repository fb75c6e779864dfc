// EngineLoop: continuous batching over one Model — a loop thread owns the model's state pool (model/state_pool.h),
// the prefix cache (engine/prefix_cache.h) and the scheduler (engine/scheduler.h); requests are submitted and
// cancelled from any thread and stream their generated token ids back (RequestStream). Each loop iteration is one
// scheduler step: restore the snapshots of newly admitted prefix hits, one batched forward of every scheduled chunk
// (Model::forward(const Batch&, ...)), sampling of the sequences whose chunk reached their last token, commit.
//
// Results: a request's tokens are exactly those of the same request run alone (the forward pass is batch and chunk
// invariant, prefix hits restore an exact state, preemption recomputes): bitwise logits on the CPU, hence the same
// greedy tokens, and the same sampled tokens for a seed (one draw per generated token, never repeated on resume).
// Memory: the pool is sized once from state_bytes (--kv-memory) or explicit counts; a full pool makes new work wait
// or preempts (scheduler.h), and a request that cannot fit at all finishes with an error, never a crash.
// Token level only: no text, stop strings or constraints here (the server layer adds them on top, later).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/prefix_cache.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"

namespace dsv4 {

struct EngineLoopOptions {
  int64_t max_running = 8;          // sequences per step (state slots; --parallel)
  int64_t batch_tokens = 512;       // tokens per step (--batch-tokens)
  uint64_t state_bytes = uint64_t(1) << 30;  // slots + pages + snapshots (--kv-memory), used when n_pages == 0
  int64_t n_pages = 0;              // > 0: exactly this many 128-token pages (tests)
  int64_t n_snapshots = -1;         // >= 0: exactly this many snapshots; -1: a quarter of what state_bytes leaves
  int64_t snapshot_interval = 1;    // SchedulerOptions::snapshot_interval
  bool align_chunks = true;         // SchedulerOptions::align_chunks
  int64_t n_ctx = 0;                // positions per request (prompt + generated); 0: the model's context
  int n_threads = 0;                // CPU: OpenMP threads of the loop thread (> 0: set there; 0: the default)
  bool start_thread = true;         // false: no thread, the caller drives step() (tests, benchmarks)
  // Disk tier of the prefix cache (--cache-dir / --cache-size): evicted blocks and snapshots are kept there.
  // Empty: no disk tier.
  std::string cache_dir;
  uint64_t cache_size = uint64_t(16) << 30;
  // Speculative decoding with the MTP module (--spec-draft, engine/spec_decode.h): draft tokens per step, 0 = off,
  // 1 .. StateLayout::kMaxDraft (the model must be loaded with ModelOptions::mtp).
  int spec_draft = 0;
};

struct EngineRequest {
  std::vector<int32_t> prompt;      // token ids, non-empty, BOS included if wanted
  SamplingParams sampling;
  int64_t max_tokens = -1;          // generated tokens at most; -1: until n_ctx
  bool ignore_eos = false;          // keep going after the model's EOS token (benchmarks)
};

enum class StreamEnd { running, stop, length, cancelled, error };
const char* to_string(StreamEnd e);

// The generated tokens of one request, in order (EOS excluded), filled by the loop thread. Thread-safe.
class RequestStream {
 public:
  struct Result {
    StreamEnd end = StreamEnd::running;
    std::string error;              // StreamEnd::error: why
    std::vector<int32_t> tokens;    // every generated token
    int64_t prompt_tokens = 0;
    int64_t cached_tokens = 0;      // prompt tokens reused from the prefix cache (not recomputed)
    int64_t preemptions = 0;
    int64_t drafted_tokens = 0;     // speculative decoding: draft tokens verified
    int64_t accepted_tokens = 0;    // ... and accepted (each saves one target step)
  };
  uint64_t id() const { return id_; }
  // Blocks until tokens beyond the first `have` exist or the request ended; returns the tokens from `have` on
  // (empty: the request ended with no more tokens).
  std::vector<int32_t> next(size_t have) const;
  // Blocks until the request ended.
  Result wait() const;
  bool finished() const;

  explicit RequestStream(uint64_t id) : id_(id) {}
  // Loop side.
  void push(int32_t token);
  void add_spec(int64_t drafted, int64_t accepted);
  void finish(StreamEnd end, std::string error, int64_t prompt_tokens, int64_t cached_tokens, int64_t preemptions);

 private:
  const uint64_t id_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Result r_;
};

class EngineLoop {
 public:
  // Sizes the pool (throws dsv4::Error when state_bytes cannot hold max_running slots and a page each) and starts
  // the loop thread (unless start_thread is false).
  EngineLoop(std::shared_ptr<const Model> model, const EngineLoopOptions& opts = {});
  // Stops the loop; requests still running end as cancelled.
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queue a request. Throws dsv4::Error for an empty prompt, an id outside the vocabulary, a prompt of n_ctx tokens or
  // more, a prompt whose state cannot fit in the pool, or invalid sampling parameters.
  std::shared_ptr<RequestStream> submit(EngineRequest req);
  // Cancel a queued or running request (its stream ends as cancelled within one step). Unknown ids: no-op.
  void cancel(uint64_t id);

  // Manual mode (start_thread == false): take the submitted / cancelled requests and run one step. Returns false
  // when there was nothing to do.
  bool step();
  // Manual mode: step until every request has ended.
  void run_until_idle();

  struct Stats {
    int64_t steps = 0, step_tokens = 0, prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
    int64_t requests_finished = 0, preemptions = 0, running = 0, waiting = 0;
    int64_t drafted_tokens = 0, accepted_tokens = 0;  // speculative decoding
    double forward_seconds = 0;       // forward steps and draft steps
    double draft_seconds = 0;         // of which draft steps (speculative decoding)
    int64_t pool_slots = 0, pool_pages = 0, pool_snapshots = 0;
    uint64_t pool_bytes = 0;
    PrefixCache::Stats cache;
  };
  // As of the end of the last step (or intake). Thread-safe.
  Stats stats() const;
  const Model& model() const { return *model_; }
  int64_t n_ctx() const { return n_ctx_; }

 private:
  struct Live {
    EngineRequest req;
    std::shared_ptr<RequestStream> stream;
    std::unique_ptr<Sampler> sampler;
    int64_t generated = 0;
  };
  void loop();
  void drain_inbox();
  void run_step();
  void end(uint64_t id, StreamEnd e, std::string error = {});
  void publish_stats();  // scheduler / cache counters into stats_ (loop thread)
  // speculative decoding: drafts after a step's tokens (snapshots: those taken after each one's last position)
  void draft_next(const std::vector<uint64_t>& ids, const std::map<uint64_t, int64_t>& snapshots);

  std::shared_ptr<const Model> model_;
  EngineLoopOptions opts_;
  int64_t n_ctx_ = 0;
  StatePool pool_;
  std::unique_ptr<PrefixCache> cache_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<class SpecDecoder> spec_;  // --spec-draft > 0
  std::map<uint64_t, Live> live_;    // loop thread only

  mutable std::mutex mu_;            // inbox, stats, stop flag
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, Live>> inbox_;
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;
  bool stop_ = false;
  Stats stats_;
  std::thread thread_;
};

}  // namespace dsv4
