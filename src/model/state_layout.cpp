// Paged state layout sizes (state_layout.h).
#include "model/state_layout.h"

#include "core/error.h"

namespace dsv4 {

const char* row_format_name(RowFormat f) {
  switch (f) {
    case RowFormat::f32: return "f32";
  }
  return "?";
}

StateLayout StateLayout::of(const ModelConfig& cfg) {
  StateLayout s;
  s.window = cfg.sliding_window;
  s.head_dim = cfg.head_dim;
  s.index_head_dim = cfg.index_head_dim;
  const uint64_t row = 4;  // fp32
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    Layer L;
    L.ratio = cfg.compress_ratio(l);
    L.coff = ModelConfig::compressor_coff(L.ratio);
    if (L.ratio > 0) {
      if (kPageTokens % L.ratio != 0)
        fail("{}: layer {} has compress ratio {}, which does not divide the {}-token page of the state layout",
             cfg.origin, l, L.ratio, kPageTokens);
      L.rows_per_page = kPageTokens / L.ratio;
      s.any_compressed = true;
    }
    L.indexer = L.ratio == 4;
    s.slot_bytes += uint64_t(s.window * s.head_dim) * row;
    s.snapshot_bytes += uint64_t(s.window * s.head_dim) * row;
    if (L.ratio > 0) {
      const uint64_t fr = uint64_t(L.frontier_rows()), w = uint64_t(L.coff * s.head_dim);
      s.slot_bytes += 2 * fr * w * row;
      s.page_bytes += uint64_t(L.rows_per_page * s.head_dim) * row;
      if (L.coff == 2) s.snapshot_bytes += 2 * uint64_t(L.ratio) * w * row;
    }
    if (L.indexer) {
      const uint64_t fr = uint64_t(L.frontier_rows()), w = uint64_t(L.coff * s.index_head_dim);
      s.slot_bytes += 2 * fr * w * row;
      s.page_bytes += uint64_t(L.rows_per_page * s.index_head_dim) * row;
      s.snapshot_bytes += 2 * uint64_t(L.ratio) * w * row;
    }
    s.layers.push_back(L);
  }
  return s;
}

}  // namespace dsv4
