// Sequence state construction, growth, checkpoints (spec §5.5, §6).
#include "model/sequence_state.h"

#include <algorithm>
#include <limits>

#include "backend/ops.h"
#include "core/error.h"
#include "loader/state_size.h"

namespace dsv4 {

void CompressorState::init(Backend& be, int r, int64_t width) {
  ratio = r;
  coff = ModelConfig::compressor_coff(r);
  c = width;
  const int64_t n = rows() * this->width();
  k = Buffer(be, size_t(n) * 4, "compressor state");
  s = Buffer(be, size_t(n) * 4, "compressor state");
  be.ops().fill(k.as<float>(), n, 0.0f);
  be.ops().fill(s.as<float>(), n, -std::numeric_limits<float>::infinity());
}

SequenceState SequenceState::fresh(const ModelConfig& cfg, Backend& be) {
  SequenceState st;
  st.backend = &be;
  st.layers.resize(static_cast<size_t>(cfg.num_hidden_layers));
  const int64_t ring = cfg.sliding_window * cfg.head_dim;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    LayerState& ls = st.layers[size_t(l)];
    ls.ratio = cfg.compress_ratio(l);
    ls.ring = Buffer(be, size_t(ring) * 4, "window ring");
    be.ops().fill(ls.ring_ptr(), ring, 0.0f);
    if (ls.ratio > 0) ls.cmp.init(be, ls.ratio, cfg.head_dim);
    if (ls.ratio == 4) ls.idx_cmp.init(be, ls.ratio, cfg.index_head_dim);
  }
  return st;
}

void SequenceState::reserve(const ModelConfig& cfg, int64_t n_positions) {
  for (LayerState& ls : layers) {
    if (ls.ratio <= 0) continue;
    const int64_t need = n_positions / ls.ratio;
    if (need <= ls.capacity) continue;
    const int64_t cap = std::max<int64_t>({need, 2 * ls.capacity, 64});
    const int64_t keep = n_past / ls.ratio;  // rows in use
    auto grow = [&](Buffer& b, int64_t width, const char* what) {
      Buffer nb(*backend, size_t(cap * width) * 4, what);
      if (keep > 0) backend->copy_on_device(nb.data(), b.data(), size_t(keep * width) * 4);
      b = std::move(nb);
    };
    grow(ls.comp, cfg.head_dim, "compressed KV rows");
    if (ls.ratio == 4) grow(ls.idx, cfg.index_head_dim, "indexer key rows");
    ls.capacity = cap;
  }
}

size_t SequenceState::bytes() const {
  size_t b = 0;
  for (const auto& l : layers) b += l.ring.bytes() + l.comp.bytes() + l.idx.bytes() + l.cmp.bytes() + l.idx_cmp.bytes();
  return b;
}

size_t SequenceState::bytes_used(const ModelConfig& cfg) const { return size_t(state_bytes_total(cfg, n_past)); }

StateCheckpoint StateCheckpoint::take(const SequenceState& st) {
  StateCheckpoint ck;
  ck.n_past = st.n_past;
  ck.layers.resize(st.layers.size());
  for (size_t l = 0; l < st.layers.size(); ++l) {
    const LayerState& ls = st.layers[l];
    auto& c = ck.layers[l];
    c.ring = ls.ring;
    c.cmp = ls.cmp;
    c.idx_cmp = ls.idx_cmp;
  }
  return ck;
}

void StateCheckpoint::restore(SequenceState& st) const {
  if (st.n_past < n_past || st.layers.size() != layers.size())
    fail("internal: checkpoint at {} cannot restore a state at {}", n_past, st.n_past);
  st.n_past = n_past;
  for (size_t l = 0; l < layers.size(); ++l) {
    LayerState& ls = st.layers[l];
    const auto& c = layers[l];
    ls.ring = c.ring;
    ls.cmp = c.cmp;
    ls.idx_cmp = c.idx_cmp;
  }
}

size_t StateCheckpoint::bytes() const {
  size_t b = 0;
  for (const auto& l : layers) b += l.ring.bytes() + l.cmp.bytes() + l.idx_cmp.bytes();
  return b;
}

}  // namespace dsv4
