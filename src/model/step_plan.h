// The plan of one forward step (spec §5.4-4, §5.5, §5.10): everything the DeepSeek V4 forward pass decides from
// positions alone, built on the host before launch, uploaded to the device in one copy and shared by every layer.
// Only two decisions depend on data (indexer top-k, MoE routing); they happen inside ops. So a step runs on the
// device without a host round trip, and the CPU and CUDA backends consume exactly the same plan.
//
// One step = n tokens of several sequences (a ragged batch, model/batch.h): sequence i contributes tokens
// [t0_i, t0_i + n_i) of the step at positions p0_i .. p0_i + n_i - 1, its state in slot s_i of a StatePool
// (model/state_pool.h) and its compressed rows in the pages of its page table. Index spaces (all int32):
//   window rows   [0, n_ring) = the pool's rings (row s * W + position % W), [n_ring, n_ring + n) = this step's rows
//   state rows    compressor sources [0, n) = this step's projections, [n, n + n_slots * coff*m) = the pool's
//                 frontier rows (row n + s * coff*m + r)
//   pool rows     compressed row w of sequence i = page_table_i[w / rpp] * rpp + w % rpp (rpp = 128 / m)
// Every list of a token names rows of its own sequence only, in an order that depends on positions alone, so each
// sequence's result is independent of what else shares the step.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "loader/config.h"
#include "model/rope_cache.h"
#include "model/state_layout.h"

namespace dsv4 {

// One sequence's tokens in a step (a whole BatchSeq or the part of it that falls into one ubatch).
struct PlanPiece {
  size_t seq = 0;                    // index of the sequence in its Batch (reported with its logits)
  int64_t slot = 0, p0 = 0;
  std::span<const int32_t> tokens;
  std::span<const int32_t> pages;
  std::vector<char> want;            // [n] logits wanted
  std::vector<int32_t> next;         // [n] or empty: the token after each position (MTP input; < 0: unknown)
  bool spec = false;                 // a verify step (BatchSeq::spec): save what rollback needs
  struct Snapshot {
    int64_t at = 0, id = 0;          // state at position `at` (p0 < at <= p0 + n, a multiple of 128) -> snapshot id
  };
  std::vector<Snapshot> snapshots;
};

// Per compress ratio m > 0 that the model uses (4: CSA, 128: HCA), shared by all layers of that ratio.
struct RatioPlan {
  int m = 0, coff = 1;
  int64_t rpp = 0;                   // compressed rows per page
  int64_t nr = 0;                    // frontier rows per slot (coff * m)
  std::vector<int32_t> ape_row;      // [n] = position % m (row of the compressor's ape)
  int64_t n_emit = 0;                // compressed rows completed in this step (all sequences)
  std::vector<int32_t> cand;         // [n_emit, nr] pooling candidates in the state index space (-1: empty)
  std::vector<float> emit_cs;        // [n_emit, rd] RoPE (cos, sin) at each emitted row's first position
  std::vector<int32_t> emit_dst;     // [n_emit] pool row of each emitted row
  std::vector<int32_t> upd;          // [n_upd] the frontier rows that change, as sources in the state index space
  std::vector<int32_t> upd_dst;      // [n_upd] their pool frontier rows (rows that keep their value are left out)
  std::vector<int32_t> n_visible;    // [n] compressed rows visible to each token: (p + 1) / m
  int64_t max_visible = 0;
  int64_t k_all = 0;                 // HCA candidate lists (every visible row): max_visible columns
  std::vector<int32_t> all_idx;      // [n, k_all] (m != 4 only) pool rows, -1 padded
  std::vector<int32_t> key_pages;    // (m == 4) the sequences' page tables, concatenated
  std::vector<int32_t> key_table;    // (m == 4) [n] start of each token's page table in key_pages
  int64_t max_run = 0;               // most tokens of one sequence in the step
  std::vector<int32_t> snap_src;     // (coff == 2) [n_snap, m] frontier rows [0, m) at each snapshot, as sources
  // verify steps (spec pieces, pool with a drafter): changed frontier rows -> speculation rows [0, U), and the
  // step's projections -> speculation rows [U, U + R) (model/speculation.h)
  std::vector<int32_t> bk_src, bk_dst;  // pool frontier rows -> speculation rows
  std::vector<int32_t> sp_src, sp_dst;  // step rows -> speculation rows
};

struct StepPlan {
  int64_t n = 0, window = 0, rd = 0, n_ring = 0;
  std::vector<PlanPiece> pieces;
  std::vector<int64_t> piece_t0;     // [n_pieces] first step row of each piece
  std::vector<int32_t> tokens;       // [n]
  std::vector<float> cs_plain;       // [n, rd] RoPE of ratio-0 layers (theta, no YaRN)
  std::vector<float> cs_yarn;        // [n, rd] RoPE of compressed layers (compress theta + YaRN)
  std::vector<int32_t> win_idx;      // [n, window] oldest -> newest, -1 padded
  std::vector<int32_t> ring_src;     // ring writes: fresh row ring_src[i] -> pool ring row ring_dst[i]
  std::vector<int32_t> ring_dst;
  std::vector<int32_t> group_fwd;    // [n*G] token-major [n, G] rows -> group-major [G, n] (wo_a input)
  std::vector<int32_t> group_back;   // [n*G] group-major -> token-major (wo_a output)
  std::vector<RatioPlan> ratios;     // one per distinct compress ratio > 0 of the model
  std::vector<int32_t> iota;         // 0, 1, 2, ... (scatter sources)
  std::vector<int64_t> snap_ids;     // [n_snap] snapshot ids taken in this step
  std::vector<int32_t> snap_ring_src;  // [n_snap, window] ring slot r at the snapshot, in the window index space
  // MTP (pool with the MTP layer): the token after each row (embedded as the MTP input; 0 where unknown), the
  // stream -> token row map [n*hc], the hidden rows kept per slot (step row -> pool hidden row)
  bool mtp = false;
  std::vector<int32_t> next;
  std::vector<int32_t> hc_rows;
  std::vector<int32_t> hid_src, hid_dst;
  // DSpark (pool with its stages, docs/dspark.md): the stream rows of the hidden streams [n, hc, D] seen as [n*hc, D],
  // one list per stream j ([hc, n]: t*hc + j), and the rows of the concatenated target hiddens [n, T, D] seen as
  // [n*T, D], one list per target layer i ([T, n]: t*T + i); iota covers n
  bool dspark = false;
  std::vector<int32_t> stream_rows;
  std::vector<int32_t> cat_rows;
  // verify steps (pool with a drafter): the ring rows they overwrite (pool ring row -> speculation row)
  std::vector<int32_t> spec_ring_src, spec_ring_dst;
  std::vector<int32_t> logit_rows;   // rows whose next-token logits are wanted
  std::vector<size_t> logit_seq;     // their batch sequence
  std::vector<int64_t> logit_pos;    // their positions

