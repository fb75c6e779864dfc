// Scheduler (engine/scheduler.h) without a model: a driver plays the engine loop (schedule, commit, one fake sampled
// token per chunk that reaches the end of its tokens) and checks the invariants of every step — the token budget,
// one item per slot, chunks that continue exactly where the state ends, pages covering every computed position and
// private wherever a chunk writes, chunks on 128-token boundaries — plus decode-first ordering, FCFS admission with
// bounded slots, prefix hits (cached token counts at shared lengths 127 ... 5000), preemption under a full pool
// (resumed from the cache, all sequences complete) and the failure of a sequence that cannot fit at all.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "engine/scheduler.h"

using namespace dsv4;

namespace {

constexpr int64_t B = PrefixCache::kBlockTokens;

std::vector<int32_t> toks(int64_t n, int salt) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t((i * 131 + salt * 977) % 5000);
  return v;
}

// Plays the engine: runs steps, appends a deterministic token per finished chunk, removes a sequence when it has
// generated `gen[id]` tokens. Checks the invariants of every step.
struct Driver {
  PrefixCache cache;
  Scheduler sched;
  std::map<uint64_t, int64_t> gen_target, generated;
  std::map<uint64_t, std::vector<int32_t>> outputs;  // generated tokens per finished sequence
  std::map<uint64_t, int64_t> cached;                // n_cached at finish
  std::vector<uint64_t> failed;
  int64_t steps = 0, max_step_tokens = 0;

  Driver(const SchedulerOptions& so, int64_t n_pages, int64_t n_snapshots) : cache({n_pages, n_snapshots, 1}), sched(so, cache) {}

  void add(uint64_t id, std::vector<int32_t> prompt, int64_t n_gen) {
    sched.add(id, std::move(prompt));
    gen_target[id] = n_gen;
  }

  Scheduler::Step step_once() {
    Scheduler::Step st = sched.schedule();
    check(st);
    for (uint64_t id : st.failed) failed.push_back(id);
    sched.commit(st);
    for (const auto& it : st.items) {
      if (!it.logits) continue;
      const Scheduler::Sequence* s = sched.find(it.id);
      const int32_t tok = int32_t((s->tokens.size() * 7 + it.id * 13) % 5000);  // a function of the position
      sched.append(it.id, tok);
      if (++generated[it.id] >= gen_target[it.id]) {
        const Scheduler::Sequence* f = sched.find(it.id);
        outputs[it.id].assign(f->tokens.begin() + f->n_prompt, f->tokens.end());
        cached[it.id] = f->n_cached;
        sched.remove(it.id);
      }
    }
    ++steps;
    return st;
  }

  void run(int64_t max_steps = 100000) {
    while (!sched.idle() && steps < max_steps) step_once();
    ASSERT_TRUE(sched.idle()) << "did not finish in " << max_steps << " steps";
  }

  void check(const Scheduler::Step& st) {
    const auto& o = sched.options();
    EXPECT_LE(st.n_tokens(), o.batch_tokens);
    max_step_tokens = std::max(max_step_tokens, st.n_tokens());
    std::set<int64_t> slots;
    for (const auto& it : st.items) {
      EXPECT_TRUE(slots.insert(it.slot).second) << "slot twice in a step";
      EXPECT_GE(it.slot, 0);
      EXPECT_LT(it.slot, o.max_running);
      const Scheduler::Sequence* s = sched.find(it.id);
      ASSERT_NE(s, nullptr);
      EXPECT_EQ(it.p0, s->n_computed);
      EXPECT_GE(it.n, 1);
      const int64_t end = it.p0 + it.n, len = int64_t(s->tokens.size());
      EXPECT_LE(end, len);
      EXPECT_EQ(it.logits, end == len);
      if (o.align_chunks && end < len) {
        EXPECT_EQ(end % B, 0) << "chunk ends off the 128 grid";
      }
      ASSERT_GE(int64_t(s->pages.size()), (end + B - 1) / B);
      for (int64_t k = it.p0 / B; k < (end + B - 1) / B; ++k)
        EXPECT_EQ(cache.refcount(s->pages[size_t(k)]), 1) << "a written page is shared";
      for (const auto& sn : it.snapshots) {
        EXPECT_EQ(sn.at % B, 0);
        EXPECT_GT(sn.at, it.p0);
        EXPECT_LE(sn.at, end);
      }
    }
    EXPECT_LE(cache.pages_referenced(), cache.n_pages());
  }
};

