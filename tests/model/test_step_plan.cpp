// StepPlan::build and StepPlan::rebuild (model/step_plan.h) against the straightforward construction of
// naive_step_plan.h: every scalar and array equal (RoPE rows bitwise) for ragged batches of several sequences, chunk
// starts not at 0, positions beyond the RoPE cache's bound, verify pieces, snapshots, MTP and DSpark pools; one plan
// rebuilt through all of them in turn (nothing left over from a larger step); any thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/bitwise_equal.h"
#include "backend/parallel.h"
#include "loader/config.h"
#include "model/rope_cache.h"
#include "model/state_layout.h"
#include "model/step_plan.h"
#include "naive_step_plan.h"

namespace dsv4::test {
namespace {

ModelConfig config(const std::string& rel) { return load_config(std::string(DSV4_SOURCE_DIR) + "/tests/data/" + rel); }

void expect_same_plan(const StepPlan& got, const StepPlan& want, const std::string& what) {
#define SAME(f) expect_bitwise_equal(got.f, want.f, what + " " #f)
#define SAME_SCALAR(f) EXPECT_EQ(got.f, want.f) << what << " " #f
  SAME_SCALAR(n);
  SAME_SCALAR(window);
  SAME_SCALAR(rd);
  SAME_SCALAR(n_ring);
  SAME_SCALAR(mtp);
  SAME_SCALAR(dspark);
  ASSERT_EQ(got.pieces.size(), want.pieces.size()) << what;
  for (size_t i = 0; i < got.pieces.size(); ++i) {
    EXPECT_EQ(got.pieces[i].seq, want.pieces[i].seq) << what;
    EXPECT_EQ(got.pieces[i].slot, want.pieces[i].slot) << what;
    EXPECT_EQ(got.pieces[i].p0, want.pieces[i].p0) << what;
    EXPECT_EQ(got.pieces[i].tokens.data(), want.pieces[i].tokens.data()) << what;
    EXPECT_EQ(got.pieces[i].tokens.size(), want.pieces[i].tokens.size()) << what;
  }
  SAME(piece_t0);
  SAME(tokens);
  SAME(cs_plain);
  SAME(cs_yarn);
  SAME(win_idx);
  SAME(ring_src);
  SAME(ring_dst);
  SAME(group_fwd);
  SAME(group_back);
  SAME(iota);
  SAME(snap_ids);
  SAME(snap_ring_src);
  SAME(next);
  SAME(hc_rows);
  SAME(hid_src);
  SAME(hid_dst);
  SAME(stream_rows);
  SAME(cat_rows);
  SAME(spec_ring_src);
  SAME(spec_ring_dst);
  SAME(logit_rows);
  SAME(logit_seq);
  SAME(logit_pos);
  ASSERT_EQ(got.ratios.size(), want.ratios.size()) << what;
  for (size_t k = 0; k < got.ratios.size(); ++k) {
    const RatioPlan &g = got.ratios[k], &w = want.ratios[k];
    const std::string rw = what + " ratio " + std::to_string(w.m);
#undef SAME
#undef SAME_SCALAR
#define SAME(f) expect_bitwise_equal(g.f, w.f, rw + " " #f)
#define SAME_SCALAR(f) EXPECT_EQ(g.f, w.f) << rw << " " #f
    SAME_SCALAR(m);
    SAME_SCALAR(coff);
    SAME_SCALAR(rpp);
    SAME_SCALAR(nr);
    SAME_SCALAR(n_emit);
    SAME_SCALAR(max_visible);
    SAME_SCALAR(k_all);
    SAME_SCALAR(max_run);
    SAME(ape_row);
    SAME(cand);
    SAME(emit_cs);
    SAME(emit_dst);
    SAME(upd);
    SAME(upd_dst);
    SAME(n_visible);
    SAME(all_idx);
    SAME(key_pages);
    SAME(key_table);
    SAME(snap_src);
    SAME(bk_src);
    SAME(bk_dst);
    SAME(sp_src);
    SAME(sp_dst);
  }
#undef SAME
#undef SAME_SCALAR
  EXPECT_EQ(got.shape_key(), want.shape_key()) << what;
}

// One step's pieces with the token and page storage they point into.
struct Step {
  std::string name;
  const ModelConfig* cfg = nullptr;
  StateLayout layout;
  int64_t n_slots = 8;
  std::deque<std::vector<int32_t>> store;  // (a deque keeps its elements in place)
  Step() = default;
  Step(const Step&) = delete;
  std::vector<PlanPiece> pieces;

