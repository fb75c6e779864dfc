// The engine loop behind the server and its lifecycle (POST /admin/park, /admin/unpark):
//   loaded  --park()-->  parked: the EngineLoop (state pool, prefix cache) and the model (weights) are released;
//   parked  --unpark()-> loading -> loaded: the model is loaded again through the loader (same folder and options).
// Every request holds a Lease for as long as it uses the loop; park() waits for the leases held when it starts and
// keeps new ones waiting until it is done, so a request never sees the model disappear under it. state() may be read
// from any thread. The vocabulary facts the request parsers need (n_vocab, BOS, EOS, n_ctx) are kept while parked.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "engine/batch_model.h"
#include "engine/engine_loop.h"

namespace dsv4 {

class LoopHost {
 public:
  using Loader = std::function<std::shared_ptr<const BatchModel>()>;
  enum class State { kLoaded, kParked, kLoading };

  // loader may be empty (then park() is refused). opts.n_ctx is clamped to the model's maximum context and to the
  // positions the state pool's pages hold for one sequence. Throws
  // dsv4::Error when the loop cannot be built (e.g. the state memory cannot hold the slots).
  LoopHost(std::shared_ptr<const BatchModel> model, Loader loader, EngineLoopOptions opts);
  ~LoopHost();

  // The loop for one request, while held.
  class Lease {
   public:
    Lease(Lease&& o) noexcept : host_(o.host_), loop_(std::move(o.loop_)) { o.host_ = nullptr; }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    EngineLoop& loop() const { return *loop_; }

   private:
    friend class LoopHost;
    Lease(LoopHost* h, std::shared_ptr<EngineLoop> l) : host_(h), loop_(std::move(l)) {}
    LoopHost* host_;
    std::shared_ptr<EngineLoop> loop_;
  };
  // Waits while a park or a load is under way. Parked: loads the model first when auto_unpark, else nullopt. Throws
  // dsv4::Error if loading fails.
  std::optional<Lease> acquire(bool auto_unpark);
  // Without waiting: the lease when the model is loaded and no park is under way, else nullopt (then acquire()).
  std::optional<Lease> try_acquire();

  State state() const { return state_.load(); }
  const char* state_name() const;
  bool can_park() const { return static_cast<bool>(loader_); }
  void park();    // no-op when parked; throws dsv4::Error without a loader
  void unpark();  // no-op when loaded; throws dsv4::Error (state stays parked) if loading fails
  double last_load_ms() const { return last_load_ms_; }
  // The loop's counters (nullopt while parked).
  std::optional<EngineLoop::Stats> stats() const;

  int32_t n_vocab() const { return n_vocab_; }
  int32_t bos_id() const { return bos_; }
  int32_t eos_id() const { return eos_; }
  int64_t n_ctx() const { return opts_.n_ctx; }
  const EngineLoopOptions& options() const { return opts_; }
  const StateLayout& state_layout() const { return layout_; }

 private:
  void load_locked(std::unique_lock<std::mutex>& lk);  // parked -> loaded (mu_ held, released while loading)
  Loader loader_;
  EngineLoopOptions opts_;
  int32_t n_vocab_, bos_, eos_;
  StateLayout layout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<EngineLoop> loop_;
  int64_t leases_ = 0;
  bool parking_ = false;
  std::atomic<State> state_{State::kLoaded};
  double last_load_ms_ = 0.0;
};

}  // namespace dsv4
