// Per-sequence decode state of the DeepSeek V4 forward pass (spec §5.5, §6): explicit, position-based and copyable.
// Per layer: the raw KV window ring, the compressed KV rows (ratio 4 / 128), the indexer key rows (ratio 4) and the
// compressor frontier state (fp32 projections of the incomplete window(s), reset per sequence). All rows are fp32
// (values are bf16 / FP8 / FP4-representable in reference numerics). The state holds no token ids (hash routing reads
// them from the caller's token list); see model/sequence.h for the LmSequence wrapper with tokens and rewind.
#pragma once
#include <cstdint>
#include <vector>

#include "loader/config.h"

namespace dsv4 {

// Compressor frontier (spec §5.5 decode state machine): k, s: [coff*ratio, coff*c] fp32; init k = 0, s = -inf.
// Overlapping (ratio 4): rows [0, ratio) = previous complete window, rows [ratio, 2*ratio) = current window.
struct CompressorState {
  int ratio = 0, coff = 1;
  int64_t c = 0;                // pooled row width (head_dim or index_head_dim)
  std::vector<float> k, s;
  void init(int ratio, int64_t c);
  size_t bytes() const { return (k.capacity() + s.capacity()) * sizeof(float); }
};

struct LayerState {
  int ratio = 0;
  std::vector<float> ring;      // [sliding_window, head_dim]; slot = position % sliding_window
  std::vector<float> comp;      // [n_comp, head_dim]; row w pools positions [w*ratio, (w+1)*ratio) (ratio > 0)
  std::vector<float> idx;       // [n_comp, index_head_dim] indexer keys (ratio 4)
  CompressorState cmp;          // attention compressor frontier (ratio > 0)
  CompressorState idx_cmp;      // indexer compressor frontier (ratio 4)
};

struct SequenceState {
  int64_t n_past = 0;           // positions consumed
  std::vector<LayerState> layers;

  // A fresh state for `cfg`'s main layers (n_past = 0, frontier reset).
  static SequenceState fresh(const ModelConfig& cfg);
  // Bytes held (capacities of every buffer).
  size_t bytes() const;
  // Bytes in use (sizes); equals loader/state_size.h state_bytes_total(cfg, n_past) for the main layers.
  size_t bytes_used() const;
};

// A cheap restore point (for rewind): everything that is not append-only (rings, compressor frontiers) plus the
// number of compressed rows per layer. Valid for restoring a state that has only grown since it was taken
// (compressed rows are append-only): restore truncates the rows and copies the rest back.
struct StateCheckpoint {
  int64_t n_past = 0;
  struct Layer {
    std::vector<float> ring;
    CompressorState cmp, idx_cmp;
    int64_t n_comp = 0;
  };
  std::vector<Layer> layers;

  static StateCheckpoint take(const SequenceState& st, const ModelConfig& cfg);
  // Precondition: st.n_past >= n_past and st descends from the state the checkpoint was taken from.
  void restore(SequenceState& st, const ModelConfig& cfg) const;
  size_t bytes() const;
};

}  // namespace dsv4
