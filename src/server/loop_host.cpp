#include "server/loop_host.h"

#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace dsv4 {

LoopHost::LoopHost(std::shared_ptr<const BatchModel> model, Loader loader, EngineLoopOptions opts)
    : loader_(std::move(loader)), opts_(std::move(opts)) {
  if (!model) fail("server: no model");
  opts_.n_ctx = opts_.n_ctx <= 0 ? model->max_context() : std::min(opts_.n_ctx, model->max_context());
  opts_.start_thread = true;
  n_vocab_ = model->n_vocab();
  bos_ = model->bos_id();
  eos_ = model->eos_id();
  layout_ = model->state_layout();
  loop_ = std::make_shared<EngineLoop>(std::move(model), opts_);
  // A request must fit the pool alone: the context is at most what its pages can hold.
  const int64_t fits = loop_->stats().pool_pages * StateLayout::kPageTokens;
  if (fits < opts_.n_ctx) {
    log::warn("the state memory holds {} positions of one sequence: the context is {} instead of {} (raise "
              "--kv-memory)",
              fits, fits, opts_.n_ctx);
    opts_.n_ctx = fits;
  }
}

LoopHost::~LoopHost() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return leases_ == 0; });
  loop_.reset();
}

LoopHost::Lease::~Lease() {
  if (!host_) return;
  loop_.reset();
  std::lock_guard lk(host_->mu_);
  --host_->leases_;
  host_->cv_.notify_all();
}

const char* LoopHost::state_name() const {
  switch (state()) {
    case State::kLoaded: return "loaded";
    case State::kParked: return "parked";
    case State::kLoading: return "loading";
  }
  return "?";
}

void LoopHost::load_locked(std::unique_lock<std::mutex>& lk) {
  state_ = State::kLoading;
  lk.unlock();
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<EngineLoop> loop;
  std::string err;
  try {
    auto model = loader_();
    if (!model) fail("the model loader returned nothing");
    if (model->n_vocab() != n_vocab_ || model->eos_id() != eos_ || model->bos_id() != bos_)
      fail("the reloaded model has another vocabulary");
    loop = std::make_shared<EngineLoop>(std::move(model), opts_);
  } catch (const Error& e) {
    err = e.what();
  }
  lk.lock();
  if (!loop) {
    state_ = State::kParked;
    cv_.notify_all();
    fail("{}", err);
  }
  loop_ = std::move(loop);
  last_load_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  state_ = State::kLoaded;
  cv_.notify_all();
  log::info("model loaded again in {:.0f} ms", last_load_ms_);
}

std::optional<LoopHost::Lease> LoopHost::acquire(bool auto_unpark) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !parking_ && state_ != State::kLoading; });
  if (!loop_) {
    if (!auto_unpark) return std::nullopt;
    load_locked(lk);
  }
  ++leases_;
  return Lease(this, loop_);
}

std::optional<LoopHost::Lease> LoopHost::try_acquire() {
  std::lock_guard lk(mu_);
  if (parking_ || state_ != State::kLoaded || !loop_) return std::nullopt;
  ++leases_;
  return Lease(this, loop_);
}

void LoopHost::park() {
  if (!loader_) fail("this server cannot park its model (it has no way to load it again)");
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !parking_ && state_ != State::kLoading; });
  if (!loop_) return;
  parking_ = true;
  cv_.wait(lk, [&] { return leases_ == 0; });
  loop_.reset();  // the last reference to the loop and the model: weights and sequence state are freed
  state_ = State::kParked;
  parking_ = false;
  cv_.notify_all();
  log::info("model parked");
}

void LoopHost::unpark() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !parking_ && state_ != State::kLoading; });
  if (loop_) return;
  load_locked(lk);
}

std::optional<EngineLoop::Stats> LoopHost::stats() const {
  std::lock_guard lk(mu_);
  if (!loop_) return std::nullopt;
  return loop_->stats();
}

}  // namespace dsv4
