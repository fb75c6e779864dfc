#include "server/model_host.h"

#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace dsv4 {

ModelHost::ModelHost(std::shared_ptr<const LanguageModel> model, Loader loader, int64_t n_ctx, int64_t prefill_chunk)
    : loader_(std::move(loader)), prefill_chunk_(prefill_chunk) {
  if (!model) fail("server: no model");
  n_ctx_ = std::min(n_ctx, model->max_context());
  n_vocab_ = model->n_vocab();
  bos_ = model->bos_id();
  eos_ = model->eos_id();
  engine_ = std::make_unique<Engine>(std::move(model), n_ctx_, prefill_chunk_);
}

const char* ModelHost::state_name() const {
  switch (state()) {
    case State::kLoaded:
      return "loaded";
    case State::kParked:
      return "parked";
    case State::kLoading:
      return "loading";
  }
  return "?";
}

Engine& ModelHost::engine() {
  if (!engine_) fail("the model is parked");
  return *engine_;
}

void ModelHost::park() {
  if (!loader_) fail("this server cannot park its model (it has no way to load it again)");
  if (!engine_) return;
  engine_.reset();  // the last reference to the model: weights and sequence state are freed
  state_ = State::kParked;
  log::info("model parked");
}

void ModelHost::unpark() {
  if (engine_) return;
  state_ = State::kLoading;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    auto model = loader_();
    if (!model) fail("the model loader returned nothing");
    if (model->n_vocab() != n_vocab_ || model->eos_id() != eos_ || model->bos_id() != bos_)
      fail("the reloaded model has another vocabulary");
    engine_ = std::make_unique<Engine>(std::move(model), n_ctx_, prefill_chunk_);
  } catch (...) {
    state_ = State::kParked;
    throw;
  }
  last_load_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  state_ = State::kLoaded;
  log::info("model loaded again in {:.0f} ms", last_load_ms_);
}

}  // namespace dsv4
