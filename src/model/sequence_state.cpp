// Sequence state construction, checkpoints (spec §5.5, §6).
#include "model/sequence_state.h"

#include <limits>

#include "core/error.h"

namespace dsv4 {

void CompressorState::init(int r, int64_t width) {
  ratio = r;
  coff = ModelConfig::compressor_coff(r);
  c = width;
  const size_t n = size_t(coff * r) * size_t(coff * width);
  k.assign(n, 0.0f);
  s.assign(n, -std::numeric_limits<float>::infinity());
}

SequenceState SequenceState::fresh(const ModelConfig& cfg) {
  SequenceState st;
  st.layers.resize(static_cast<size_t>(cfg.num_hidden_layers));
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    LayerState& ls = st.layers[size_t(l)];
    ls.ratio = cfg.compress_ratio(l);
    ls.ring.assign(static_cast<size_t>(cfg.sliding_window) * size_t(cfg.head_dim), 0.0f);
    if (ls.ratio > 0) ls.cmp.init(ls.ratio, cfg.head_dim);
    if (ls.ratio == 4) ls.idx_cmp.init(ls.ratio, cfg.index_head_dim);
  }
  return st;
}

size_t SequenceState::bytes() const {
  size_t b = 0;
  for (const auto& l : layers)
    b += (l.ring.capacity() + l.comp.capacity() + l.idx.capacity()) * sizeof(float) + l.cmp.bytes() + l.idx_cmp.bytes();
  return b;
}

size_t SequenceState::bytes_used() const {
  size_t b = 0;
  for (const auto& l : layers)
    b += (l.ring.size() + l.comp.size() + l.idx.size() + l.cmp.k.size() + l.cmp.s.size() + l.idx_cmp.k.size() +
          l.idx_cmp.s.size()) * sizeof(float);
  return b;
}

StateCheckpoint StateCheckpoint::take(const SequenceState& st, const ModelConfig& cfg) {
  StateCheckpoint ck;
  ck.n_past = st.n_past;
  ck.layers.resize(st.layers.size());
  for (size_t l = 0; l < st.layers.size(); ++l) {
    const LayerState& ls = st.layers[l];
    auto& c = ck.layers[l];
    c.ring = ls.ring;
    c.cmp = ls.cmp;
    c.idx_cmp = ls.idx_cmp;
    c.n_comp = ls.ratio > 0 ? int64_t(ls.comp.size()) / cfg.head_dim : 0;
  }
  return ck;
}

void StateCheckpoint::restore(SequenceState& st, const ModelConfig& cfg) const {
  if (st.n_past < n_past || st.layers.size() != layers.size())
    fail("internal: checkpoint at {} cannot restore a state at {}", n_past, st.n_past);
  st.n_past = n_past;
  for (size_t l = 0; l < layers.size(); ++l) {
    LayerState& ls = st.layers[l];
    const auto& c = layers[l];
    ls.ring = c.ring;
    ls.cmp = c.cmp;
    ls.idx_cmp = c.idx_cmp;
    if (ls.ratio > 0) {
      ls.comp.resize(static_cast<size_t>(c.n_comp) * size_t(cfg.head_dim));
      if (ls.ratio == 4) ls.idx.resize(static_cast<size_t>(c.n_comp) * size_t(cfg.index_head_dim));
    }
  }
}

size_t StateCheckpoint::bytes() const {
  size_t b = 0;
  for (const auto& l : layers) b += l.ring.capacity() * sizeof(float) + l.cmp.bytes() + l.idx_cmp.bytes();
  return b;
}

}  // namespace dsv4
