// The plan of one forward step (spec §5.4-4, §5.5, §5.10): everything the DeepSeek V4 forward pass decides from
// positions alone, built on the host before launch, uploaded to the device in one copy and shared by every layer.
// Only two decisions depend on data (indexer top-k, MoE routing); they happen inside ops. So a step runs on the
// device without a host round trip, and the CPU and CUDA backends consume exactly the same plan.
//
// One step = n tokens of one sequence at positions p0 .. p0+n-1 (a prefill chunk or a decode token). Index spaces:
//   window rows   [0, W) = the sequence's ring (slot = position % W), [W, W+n) = this step's fresh rows
//   state rows    compressor sources [0, n) = this step's projections, [n, n + coff*m) = the frontier state rows
//   compressed    row w of a ratio-m layer pools positions [w*m, (w+1)*m)
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "loader/config.h"
#include "model/rope.h"

namespace dsv4 {

// Per compress ratio m > 0 that the model uses (4: CSA, 128: HCA), shared by all layers of that ratio.
struct RatioPlan {
  int m = 0, coff = 1;
  std::vector<int32_t> ape_row;      // [n] = position % m (row of the compressor's ape)
  int64_t n_emit = 0;                // compressed rows completed in this step
  int64_t n_comp_before = 0;         // rows before the step (= p0 / m); the emitted rows follow
  std::vector<int32_t> cand;         // [n_emit, coff*m] pooling candidates in the state index space (-1: empty)
  std::vector<float> emit_cs;        // [n_emit, rd] RoPE (cos, sin) at each emitted row's first position
  std::vector<int32_t> upd;          // [coff*m] the new frontier rows, as sources in the state index space
  std::vector<int32_t> n_visible;    // [n] compressed rows visible to each token: (p + 1) / m
  int64_t max_visible = 0;
  int64_t k_all = 0;                 // HCA candidate lists (every visible row): max_visible columns
  std::vector<int32_t> all_idx;      // [n, k_all] (m != 4 only), -1 padded
};

struct StepPlan {
  int64_t n = 0, p0 = 0, window = 0, rd = 0;
  std::vector<int32_t> tokens;       // [n]
  std::vector<float> cs_plain;       // [n, rd] RoPE of ratio-0 layers (theta, no YaRN)
  std::vector<float> cs_yarn;        // [n, rd] RoPE of compressed layers (compress theta + YaRN)
  std::vector<int32_t> win_idx;      // [n, window] oldest -> newest, -1 padded
  std::vector<int32_t> ring_src;     // ring writes: fresh row ring_src[i] -> ring slot ring_dst[i]
  std::vector<int32_t> ring_dst;
  std::vector<int32_t> group_fwd;    // [n*G] token-major [n, G] rows -> group-major [G, n] (wo_a input)
  std::vector<int32_t> group_back;   // [n*G] group-major -> token-major (wo_a output)
  std::vector<RatioPlan> ratios;     // one per distinct compress ratio > 0 of the model
  std::vector<int32_t> logit_rows;   // rows whose next-token logits are wanted
  std::vector<int64_t> logit_pos;    // their positions

  const RatioPlan* ratio(int m) const;

  static StepPlan build(const ModelConfig& cfg, const RopeTable& plain, const RopeTable& yarn, int64_t p0,
                        std::span<const int32_t> tokens, const std::vector<char>& want_logits);
};

// The plan's arrays on the device: one upload into workspace memory. Pointers are null for empty arrays.
struct DeviceRatioPlan {
  const int32_t *ape_row = nullptr, *cand = nullptr, *upd = nullptr, *n_visible = nullptr, *all_idx = nullptr;
  const float* emit_cs = nullptr;
};
struct DevicePlan {
  const int32_t *tokens = nullptr, *win_idx = nullptr, *ring_src = nullptr, *ring_dst = nullptr;
  const int32_t *group_fwd = nullptr, *group_back = nullptr, *logit_rows = nullptr;
  const float *cs_plain = nullptr, *cs_yarn = nullptr;
  std::vector<DeviceRatioPlan> ratios;  // parallel to StepPlan::ratios

  // Copy every array of `p` into `ws` memory of `be` with one host-to-device copy.
  static DevicePlan upload(const StepPlan& p, Backend& be, Workspace& ws);
};

}  // namespace dsv4
