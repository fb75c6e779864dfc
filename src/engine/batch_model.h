// BatchModel: what the engine loop (engine/engine_loop.h) needs from a model — its vocabulary facts, the paged state
// layout (model/state_layout.h), a state store of many sequences and one batched forward step (model/batch.h). The
// DeepSeek V4 Model (model/model.h) provides it through batch_model_of(); tests provide doubles (tests/common/fake_lm.h)
// so that the server and the engine loop run the same code on scripted models.
//
// BatchState: slots, 128-token pages and boundary snapshots of many sequences (the StatePool for the Model). Which
// slot, page or snapshot belongs to whom is decided by the engine loop's scheduler and prefix cache.
#pragma once
#include <cstdint>
#include <memory>

#include "model/batch.h"
#include "model/state_layout.h"
#include "model/state_pool.h"

namespace dsv4 {

class Model;

class BatchState {
 public:
  virtual ~BatchState() = default;
  virtual int64_t n_pages() const = 0;
  virtual size_t bytes() const = 0;
  // Slot `slot` as a fresh sequence.
  virtual void reset_slot(int64_t slot) = 0;
  // Slot `slot` as the state at the snapshot's position (the pages up to it are the caller's business).
  virtual void restore_snapshot(int64_t snapshot, int64_t slot) = 0;
  // The StatePool behind it (the prefix cache's disk tier copies pages and snapshots out of it), or nullptr for a
  // state that has none (test doubles).
  virtual StatePool* pool() { return nullptr; }
};

class BatchModel {
 public:
  virtual ~BatchModel() = default;
  virtual int32_t n_vocab() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int64_t max_context() const = 0;
  // Bytes of a slot, a page and a snapshot as stored (pool sizing).
  // (drafter: with the drafter's layers and speculation rows, for speculative decoding)
  virtual StateLayout state_layout(bool drafter = false) const = 0;
  // Distinguishes models whose state rows differ (numerics, layout version): prefix-cache blocks are never shared
  // across different salts.
  virtual uint64_t state_salt() const = 0;
  // Throws dsv4::Error when the device memory does not suffice.
  virtual std::unique_ptr<BatchState> make_state(const StatePoolOptions& o) const = 0;
  // The DeepSeek V4 model behind it (speculative decoding runs its drafter), or nullptr (test doubles).
  virtual const Model* deepseek_model() const { return nullptr; }
  // One step: the wanted logits go to `sink` (non-finite ones flagged), snapshots are taken. Throws dsv4::Error on an
  // invalid batch. Called from one thread at a time.
  virtual void forward(const Batch& batch, BatchState& state, const BatchLogitsSink& sink) const = 0;
};

// The Model behind the BatchModel interface (its StatePool as the BatchState). Keeps the model alive.
std::shared_ptr<const BatchModel> batch_model_of(std::shared_ptr<const Model> model);

}  // namespace dsv4