SchedulerOptions opts(int64_t max_running, int64_t budget) {
  SchedulerOptions o;
  o.max_running = max_running;
  o.batch_tokens = budget;
  return o;
}

}  // namespace

TEST(Scheduler, DecodesFirstThenAlignedPrefillChunks) {
  Driver d(opts(4, 200), 64, 16);
  d.add(1, toks(10, 1), 50);
  d.step_once();  // 1 prefills its 10 tokens
  d.add(2, toks(300, 2), 3);
  auto st = d.step_once();
  ASSERT_EQ(st.items.size(), 2u);
  EXPECT_EQ(st.items[0].id, 1u);  // the decode first
  EXPECT_EQ(st.items[0].n, 1);
  EXPECT_EQ(st.items[1].id, 2u);
  EXPECT_EQ(st.items[1].n, 128);  // 199 tokens of budget left: the chunk ends at 128
  EXPECT_FALSE(st.items[1].logits);
  st = d.step_once();
  EXPECT_EQ(st.items[1].p0, 128);
  EXPECT_EQ(st.items[1].n, 172);  // the rest of the prompt fits: the last chunk ends the prompt
  EXPECT_TRUE(st.items[1].logits);
  d.run();
  EXPECT_EQ(d.outputs[1].size(), 50u);
  EXPECT_EQ(d.outputs[2].size(), 3u);
}