  // A piece of `n` tokens of sequence `seq` in `slot` from position p0, its pages a shuffled set of page ids;
  // logits wanted at every third position and the last, the MTP input unknown (-1) at every fifth.
  PlanPiece& add(size_t seq, int64_t slot, int64_t p0, int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    auto& tok = store.emplace_back(size_t(n));
    for (auto& t : tok) t = int32_t(2 + rng() % 1000);
    auto& pages = store.emplace_back(size_t(StateLayout::pages_for(p0 + n)));
    std::iota(pages.begin(), pages.end(), int32_t(seed % 7));
    std::shuffle(pages.begin(), pages.end(), rng);
    PlanPiece pc;
    pc.seq = seq;
    pc.slot = slot;
    pc.p0 = p0;
    pc.tokens = tok;
    pc.pages = pages;
    pc.want.resize(size_t(n));
    for (int64_t t = 0; t < n; ++t) pc.want[size_t(t)] = char(t % 3 == 0 || t == n - 1);
    if (layout.has_mtp()) {
      pc.next.resize(size_t(n));
      for (int64_t t = 0; t < n; ++t) pc.next[size_t(t)] = t % 5 == 4 ? -1 : int32_t(3 + t);
    }
    pieces.push_back(std::move(pc));
    return pieces.back();
  }
  // Snapshots at every multiple of 128 in (p0, p0 + n] of the last piece, ids from `id`.
  void snapshots(int64_t id) {
    PlanPiece& pc = pieces.back();
    for (int64_t at = (pc.p0 / 128 + 1) * 128; at <= pc.p0 + int64_t(pc.tokens.size()); at += 128)
      pc.snapshots.push_back({at, id++});
  }
};

struct Configs {
  ModelConfig a = config("tiny-a/config.json"), b = config("tiny-b/config.json");
  ModelConfig dspark = config("tiny-dspark/config.json"), flash = config("configs/deepseek-v4-flash-config.json");
};
const Configs& configs() {
  static const Configs c;
  return c;
}

// (a deque keeps each step, and so the storage its pieces point into, in place)
std::deque<Step> steps() {
  const Configs& c = configs();
  std::deque<Step> v;
  auto step = [&](const std::string& name, const ModelConfig& cfg, bool drafter) -> Step& {
    Step& s = v.emplace_back();
    s.name = name;
    s.cfg = &cfg;
    s.layout = StateLayout::of(cfg, drafter);
    return s;
  };
  {
    Step& s = step("prefill from 0 with snapshots (tiny-a)", c.a, false);
    s.add(0, 3, 0, 300, 1);
    s.snapshots(0);
  }
  {
    Step& s = step("ragged: decode, short and long chunks at odd starts (tiny-a)", c.a, false);
    s.add(0, 2, 1000, 1, 2);
    s.add(1, 0, 0, 37, 3);
    s.add(2, 5, 130, 200, 4);
    s.snapshots(3);
    s.add(3, 1, 4093, 7, 5);
    s.add(4, 7, 127, 1, 6);
  }
  {
    Step& s = step("ragged with MTP (tiny-b, window 64)", c.b, true);
    s.add(0, 4, 63, 66, 7);
    s.snapshots(0);
    s.add(1, 6, 5, 1, 8);
    s.add(2, 0, 256, 129, 9);
  }
  {
    Step& s = step("verify steps with MTP and a snapshot after the first token (tiny-a)", c.a, true);
    s.add(0, 1, 255, 3, 10).spec = true;
    s.pieces.back().snapshots.push_back({256, 2});
    s.add(1, 3, 1022, 5, 11).spec = true;
    s.add(2, 2, 40, 1, 12);
  }
  {
    Step& s = step("DSpark verify steps (tiny-dspark)", c.dspark, true);
    s.add(0, 0, 31, 6, 13).spec = true;
    s.add(1, 2, 700, 2, 14);
    s.add(2, 1, 0, 90, 15);
  }
  {
    Step& s = step("positions across the RoPE cache's bound (tiny-a)", c.a, false);
    s.add(0, 0, RopeCache::kMaxCached - 200, 300, 16);
    s.snapshots(0);
    s.add(1, 1, 2 * RopeCache::kMaxCached + 3, 2, 17);
  }
  {
    Step& s = step("V4-Flash: a 2,048-token chunk at 8,192 and a decode", c.flash, false);
    s.add(0, 0, 8192, 2048, 18);
    s.add(1, 1, 20000, 1, 19);
  }
  return v;
}

struct Ropes {
  RopeCache plain, yarn;
  explicit Ropes(const ModelConfig& cfg)
      : plain(RopeTable::for_ratio(cfg, 0), cfg.max_position_embeddings),
        yarn(RopeTable::for_ratio(cfg, 4), cfg.max_position_embeddings) {}
};

StepPlan naive(const Step& s) {
  return naive_step_plan(*s.cfg, s.layout, RopeTable::for_ratio(*s.cfg, 0), RopeTable::for_ratio(*s.cfg, 4),
                         s.n_slots, s.pieces);
}

TEST(StepPlan, BuildEqualsTheStraightforwardPlan) {
  for (const Step& s : steps()) {
    const Ropes r(*s.cfg);
    const StepPlan want = naive(s);
    expect_same_plan(StepPlan::build(*s.cfg, s.layout, r.plain, r.yarn, s.n_slots, s.pieces), want, s.name);
    // again, the RoPE rows now from the cache
    expect_same_plan(StepPlan::build(*s.cfg, s.layout, r.plain, r.yarn, s.n_slots, s.pieces), want,
                     s.name + " (cached)");
  }
}

TEST(StepPlan, OnePlanRebuiltThroughEveryShapeEqualsTheStraightforwardPlans) {
  const std::deque<Step> all = steps();
  std::vector<size_t> order(all.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::vector<size_t> seq = order;  // forward, backward, then shuffled: each step after larger and smaller ones
  seq.insert(seq.end(), order.rbegin(), order.rend());
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  seq.insert(seq.end(), order.begin(), order.end());
  std::vector<std::unique_ptr<Ropes>> ropes;
  for (const Step& s : all) ropes.push_back(std::make_unique<Ropes>(*s.cfg));
  StepPlan plan;
  for (size_t i : seq) {
    const Step& s = all[i];
    plan.rebuild(*s.cfg, s.layout, ropes[i]->plain, ropes[i]->yarn, s.n_slots, s.pieces);
    expect_same_plan(plan, naive(s), s.name + " (rebuilt)");
  }
}

TEST(StepPlan, SameForAnyThreadCount) {
  const int threads = max_threads();
  const std::deque<Step> all = steps();
  for (const Step& s : all) {
    const StepPlan want = naive(s);
    for (int t : {1, 2, 3, 5}) {
      set_num_threads(t);
      const Ropes r(*s.cfg);  // cold: the cache's chunks computed on t threads
      expect_same_plan(StepPlan::build(*s.cfg, s.layout, r.plain, r.yarn, s.n_slots, s.pieces), want,
                       s.name + " on " + std::to_string(t) + " threads");
    }
  }
  set_num_threads(threads);
}

}  // namespace
}  // namespace dsv4::test
