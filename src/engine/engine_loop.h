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
// Token level: no text here. Per request, on the loop thread, a TokenConstraint (structured output, reasoning
// budgets) masks the logits before sampling and is told the sampled token, and log-probabilities of the raw logits
// can be recorded with each token; both only read the request's own logits, so batch invariance holds. Text-level
// stops (stop strings) are the caller's: it cancels the request once its text matched (engine/loop_generation.h).
// The model is any BatchModel (engine/batch_model.h): the DeepSeek V4 Model, or a test double.
#pragma once
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/batch_model.h"
#include "engine/disk_cache.h"
#include "engine/prefix_cache.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "sampling/logprobs.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"
#include "sampling/token_constraint.h"

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
  // Disk tier of the prefix cache (--cache-dir / --cache-size, engine/disk_cache.h): blocks and snapshots evicted
  // from the pool, and at shutdown every cached one, are kept there and found again by later requests and by a new
  // EngineLoop on the same directory. Empty: no disk tier.
  std::string cache_dir;
  uint64_t cache_size = uint64_t(16) << 30;
  // Speculative decoding with the model's drafter (--spec-draft, engine/spec_decode.h): draft tokens per step, 0 =
  // off, 1 .. Model::max_draft() (the model must be loaded with ModelOptions::drafter).
  int spec_draft = 0;
};

struct EngineRequest {
  std::vector<int32_t> prompt;      // token ids, non-empty, BOS included if wanted
  SamplingParams sampling;
  int64_t max_tokens = -1;          // generated tokens at most; -1: until n_ctx
  bool ignore_eos = false;          // keep going after the model's EOS token (benchmarks)
  // Applied to this request's logits before sampling and told each sampled token (loop thread); null: none.
  std::shared_ptr<TokenConstraint> constraint;
  // >= 0: with each token its log-probabilities (sampling/logprobs.h: of the raw logits) and this many alternatives.
  int top_logprobs = -1;
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
    std::vector<TokenLogprobs> logprobs;  // EngineRequest::top_logprobs >= 0: one per token
    int64_t prompt_tokens = 0;
    int64_t cached_tokens = 0;      // prompt tokens reused from the prefix cache (not recomputed)
    int64_t preemptions = 0;
    int64_t drafted_tokens = 0;     // speculative decoding: draft tokens verified
    int64_t accepted_tokens = 0;    // ... and accepted (each saves one target step)
    // When the loop produced the first token (unset: none) and ended the request: the prefill / generation times of
    // the request, whenever its consumer takes the tokens.
    std::chrono::steady_clock::time_point first_token_at{}, ended_at{};
  };
  uint64_t id() const { return id_; }
  // Blocks until tokens beyond the first `have` exist or the request ended; returns the tokens from `have` on
  // (empty: the request ended with no more tokens).
  std::vector<int32_t> next(size_t have) const;
  // As next(), but waits at most `timeout` (then returns nothing), and appends the new tokens' log-probabilities to
  // *logprobs (when recorded and logprobs is not null).
  std::vector<int32_t> next_for(size_t have, std::chrono::milliseconds timeout,
                                std::vector<TokenLogprobs>* logprobs = nullptr) const;
  // Blocks until the request ended.
  Result wait() const;
  // Waits at most `timeout` for the request to end; true when it has.
  bool wait_end_for(std::chrono::milliseconds timeout) const;
  bool finished() const;
  // Called on the loop thread after each token and at the end, with the stream's lock held (keep it short: no
  // calls back into this stream); replaces the previous listener, empty: none. Once set_listener returns, the
  // previous listener is not running and is never called again. Tokens pushed before it was set are not reported.
  void set_listener(std::function<void()> fn);

  explicit RequestStream(uint64_t id) : id_(id) {}
  // Loop side.
  void push(int32_t token, TokenLogprobs* lp = nullptr);
  void add_spec(int64_t drafted, int64_t accepted);
  void finish(StreamEnd end, std::string error, int64_t prompt_tokens, int64_t cached_tokens, int64_t preemptions);

 private:
  const uint64_t id_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Result r_;
  std::function<void()> listener_;
};

class EngineLoop {
 public:
  // Sizes the pool (throws dsv4::Error when state_bytes cannot hold max_running slots and a page each) and starts
  // the loop thread (unless start_thread is false).
  EngineLoop(std::shared_ptr<const BatchModel> model, const EngineLoopOptions& opts = {});
  EngineLoop(std::shared_ptr<const Model> model, const EngineLoopOptions& opts = {})
      : EngineLoop(batch_model_of(std::move(model)), opts) {}
  // Stops the loop; requests still running end as cancelled; with a disk tier, every cached block is written there.
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

  // Upper bounds (seconds) of the step-time histogram's buckets (Stats::step_buckets; the last bucket is +Inf).
  static constexpr std::array<double, 12> kStepBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                          0.1,   0.25,   0.5,   1.0,  2.5,   10.0};
  struct Stats {
    int64_t steps = 0, step_tokens = 0, prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
    int64_t requests_submitted = 0, cache_hits = 0;   // cache_hits: finished requests with cached_tokens > 0
    std::array<int64_t, kStepBuckets.size() + 1> step_buckets{};  // steps per step-time bucket (not cumulative)
    int64_t requests_finished = 0, preemptions = 0, running = 0, waiting = 0;
    int64_t drafted_tokens = 0, accepted_tokens = 0;  // speculative decoding
    double forward_seconds = 0;       // forward steps and draft steps
    double draft_seconds = 0;         // of which draft steps (speculative decoding)
    int64_t pool_slots = 0, pool_pages = 0, pool_snapshots = 0;
    uint64_t pool_bytes = 0;
    int compute_threads = 0;        // CPU: OpenMP pool size of the thread that runs the steps (serve --threads)
    PrefixCache::Stats cache;
    DiskCache::Stats disk;          // all zero without a disk tier
  };
  // As of the end of the last step (or intake). Thread-safe.
  Stats stats() const;
  const BatchModel& model() const { return *model_; }
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
  struct SpecRequest spec_request(uint64_t id);  // what the SpecDecoder needs of a live request

  std::shared_ptr<const BatchModel> model_;
  EngineLoopOptions opts_;
  int64_t n_ctx_ = 0;
  std::unique_ptr<BatchState> pool_;
  std::unique_ptr<DiskCache> disk_;  // reads and writes the pool: declared after it (destroyed before it)
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
