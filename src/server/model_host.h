// The model behind the server and its lifecycle (POST /admin/park, /admin/unpark):
//   loaded  --park()-->  parked: the engine (sequence state) and the model (weights) are released;
//   parked  --unpark()-> loading -> loaded: the model is loaded again through the loader (same folder and options).
// Callers serialise park / unpark / engine use through the request queue (they hold a running ticket), so a request
// never sees the model disappear under it. state() may be read from any thread.
// The vocabulary facts the request parsers need (n_vocab, BOS, EOS, max context) are kept while parked.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "engine/engine.h"
#include "model/language_model.h"

namespace dsv4 {

class ModelHost {
 public:
  using Loader = std::function<std::shared_ptr<const LanguageModel>()>;
  enum class State { kLoaded, kParked, kLoading };

  // loader may be empty (then park() is refused). n_ctx is clamped to the model's maximum context.
  ModelHost(std::shared_ptr<const LanguageModel> model, Loader loader, int64_t n_ctx, int64_t prefill_chunk);

  State state() const { return state_.load(); }
  const char* state_name() const;
  bool can_park() const { return static_cast<bool>(loader_); }
  // The engine; only while loaded.
  Engine& engine();
  void park();    // no-op when parked; throws dsv4::Error without a loader
  void unpark();  // no-op when loaded; throws dsv4::Error (state stays parked) if loading fails
  double last_load_ms() const { return last_load_ms_; }

  int32_t n_vocab() const { return n_vocab_; }
  int32_t bos_id() const { return bos_; }
  int32_t eos_id() const { return eos_; }
  int64_t n_ctx() const { return n_ctx_; }

 private:
  Loader loader_;
  int64_t n_ctx_, prefill_chunk_;
  int32_t n_vocab_, bos_, eos_;
  std::unique_ptr<Engine> engine_;
  std::atomic<State> state_{State::kLoaded};
  double last_load_ms_ = 0.0;
};

}  // namespace dsv4
