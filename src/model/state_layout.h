// The paged layout of DeepSeek V4 sequence state (spec §5.5, §6), as a pure function of the config: what a slot, a
// page and a boundary snapshot hold per layer and how many bytes each takes as stored. Used by the StatePool
// (model/state_pool.h, the device storage), the prefix cache's accounting and `dsv4 info`.
//
//   slot (one per running sequence, fixed size): per layer the window ring [window, head_dim] (row = position %
//     window) and, per compressor, its frontier k, s [coff*ratio, coff*c] (spec §5.5 decode state machine).
//   page (128 tokens of one sequence, shareable once full): per compressed layer the rows of the page's positions,
//     128 / ratio rows of head_dim (CSA: 32, HCA: 1), and on CSA layers as many indexer key rows of index_head_dim.
//     Logical compressed row w of a sequence lives in page table[w / rows_per_page] at row w % rows_per_page.
//   MTP layer (with_mtp): the MTP block's own window ring (ratio 0, spec §5.9) as one more layer after the main
//     layers — in slots and snapshots like any ratio-0 layer.
//   speculation rows (with_mtp, per slot): the pre-head hidden streams of the slot's last kSpecRows positions (the
//     MTP input) and, per layer, what a verify step of <= kSpecRows tokens overwrites (ring rows, changed frontier
//     rows) plus the step's compressor projections, so that rejected positions can be rolled back exactly
//     (model/speculation.h).
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

  static constexpr int64_t kMaxDraft = 4;                 // draft tokens per verify step at most
  static constexpr int64_t kSpecRows = kMaxDraft + 1;     // tokens of a verify step at most

  struct Layer {
    int ratio = 0;                  // 0: window only; 4: CSA (+ indexer); 128: HCA
    int coff = 1;                   // 2 for the overlapping ratio-4 compressor
    int64_t rows_per_page = 0;      // compressed rows per page (kPageTokens / ratio; 0 without a compressor)
    bool indexer = false;           // ratio 4: indexer keys + indexer compressor
    int64_t frontier_rows() const { return int64_t(coff) * ratio; }
    // Frontier rows a step of <= kSpecRows tokens can change (backed up before a verify step).
    int64_t changed_rows() const {
      return coff == 2 ? frontier_rows() : std::min<int64_t>(frontier_rows(), kSpecRows);
    }
  };

  RowFormat row_format = RowFormat::f32;
  RowCodec kv_row;                  // window ring rows, compressed KV rows (and their snapshot / speculation copies)
  RowCodec key_row;                 // indexer key rows
  int64_t window = 0, head_dim = 0, index_head_dim = 0;
  std::vector<Layer> layers;        // main layers, then the MTP block's layer when with_mtp
  int mtp_layer = -1;               // index of the MTP layer in `layers`, -1 without
  int64_t hidden_width = 0;         // hc_mult * hidden_size (speculation hidden rows)
  bool any_compressed = false;

  // Bytes as stored.
  uint64_t slot_bytes = 0;          // ring + frontiers of every layer
  uint64_t page_bytes = 0;          // compressed rows + indexer keys of one page, every layer
  uint64_t snapshot_bytes = 0;      // rings + overlap frontier rows of every layer
  uint64_t spec_bytes = 0;          // speculation rows of one slot (with_mtp), part of slot_bytes
  double bytes_per_token() const { return double(page_bytes) / double(kPageTokens); }

  // Throws dsv4::Error when a compress ratio does not divide kPageTokens, or with_mtp and the config has no MTP
  // layer or one with a compressor.
  static StateLayout of(const ModelConfig& cfg, bool with_mtp = false, RowFormat rows = RowFormat::f32);
  // Whether the config's dims fit the compact formats (nope = head_dim - rope a multiple of 64, index_head_dim of 32).
  static bool compact_fits(const ModelConfig& cfg);
  bool has_mtp() const { return mtp_layer >= 0; }
  // Pages holding the compressed rows of positions [0, n_positions).
  static int64_t pages_for(int64_t n_positions) { return (n_positions + kPageTokens - 1) / kPageTokens; }
};

}  // namespace dsv4
