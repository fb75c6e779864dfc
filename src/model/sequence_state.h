// Per-sequence decode state of the DeepSeek V4 forward pass (spec §5.5, §6) for the single-sequence API
// (Model::forward(SequenceState&, ...), ModelSequence): explicit, position-based, copyable, resident on the backend's
// device. It is a StatePool (model/state_pool.h) of one slot whose pages grow with the sequence, plus the identity
// page table: per layer the raw KV window ring, the compressor frontier state (fp32 projections of the incomplete
// window(s), reset per sequence) and the compressed KV rows (ratio 4 / 128) and indexer key rows (ratio 4) in
// 128-token pages. Row counts follow from n_past alone (a ratio-m layer holds floor(n_past / m) compressed rows).
// The state holds no token ids; see model/sequence.h for the LmSequence wrapper with tokens and rewind. Many
// sequences in one pool (batched forward, prefix cache) are the engine's business (src/engine).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "loader/config.h"
#include "model/state_pool.h"

namespace dsv4 {

struct SequenceState {
  int64_t n_past = 0;           // positions consumed
  Backend* backend = nullptr;   // where the buffers live
  StatePool pool;               // slot 0; pages [0, pool.n_pages())
  std::vector<int32_t> pages;   // identity page table [0, pool.n_pages())

  // A fresh state for `cfg`'s main layers on `be` (n_past = 0, frontier reset), rows stored as `rows`.
  static SequenceState fresh(const ModelConfig& cfg, Backend& be, RowFormat rows = RowFormat::f32);
  // Grow the pages (keeping their rows) so that n_positions positions fit.
  void reserve(const ModelConfig& cfg, int64_t n_positions);
  // Bytes held (capacities of every buffer).
  size_t bytes() const;
  // Bytes in use; equals loader/state_size.h state_bytes_total(cfg, n_past) for the main layers.
  size_t bytes_used(const ModelConfig& cfg) const;
};

// A cheap restore point (for rewind): everything that is not append-only (rings, compressor frontiers); the
// compressed rows are append-only, so restoring only needs n_past. Valid for restoring a state that has only grown
// since the checkpoint was taken.
struct StateCheckpoint {
  int64_t n_past = 0;
  StatePool::SlotCopy slot;

  static StateCheckpoint take(const SequenceState& st);
  // Precondition: st.n_past >= n_past and st descends from the state the checkpoint was taken from.
  void restore(SequenceState& st) const;
  size_t bytes() const { return slot.bytes(); }
};

}  // namespace dsv4
