// StatePool: the device storage of the sequence state of many sequences (layout: model/state_layout.h) — a fixed
// number of slots (one per running sequence: window rings + compressor frontiers), of 128-token pages (compressed
// attention rows + indexer keys, shareable between sequences once full) and of boundary snapshots (the slot state at
// a 128-aligned position, for the prefix cache). Per layer and kind one buffer on the backend's device, so that a
// forward step addresses every sequence of a batch through index lists into the same buffers (model/step_plan.h):
//
// (KV = layout().kv_row, K = layout().key_row: stored rows, fp32 or compact — model/state_layout.h)
//   ring      [n_slots * window, KV]                     row slot * window + position % window
//   cmp_k/s   [n_slots * coff*ratio, coff*head_dim]      row slot * coff*ratio + r        (ratio > 0)
//   idx_k/s   [n_slots * 8, 2*index_head_dim]            row slot * 8 + r                 (ratio 4: indexer compressor)
//   comp      [n_pages * rows_per_page, KV]              row page * rows_per_page + w % rows_per_page   (ratio > 0)
//   keys      [n_pages * rows_per_page, K]               the same rows (ratio 4)
//   snap_ring [n_snapshots * window, KV]                 row snapshot * window + ring slot
//   snap_cmp_k/s, snap_idx_k/s  [n_snapshots * ratio, coff*c]  frontier rows [0, ratio) (ratio 4)
// With a drafter (StatePoolOptions::drafter; R = layout().spec_rows, U = Layer::changed_rows(R)):
//   hidden    [n_slots * R, hc*D]                        (MTP only) row slot * R + position % R: pre-head streams
//   spec_ring [n_slots * R, KV]                          row slot * R + j: ring row a verify step overwrote at p0 + j
//   spec_cmp_k/s, spec_idx_k/s [n_slots * (U + R), coff*c]  rows [0, U): frontier rows before a verify step (in the
//             order of the step plan's changed rows), rows [U, U + R): the step's projections of p0 + j
//
// The pool is storage only: which slot, page or snapshot belongs to whom is decided by its owner (a SequenceState
// for the single-sequence API; the prefix cache and scheduler of src/engine for many sequences). Row ids are int32
// (checked at construction); element offsets are computed in 64 bits. Copying deep-copies every buffer.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "loader/config.h"
#include "model/state_layout.h"

namespace dsv4 {

struct StatePoolOptions {
  int64_t n_slots = 1;
  int64_t n_pages = 0;
  int64_t n_snapshots = 0;
  bool drafter = false;              // the drafter's layers (MTP or DSpark) and the speculation rows
                                     // (StateLayout::of(cfg, true))
  RowFormat rows = RowFormat::f32;   // how ring / compressed / key rows are stored (Model::make_pool sets it)
};

class StatePool {
 public:
  struct LayerBuffers {
    Buffer ring, cmp_k, cmp_s, idx_k, idx_s, comp, keys;
    Buffer snap_ring, snap_cmp_k, snap_cmp_s, snap_idx_k, snap_idx_s;
    Buffer spec_ring, spec_cmp_k, spec_cmp_s, spec_idx_k, spec_idx_s;
  };

  StatePool() = default;
  // Every ring zero, every frontier reset (k = 0, s = -inf). Throws dsv4::Error when row ids would overflow int32
  // or the backend is out of memory.
  StatePool(const ModelConfig& cfg, Backend& be, const StatePoolOptions& opts);

  const StateLayout& layout() const { return layout_; }
  Backend* backend() const { return be_; }
  int64_t n_slots() const { return n_slots_; }
  int64_t n_pages() const { return n_pages_; }
  int64_t n_snapshots() const { return n_snapshots_; }
  LayerBuffers& layer(int l) { return layers_[size_t(l)]; }
  const LayerBuffers& layer(int l) const { return layers_[size_t(l)]; }
  // Speculation hidden rows (empty without the MTP layer).
  Buffer& hidden() { return hidden_; }
  const Buffer& hidden() const { return hidden_; }
  // Bytes of device memory held.
  size_t bytes() const;

  // Slot `slot` as a fresh sequence: ring zero, frontiers reset.
  void reset_slot(int64_t slot);
  // Slot `slot` as the state at the snapshot's position (the pages up to it are the caller's business): reset, then
  // the snapshot's rings and frontier rows copied in. Queued on the backend in order with the forward steps.
  void restore_snapshot(int64_t snapshot, int64_t slot);
  // Copy slot `from` to slot `to` (ring + frontiers).
  void copy_slot(int64_t from, int64_t to);
  // Grow the page capacity to at least n_pages, keeping every page's rows (the single-sequence state grows so).
  void grow_pages(int64_t n_pages);

  // A copy of one slot (ring + frontiers of every layer): rewind checkpoints of the single-sequence API.
  struct SlotCopy {
    std::vector<Buffer> buffers;  // per layer: ring, cmp_k, cmp_s, idx_k, idx_s (empty where absent)
    size_t bytes() const;
  };
  SlotCopy save_slot(int64_t slot) const;
  void load_slot(const SlotCopy& copy, int64_t slot);

 private:
  void check_slot(int64_t slot) const;
  StateLayout layout_;
  Backend* be_ = nullptr;
  int64_t n_slots_ = 0, n_pages_ = 0, n_snapshots_ = 0;
  std::vector<LayerBuffers> layers_;
  Buffer hidden_;
};

}  // namespace dsv4