  const RatioPlan* ratio(int m) const;

  // What host code derives from the plan besides the contents of its arrays: the size of every array, the counts
  // and scalars passed to ops, the snapshot ids (pointer offsets). Two plans with equal keys queue the same kernels
  // with the same arguments once uploaded to the same address (recorded steps, backend/step_graphs.h). The ratio-4
  // max_visible enters as its bucket (see visible_bucket).
  std::vector<int64_t> shape_key() const;
  // max_visible rounded up to a multiple of 256 (the indexer's key tile): the indexer's results do not depend on
  // max_visible beyond bounding every n_visible, so recorded steps pass the bucket and replay for 1,024 positions.
  static int64_t visible_bucket(int64_t max_visible) { return (max_visible + 255) / 256 * 256; }

  // n_slots: the pool's slot count (ring and frontier index spaces); plain, yarn: the RoPE rows of ratio-0 and of
  // compressed layers.
  static StepPlan build(const ModelConfig& cfg, const StateLayout& layout, const RopeCache& plain,
                        const RopeCache& yarn, int64_t n_slots, std::vector<PlanPiece> pieces);
  // The same plan, built into this one: every field is set anew, the arrays keep their capacity (a step of the
  // shape of the one before allocates nothing and writes each element once; the plan of a long prefill is ~12 MB).
  void rebuild(const ModelConfig& cfg, const StateLayout& layout, const RopeCache& plain, const RopeCache& yarn,
               int64_t n_slots, std::vector<PlanPiece> pieces);
};

// The plan's arrays on the device: one upload into workspace memory. Pointers are null for empty arrays.
struct DeviceRatioPlan {
  const int32_t *ape_row = nullptr, *cand = nullptr, *emit_dst = nullptr, *upd = nullptr, *upd_dst = nullptr;
  const int32_t *n_visible = nullptr, *all_idx = nullptr, *key_pages = nullptr, *key_table = nullptr;
  const int32_t* snap_src = nullptr;
  const int32_t *bk_src = nullptr, *bk_dst = nullptr, *sp_src = nullptr, *sp_dst = nullptr;
  const float* emit_cs = nullptr;
};
struct DevicePlan {
  const int32_t *tokens = nullptr, *win_idx = nullptr, *ring_src = nullptr, *ring_dst = nullptr;
  const int32_t *group_fwd = nullptr, *group_back = nullptr, *logit_rows = nullptr, *iota = nullptr;
  const int32_t* snap_ring_src = nullptr;
  const int32_t *next = nullptr, *hc_rows = nullptr, *hid_src = nullptr, *hid_dst = nullptr;
  const int32_t *stream_rows = nullptr, *cat_rows = nullptr;
  const int32_t *spec_ring_src = nullptr, *spec_ring_dst = nullptr;
  const float *cs_plain = nullptr, *cs_yarn = nullptr;
  std::vector<DeviceRatioPlan> ratios;  // parallel to StepPlan::ratios

  // Copy every array of `p` into `ws` memory of `be` with one host-to-device copy.
  // staging: a host buffer kept by the caller across steps for the packed arrays (nullptr: a fresh one per call).
  static DevicePlan upload(const StepPlan& p, Backend& be, Workspace& ws, std::vector<uint8_t>* staging = nullptr);
};

}  // namespace dsv4
