// Paged state layout sizes (state_layout.h).
#include "model/state_layout.h"

#include "core/error.h"

namespace dsv4 {

const char* row_format_name(RowFormat f) {
  switch (f) {
    case RowFormat::f32: return "f32";
    case RowFormat::compact: return "compact";
  }
  return "?";
}

bool StateLayout::compact_fits(const ModelConfig& cfg) {
  const int64_t nope = int64_t(cfg.head_dim) - cfg.qk_rope_head_dim;
  return nope > 0 && nope % 64 == 0 && cfg.qk_rope_head_dim >= 0 && cfg.index_head_dim % 32 == 0;
}

StateLayout StateLayout::of(const ModelConfig& cfg, bool with_drafter, RowFormat rows) {
  StateLayout s;
  s.window = cfg.sliding_window;
  s.head_dim = cfg.head_dim;
  s.index_head_dim = cfg.index_head_dim;
  s.row_format = rows;
  if (rows == RowFormat::compact && !compact_fits(cfg))
    fail("{}: head_dim {} (rope {}) / index_head_dim {} do not fit the compact state row formats", cfg.origin,
         cfg.head_dim, cfg.qk_rope_head_dim, cfg.index_head_dim);
  const bool compact = rows == RowFormat::compact;
  s.kv_row = compact ? RowCodec::kv_fp8(cfg.head_dim, cfg.qk_rope_head_dim) : RowCodec::f32(cfg.head_dim);
  s.key_row = compact && cfg.index_head_dim > 0 ? RowCodec::key_fp4(cfg.index_head_dim)
                                                : RowCodec::f32(cfg.index_head_dim);
  const uint64_t row = 4;                                   // fp32 elements (frontiers, hidden rows)
  const uint64_t kv_b = uint64_t(s.kv_row.bytes()), key_b = uint64_t(s.key_row.bytes());  // stored rows
  if (with_drafter) {
    if (cfg.dspark.present) {  // the DSpark stages (window-only, checked by the config parser)
      s.drafter = Drafter::dspark;
      s.n_draft_layers = cfg.dspark.n_stages;
      s.spec_rows = cfg.dspark.block_size + 1;
    } else {
      if (cfg.num_mtp_layers() < 1)
        fail("{}: the model has no drafter (no MTP layer: num_nextn_predict_layers = 0, no dspark_* keys)", cfg.origin);
      if (cfg.compress_ratio(cfg.num_hidden_layers) != 0)
        fail("{}: the MTP layer has compress ratio {}; only a window-only (ratio 0) MTP block is supported",
             cfg.origin, cfg.compress_ratio(cfg.num_hidden_layers));
      s.drafter = Drafter::mtp;
      s.n_draft_layers = 1;
      s.spec_rows = kMaxMtpDraft + 1;
      s.hidden_width = int64_t(cfg.hc_mult) * cfg.hidden_size;
    }
    s.draft_layer = cfg.num_hidden_layers;
  }
  const int n_layers = cfg.num_hidden_layers + s.n_draft_layers;
  for (int l = 0; l < n_layers; ++l) {
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
    s.slot_bytes += uint64_t(s.window) * kv_b;
    s.snapshot_bytes += uint64_t(s.window) * kv_b;
    if (L.ratio > 0) {
      const uint64_t fr = uint64_t(L.frontier_rows()), w = uint64_t(L.coff * s.head_dim);
      s.slot_bytes += 2 * fr * w * row;
      s.page_bytes += uint64_t(L.rows_per_page) * kv_b;
      if (L.coff == 2) s.snapshot_bytes += 2 * uint64_t(L.ratio) * w * row;
    }
    if (L.indexer) {
      const uint64_t fr = uint64_t(L.frontier_rows()), w = uint64_t(L.coff * s.index_head_dim);
      s.slot_bytes += 2 * fr * w * row;
      s.page_bytes += uint64_t(L.rows_per_page) * key_b;
      s.snapshot_bytes += 2 * uint64_t(L.ratio) * w * row;
    }
    s.layers.push_back(L);
  }
  if (with_drafter) {
    // hidden rows + per layer: ring backup rows; per compressor: changed frontier rows + the step's projections
    const int64_t R = s.spec_rows;
    uint64_t b = uint64_t(R * s.hidden_width) * row;
    for (const Layer& L : s.layers) {
      b += uint64_t(R) * kv_b;
      if (L.ratio > 0) b += 2 * uint64_t((L.changed_rows(R) + R) * L.coff * s.head_dim) * row;
      if (L.indexer) b += 2 * uint64_t((L.changed_rows(R) + R) * L.coff * s.index_head_dim) * row;
    }
    s.spec_bytes = b;
    s.slot_bytes += b;
  }
  return s;
}

}  // namespace dsv4