TEST(Scheduler, SlotsBoundRunningSequencesAndAdmissionIsFcfs) {
  Driver d(opts(2, 512), 64, 16);
  for (uint64_t id = 1; id <= 5; ++id) d.add(id, toks(20 + int64_t(id), int(id)), 5 + int64_t(id));
  auto st = d.step_once();
  ASSERT_EQ(st.items.size(), 2u);
  EXPECT_EQ(st.items[0].id, 1u);
  EXPECT_EQ(st.items[1].id, 2u);
  EXPECT_EQ(d.sched.n_waiting(), 3u);
  std::vector<uint64_t> first_seen;
  while (!d.sched.idle()) {
    st = d.step_once();
    EXPECT_LE(st.items.size(), 2u);
    for (const auto& it : st.items)
      if (std::find(first_seen.begin(), first_seen.end(), it.id) == first_seen.end()) first_seen.push_back(it.id);
  }
  EXPECT_EQ(first_seen, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  for (uint64_t id = 1; id <= 5; ++id) EXPECT_EQ(d.outputs[id].size(), size_t(5 + id));
}

TEST(Scheduler, PrefixHitsReuseFullBlocksEndingInASnapshot) {
  for (int64_t shared : {127, 128, 129, 255, 256, 1000, 5000}) {
    Driver d(opts(2, 512), 256, 128);
    auto a = toks(shared + 30, 11);
    d.add(1, a, 4);
    d.run();
    EXPECT_EQ(d.cached[1], 0);
    auto b = std::vector<int32_t>(a.begin(), a.begin() + shared);
    auto tail = toks(50, 12);
    b.insert(b.end(), tail.begin(), tail.end());
    d.add(2, b, 4);
    auto st = d.step_once();
    ASSERT_FALSE(st.items.empty());
    const int64_t want = shared / B * B;
    EXPECT_EQ(st.items[0].p0, want) << "shared " << shared;
    ASSERT_EQ(st.restores.size(), 1u);
    EXPECT_EQ(st.restores[0].snapshot >= 0, want > 0);
    d.run();
    EXPECT_EQ(d.cached[2], want) << "shared " << shared;
    // the same prompt again: everything but the last token (floored to 128) is reused
    d.add(3, b, 2);
    d.run();
    EXPECT_EQ(d.cached[3], (int64_t(b.size()) - 1) / B * B) << "shared " << shared;
  }
}

TEST(Scheduler, GeneratedBlocksAreCachedForTheNextTurn) {
  Driver d(opts(2, 512), 64, 64);
  auto p1 = toks(100, 21);
  d.add(1, p1, 300);  // a long reply: positions up to 399 computed
  d.run();
  auto turn2 = p1;
  turn2.insert(turn2.end(), d.outputs[1].begin(), d.outputs[1].end());
  auto user = toks(40, 22);
  turn2.insert(turn2.end(), user.begin(), user.end());
  d.add(2, turn2, 2);
  d.run();
  EXPECT_EQ(d.cached[2], (100 + 300 - 1) / B * B);  // the reply's last token was never computed
}

TEST(Scheduler, FullPoolPreemptsTheNewestAndEverySequenceCompletes) {
  // 12 pages: three sequences that each grow to 4-5 pages cannot all run at once
  Driver d(opts(3, 256), 12, 32);
  d.add(1, toks(200, 31), 400);
  d.add(2, toks(150, 32), 400);
  d.add(3, toks(100, 33), 400);
  d.run();
  EXPECT_TRUE(d.failed.empty());
  EXPECT_GT(d.sched.preemptions(), 0);
  for (uint64_t id = 1; id <= 3; ++id) {
    EXPECT_EQ(d.outputs[id].size(), 400u);
    // the generated tokens are a function of the position only: the same as an uninterrupted run
    Driver solo(opts(1, 256), 12, 32);
    solo.add(id, toks(id == 1 ? 200 : id == 2 ? 150 : 100, int(30 + id)), 400);
    solo.run();
    EXPECT_EQ(solo.outputs[id], d.outputs[id]) << id;
  }
}

TEST(Scheduler, ASequenceLargerThanThePoolFailsInsteadOfRunningOutOfMemory) {
  Driver d(opts(2, 512), 3, 4);  // 3 pages = 384 positions
  d.add(1, toks(300, 41), 200);  // grows past 384
  d.add(2, toks(10, 42), 5);
  d.run();
  ASSERT_EQ(d.failed.size(), 1u);
  EXPECT_EQ(d.failed[0], 1u);
  EXPECT_EQ(d.outputs[2].size(), 5u);
  EXPECT_EQ(d.cache.pages_referenced(), 0);
}

TEST(Scheduler, SnapshotIntervalKeepsEveryNthBoundaryThePromptEndAndTheLatest) {
  SchedulerOptions o = opts(1, 128);
  o.snapshot_interval = 4;
  Driver d(o, 64, 64);
  d.add(1, toks(700, 51), 700);  // prompt end floored: 640; generation to 1400
  d.run();
  std::vector<int64_t> kept;
  auto t = toks(700, 51);
  t.insert(t.end(), d.outputs[1].begin(), d.outputs[1].end());
  BlockHash h = d.cache.root();
  for (int64_t k = 0; (k + 1) * B <= int64_t(t.size()); ++k) {
    h = block_hash(h, std::span<const int32_t>(t.data() + k * B, size_t(B)));
    if (d.cache.has_snapshot(h)) kept.push_back((k + 1) * B);
  }
  // every 4th block (512, 1024), the prompt end (640) and the latest boundary computed (1280 of 1399 positions)
  EXPECT_EQ(kept, (std::vector<int64_t>{512, 640, 1024, 1280}));
}

TEST(Scheduler, RejectsBadOptionsAndInput) {
  PrefixCache c({4, 0, 0});
  EXPECT_THROW(Scheduler(opts(0, 10), c), std::exception);
  EXPECT_THROW(Scheduler(opts(1, 0), c), std::exception);
  Scheduler s(opts(1, 10), c);
  EXPECT_THROW(s.add(1, {}), std::exception);
  s.add(1, {5});
  EXPECT_THROW(s.add(1, {5}), std::exception);
  s.remove(1);
  s.remove(77);  // unknown: no-op
  EXPECT_TRUE(s.idle());
}
