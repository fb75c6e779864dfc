// Sequence state construction, growth, checkpoints (spec §5.5, §6).
#include "model/sequence_state.h"

#include <algorithm>

#include "core/error.h"
#include "loader/state_size.h"

namespace dsv4 {

SequenceState SequenceState::fresh(const ModelConfig& cfg, Backend& be, RowFormat rows) {
  SequenceState st;
  st.backend = &be;
  StatePoolOptions o{1, 0, 0};
  o.rows = rows;
  st.pool = StatePool(cfg, be, o);
  return st;
}

void SequenceState::reserve(const ModelConfig& cfg, int64_t n_positions) {
  const int64_t need = StateLayout::pages_for(n_positions);
  if (need > pool.n_pages()) {
    if (pool.layout().any_compressed) pool.grow_pages(std::max<int64_t>({need, 2 * pool.n_pages(), 2}));
    else pool.grow_pages(need);  // no rows to hold: page ids only
  }
  while (int64_t(pages.size()) < pool.n_pages()) pages.push_back(int32_t(pages.size()));
}

size_t SequenceState::bytes() const { return pool.bytes(); }

size_t SequenceState::bytes_used(const ModelConfig& cfg) const {
  return size_t(state_bytes_total(cfg, n_past, false, pool.layout().row_format == RowFormat::compact));
}

StateCheckpoint StateCheckpoint::take(const SequenceState& st) {
  StateCheckpoint ck;
  ck.n_past = st.n_past;
  ck.slot = st.pool.save_slot(0);
  return ck;
}

void StateCheckpoint::restore(SequenceState& st) const {
  if (st.n_past < n_past) fail("internal: checkpoint at {} cannot restore a state at {}", n_past, st.n_past);
  st.n_past = n_past;
  st.pool.load_slot(slot, 0);
}

}  // namespace dsv4
