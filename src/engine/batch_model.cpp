// The Model as a BatchModel (batch_model.h).
#include "engine/batch_model.h"

#include "core/error.h"
#include "engine/cache_identity.h"
#include "model/model.h"

namespace dsv4 {

namespace {

class PoolState final : public BatchState {
 public:
  explicit PoolState(StatePool p) : pool_(std::move(p)) {}
  int64_t n_pages() const override { return pool_.n_pages(); }
  size_t bytes() const override { return pool_.bytes(); }
  void reset_slot(int64_t slot) override { pool_.reset_slot(slot); }
  void restore_snapshot(int64_t snapshot, int64_t slot) override { pool_.restore_snapshot(snapshot, slot); }
  StatePool* pool() override { return &pool_; }
  StatePool pool_;
};

class ModelBatch final : public BatchModel {
 public:
  explicit ModelBatch(std::shared_ptr<const Model> m) : m_(std::move(m)) {}
  int32_t n_vocab() const override { return m_->n_vocab(); }
  int32_t bos_id() const override { return m_->bos_id(); }
  int32_t eos_id() const override { return m_->eos_id(); }
  int64_t max_context() const override { return m_->max_context(); }
  StateLayout state_layout(bool drafter) const override { return m_->state_layout(drafter); }
  // weights, numerics, state layout, device kind and disk format (engine/cache_identity.h): never share blocks across
  // models whose rows differ
  uint64_t state_salt() const override { return cache_identity(*m_); }
  std::unique_ptr<BatchState> make_state(const StatePoolOptions& o) const override {
    return std::make_unique<PoolState>(m_->make_pool(o));
  }
  const Model* deepseek_model() const override { return m_.get(); }
  void forward(const Batch& batch, BatchState& state, const BatchLogitsSink& sink) const override {
    auto* ps = dynamic_cast<PoolState*>(&state);
    if (!ps) fail("internal: a batch state of another model");
    m_->forward(batch, ps->pool_, sink);
  }

 private:
  std::shared_ptr<const Model> m_;
};

}  // namespace

std::shared_ptr<const BatchModel> batch_model_of(std::shared_ptr<const Model> model) {
  if (!model) fail("engine: no model");
  return std::make_shared<ModelBatch>(std::move(model));
}

}  // namespace dsv4
