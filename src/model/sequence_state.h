// Per-sequence decode state of the DeepSeek V4 forward pass (spec §5.5, §6): explicit, position-based, copyable, and
// resident on the backend's device (Buffers). Per layer: the raw KV window ring, the compressed KV rows
// (ratio 4 / 128), the indexer key rows (ratio 4) and the compressor frontier state (fp32 projections of the
// incomplete window(s), reset per sequence). All rows are fp32 (values are bf16 / FP8 / FP4-representable in
// reference numerics). Row counts follow from n_past alone (a ratio-m layer holds floor(n_past / m) compressed rows).
// The state holds no token ids; see model/sequence.h for the LmSequence wrapper with tokens and rewind.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "loader/config.h"

namespace dsv4 {

// Compressor frontier (spec §5.5 decode state machine): k, s: [coff*ratio, coff*c] fp32; init k = 0, s = -inf.
// Overlapping (ratio 4): rows [0, ratio) = previous complete window, rows [ratio, 2*ratio) = current window.
struct CompressorState {
  int ratio = 0, coff = 1;
  int64_t c = 0;                // pooled row width (head_dim or index_head_dim)
  Buffer k, s;
  void init(Backend& be, int ratio, int64_t c);
  int64_t rows() const { return int64_t(coff) * ratio; }
  int64_t width() const { return int64_t(coff) * c; }
  size_t bytes() const { return k.bytes() + s.bytes(); }
};

struct LayerState {
  int ratio = 0;
  Buffer ring;                  // [sliding_window, head_dim]; slot = position % sliding_window
  Buffer comp;                  // [capacity, head_dim]; row w pools positions [w*ratio, (w+1)*ratio) (ratio > 0)
  Buffer idx;                   // [capacity, index_head_dim] indexer keys (ratio 4)
  int64_t capacity = 0;         // compressed rows the buffers hold
  CompressorState cmp;          // attention compressor frontier (ratio > 0)
  CompressorState idx_cmp;      // indexer compressor frontier (ratio 4)
  float* ring_ptr() { return ring.as<float>(); }
  float* comp_ptr() { return comp.as<float>(); }
  float* idx_ptr() { return idx.as<float>(); }
};

struct SequenceState {
  int64_t n_past = 0;           // positions consumed
  Backend* backend = nullptr;   // where the buffers live
  std::vector<LayerState> layers;

  // A fresh state for `cfg`'s main layers on `be` (n_past = 0, frontier reset).
  static SequenceState fresh(const ModelConfig& cfg, Backend& be);
  // Grow the compressed-row buffers (keeping their rows) so that n_positions positions fit.
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
  struct Layer {
    Buffer ring;
    CompressorState cmp, idx_cmp;
  };
  std::vector<Layer> layers;

  static StateCheckpoint take(const SequenceState& st);
  // Precondition: st.n_past >= n_past and st descends from the state the checkpoint was taken from.
  void restore(SequenceState& st) const;
  size_t bytes() const;
};

}  // namespace dsv4
