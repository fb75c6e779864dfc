// The paged layout of DeepSeek V4 sequence state (spec §5.5, §6), as a pure function of the config: what a slot, a
// page and a boundary snapshot hold per layer and how many bytes each takes as stored. Used by the StatePool
// (model/state_pool.h, the device storage), the prefix cache's accounting and `dsv4 info`.
//
//   slot (one per running sequence, fixed size): per layer the window ring [window, head_dim] (row = position %
//     window) and, per compressor, its frontier k, s [coff*ratio, coff*c] (spec §5.5 decode state machine).
//   page (128 tokens of one sequence, shareable once full): per compressed layer the rows of the page's positions,
//     128 / ratio rows of head_dim (CSA: 32, HCA: 1), and on CSA layers as many indexer key rows of index_head_dim.
//     Logical compressed row w of a sequence lives in page table[w / rows_per_page] at row w % rows_per_page.
//   drafter layers (with_drafter): the MTP block's own window ring (ratio 0, spec §5.9) as one more layer after the
//     main layers, or the DSpark drafter's stage rings (ratio 0, one per stage: the context KV of every position,
//     docs/dspark.md) — in slots and snapshots like any ratio-0 layer.
//   speculation rows (with_drafter, per slot; R = spec_rows = the drafter's most drafts + 1): with the MTP module the
//     pre-head hidden streams of the slot's last R positions (the MTP input) and, per layer, what a verify step of
//     <= R tokens overwrites (ring rows, changed frontier rows) plus the step's compressor projections, so that
//     rejected positions can be rolled back exactly (model/speculation.h).
//   snapshot (the state at a 128-aligned position B that pages cannot carry): per layer the ring at B
//     [window, head_dim] in ring-slot order, and per overlapping (ratio-4) compressor the frontier rows [0, ratio)
//     of k and s (the last complete window, which the next window pools with). Nothing else is needed at B: every
//     ratio divides 128, so no other compressor holds a partial window there (spec §5.5; serving-and-api §1.1).
//
// Row format (format/row_format.h): `f32` keeps window ring rows, compressed KV rows and indexer keys as computed
// (dense numerics, and backends that read fp32 rows only); `compact` stores them in the reference's own formats
// (spec §6.1: KV rows as kv_fp8 — 584 B for V4-Flash —, indexer keys as key_fp4 — 68 B), lossless for the rows
// reference numerics produce. The backend decides (Backend::compact_state_rows()); compressor frontiers and the
// speculation hidden rows stay fp32 in both (softmax inputs). Rows of either format are whole 4-byte words
// (kv_row.words(), key_row.words()): addressing is by row as before, only the row width changes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "format/row_format.h"
#include "loader/config.h"

namespace dsv4 {

enum class RowFormat { f32, compact };
const char* row_format_name(RowFormat f);

struct StateLayout {
  static constexpr int64_t kPageTokens = 128;  // tokens per page = prefix-cache block = snapshot grid
  static constexpr int kVersion = 2;           // bumped when anything below changes (2: compact row formats)

  static constexpr int64_t kMaxMtpDraft = 4;     // draft tokens per verify step with the MTP module at most
  static constexpr int64_t kMaxDraftLimit = 64;  // with any drafter (the DSpark block size, config.h, is <= 64)

  enum class Drafter { none, mtp, dspark };

  struct Layer {
    int ratio = 0;                  // 0: window only; 4: CSA (+ indexer); 128: HCA
    int coff = 1;                   // 2 for the overlapping ratio-4 compressor
    int64_t rows_per_page = 0;      // compressed rows per page (kPageTokens / ratio; 0 without a compressor)
    bool indexer = false;           // ratio 4: indexer keys + indexer compressor
    int64_t frontier_rows() const { return int64_t(coff) * ratio; }
    // Frontier rows a step of <= spec_rows tokens can change (backed up before a verify step).
    int64_t changed_rows(int64_t spec_rows) const {
      return coff == 2 ? frontier_rows() : std::min<int64_t>(frontier_rows(), spec_rows);
    }
  };

  RowFormat row_format = RowFormat::f32;
  RowCodec kv_row;                  // window ring rows, compressed KV rows (and their snapshot / speculation copies)
  RowCodec key_row;                 // indexer key rows
  int64_t window = 0, head_dim = 0, index_head_dim = 0;
  std::vector<Layer> layers;        // main layers, then the drafter's layers when with_drafter
  Drafter drafter = Drafter::none;
  int draft_layer = -1;             // index of the drafter's first layer in `layers` (MTP block, DSpark stage 0)
  int n_draft_layers = 0;           // 1 (MTP) or the DSpark stage count
  int64_t spec_rows = 0;            // tokens of a verify step at most (drafts + 1); 0 without a drafter
  int64_t hidden_width = 0;         // MTP: hc_mult * hidden_size (speculation hidden rows); else 0
  bool any_compressed = false;

  // Bytes as stored.
  uint64_t slot_bytes = 0;          // ring + frontiers of every layer
  uint64_t page_bytes = 0;          // compressed rows + indexer keys of one page, every layer
  uint64_t snapshot_bytes = 0;      // rings + overlap frontier rows of every layer
  uint64_t spec_bytes = 0;          // speculation rows of one slot (with_drafter), part of slot_bytes
  double bytes_per_token() const { return double(page_bytes) / double(kPageTokens); }

  // with_drafter: the layers and speculation rows of the config's drafter (the DSpark stages when it has dspark_*
  // keys, else the MTP block). Throws dsv4::Error when a compress ratio does not divide kPageTokens, or with_drafter
  // and the config has no drafter or an MTP layer with a compressor.
  static StateLayout of(const ModelConfig& cfg, bool with_drafter = false, RowFormat rows = RowFormat::f32);
  // Whether the config's dims fit the compact formats (nope = head_dim - rope a multiple of 64, index_head_dim of 32).
  static bool compact_fits(const ModelConfig& cfg);
  bool has_drafter() const { return drafter != Drafter::none; }
  bool has_mtp() const { return drafter == Drafter::mtp; }
  bool has_dspark() const { return drafter == Drafter::dspark; }
  int64_t max_draft() const { return spec_rows > 0 ? spec_rows - 1 : 0; }
  // Pages holding the compressed rows of positions [0, n_positions).
  static int64_t pages_for(int64_t n_positions) { return (n_positions + kPageTokens - 1) / kPageTokens; }
};

}  // namespace dsv4
