// StepPlan::shape_key, the key of recorded forward steps (CUDA graphs, backend/step_graphs.h): decode steps of one
// sequence whose host-side shape is the same (same phase of the ratio-4 compressor, same 256-row indexer bucket,
// same HCA candidate count) get equal keys, so a decode replays a few recordings; steps that differ in anything host
// code passes to ops (compressed rows emitted, HCA list width, indexer bucket, batch size, snapshots) get different
// keys.
#include <gtest/gtest.h>

#include <numeric>

#include "loader/config.h"
#include "model/rope_cache.h"
#include "model/state_layout.h"
#include "model/step_plan.h"

namespace dsv4::test {
namespace {

struct Plans {
  ModelConfig cfg = load_config(std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a/config.json");
  StateLayout layout = StateLayout::of(cfg);
  RopeCache plain{RopeTable::for_ratio(cfg, 0), cfg.max_position_embeddings};
  RopeCache yarn{RopeTable::for_ratio(cfg, 4), cfg.max_position_embeddings};
  std::vector<int32_t> pages = std::vector<int32_t>(128);
  std::vector<int32_t> tok = std::vector<int32_t>(8, 5);
  Plans() { std::iota(pages.begin(), pages.end(), 0); }

  // The key of one decode step of `n_seq` sequences (slots 0..n_seq-1) at position p; `snapshot`: one snapshot.
  std::vector<int64_t> key(int64_t p, int n_seq = 1, bool snapshot = false) const {
    std::vector<PlanPiece> pieces;
    for (int i = 0; i < n_seq; ++i) {
      PlanPiece pc;
      pc.seq = size_t(i);
      pc.slot = i;
      pc.p0 = p;
      pc.tokens = std::span<const int32_t>(tok.data() + i, 1);
      pc.pages = pages;
      pc.want = {1};
      if (snapshot && i == 0) pc.snapshots.push_back({p + 1, 0});
      pieces.push_back(std::move(pc));
    }
    return StepPlan::build(cfg, layout, plain, yarn, 8, std::move(pieces)).shape_key();
  }
};

TEST(StepPlanKey, DecodeShapesRepeatEveryFourPositions) {
  const Plans P;
  for (int64_t p : {1100, 1101, 1102, 1103, 4100, 4101, 4102, 4103}) EXPECT_EQ(P.key(p), P.key(p + 4)) << p;
  // p % 4 == 3 completes a ratio-4 window (one compressed row emitted): a different shape than p % 4 == 0
  EXPECT_NE(P.key(4100), P.key(4103));
}

TEST(StepPlanKey, ShapesChangeWithTheHcaListTheIndexerBucketTheBatchAndSnapshots) {
  const Plans P;
  // ratio 128: (p + 1) / 128 visible rows = the HCA candidate list width (p 1150 -> 8 rows, 1154 -> 9)
  EXPECT_NE(P.key(1150), P.key(1154));
  // ratio 4: (p + 1) / 4 visible rows, bucketed by 256: 1023 and 1024 rows share a bucket, 1025 does not
  EXPECT_EQ(StepPlan::visible_bucket(1023), StepPlan::visible_bucket(1024));
  EXPECT_NE(StepPlan::visible_bucket(1024), StepPlan::visible_bucket(1025));
  EXPECT_EQ(StepPlan::visible_bucket(0), 0);
  EXPECT_EQ(StepPlan::visible_bucket(1), 256);
  // p 4095 and 4099: same phase, same HCA width (32), indexer rows 1024 -> bucket 1024, 1025 -> bucket 1280
  EXPECT_NE(P.key(4095), P.key(4099));
  EXPECT_NE(P.key(4100, 1), P.key(4100, 2));
  EXPECT_NE(P.key(4223, 1, false), P.key(4223, 1, true));  // a snapshot at 4224
}

}  // namespace
}  // namespace dsv4::test
