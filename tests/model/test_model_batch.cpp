// Batched forward (Model::forward(const Batch&, StatePool&, ...)) against the single-sequence path, bitwise
// (known-failure-modes §B, §C): a sequence's logits do not depend on the 1, 7 or 31 other sequences of its steps, on
// its slot, on its place in the batch, on where its pages lie in the pool, on the ubatch split or on where its
// chunks start; snapshots taken inside a step restore a state from which continuing equals a cold run (prefix
// reuse at shared lengths 127 ... 5000); a batch with a bad slot, page or snapshot is refused.
#include <numeric>

#include "model_test_util.h"
#include "model/batch.h"
#include "model/state_pool.h"

namespace dsv4::test {
namespace {

const std::string kDemo = std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo";

const Model& demo(Numerics num) {
  static std::map<int, std::unique_ptr<Model>> cache;
  auto& m = cache[int(num)];
  if (!m) {
    (void)tiny("tiny-a", num);  // same single-thread policy as the tiny models
    ModelOptions o;
    o.numerics = num;
    m = Model::load(kDemo, o);
  }
  return *m;
}

const Model& model_named(const std::string& name, Numerics num) {
  return name == "demo" ? demo(num) : tiny(name, num);
}

// A pool with per-slot page tables taken from a shuffled free list (so pages of a sequence are scattered).
struct Pool {
  StatePool pool;
  std::vector<std::vector<int32_t>> pages;  // per slot
  std::vector<int32_t> free;
  Pool(const Model& m, int64_t n_slots, int64_t n_pages, int64_t n_snapshots, uint32_t seed)
      : pool(m.make_pool({n_slots, n_pages, n_snapshots})), pages(size_t(n_slots)) {
    free.resize(size_t(n_pages));
    std::iota(free.begin(), free.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(free.begin(), free.end(), rng);
  }
  void ensure(int64_t slot, int64_t n_positions) {
    auto& p = pages[size_t(slot)];
    while (int64_t(p.size()) < StateLayout::pages_for(n_positions)) {
      ASSERT_FALSE(free.empty());
      p.push_back(free.back());
      free.pop_back();
    }
  }
};

// One sequence of a multi-sequence run: tokens, the chunk sizes it is fed in, the step at which it starts.
struct Seq {
  std::vector<int32_t> ids;
  std::vector<int64_t> chunks;
  int64_t start_step = 0, slot = 0;
  bool collect = false;            // the target: logits of every position are kept
  std::vector<int64_t> keep;       // positions whose logits are kept (empty + collect: all)
  // progress
  size_t next = 0;
  int64_t done = 0;
};

std::vector<int64_t> random_chunks(int64_t n, std::mt19937& rng, int64_t max_chunk) {
  std::vector<int64_t> c;
  std::uniform_int_distribution<int64_t> d(1, max_chunk);
  for (int64_t done = 0; done < n;) {
    const int64_t k = std::min(n - done, d(rng));
    c.push_back(k);
    done += k;
  }
  return c;
}

// Runs every sequence to its end, one batch per step (order shuffled per step); returns the target's logits.
std::map<int64_t, std::vector<float>> run_batched(const Model& m, std::vector<Seq>& seqs, int64_t n_slots,
                                                  uint32_t seed) {
  int64_t total = 0;
  for (const Seq& s : seqs) total += StateLayout::pages_for(int64_t(s.ids.size()));
  Pool pool(m, n_slots, total + 2, 0, seed);
  std::mt19937 rng(seed + 1);
  std::map<int64_t, std::vector<float>> got;
  for (int64_t step = 0;; ++step) {
    Batch b;
    std::vector<size_t> owner;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = seqs[i];
      if (step < s.start_step || s.next >= s.chunks.size()) continue;
      const int64_t n = s.chunks[s.next];
      pool.ensure(s.slot, s.done + n);
      BatchSeq bs;
      bs.slot = s.slot;
      bs.p0 = s.done;
      bs.tokens = std::span<const int32_t>(s.ids.data() + s.done, size_t(n));
      bs.pages = pool.pages[size_t(s.slot)];
      if (s.collect) {
        bs.logits = BatchSeq::Logits::mask;
        bs.mask.assign(size_t(n), 0);
        for (int64_t j = 0; j < n; ++j)
          bs.mask[size_t(j)] = s.keep.empty() || std::count(s.keep.begin(), s.keep.end(), s.done + j) ? 1 : 0;
      } else {
        bs.logits = (i % 2) ? BatchSeq::Logits::last : BatchSeq::Logits::none;
      }
      b.seqs.push_back(std::move(bs));
      owner.push_back(i);
    }
    if (b.seqs.empty()) break;
    std::vector<size_t> order(b.seqs.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    Batch sh;
    std::vector<size_t> sh_owner;
    for (size_t k : order) {
      sh.seqs.push_back(b.seqs[k]);
      sh_owner.push_back(owner[k]);
    }
    m.forward(sh, pool.pool, [&](size_t si, int64_t pos, std::span<const float> lg, bool finite) {
      EXPECT_TRUE(finite);
      if (seqs[sh_owner[si]].collect) got[pos].assign(lg.begin(), lg.end());
    });
    for (size_t k = 0; k < sh.seqs.size(); ++k) {
      Seq& s = seqs[sh_owner[k]];
      s.done += sh.seqs[k].n();
      ++s.next;
    }
  }
  return got;
}

// Cold single-sequence prefill of `ids`; the logits of the positions `want` accepts.
std::map<int64_t, std::vector<float>> cold_logits(const Model& m, const std::vector<int32_t>& ids,
                                                  const std::function<bool(int64_t)>& want) {
  SequenceState st = m.fresh_state();
  std::map<int64_t, std::vector<float>> out;
  m.forward(st, ids, want, [&](int64_t p, std::span<const float> lg) { out[p].assign(lg.begin(), lg.end()); });
  return out;
}

using Param = std::tuple<std::string, Numerics>;
class BatchInvariance : public ::testing::TestWithParam<Param> {
 protected:
  const Model& model() const { return model_named(std::get<0>(GetParam()), std::get<1>(GetParam())); }
  bool is_demo() const { return std::get<0>(GetParam()) == "demo"; }
};

// The target alone and with 1, 7 and 31 other sequences (random lengths, chunkings and start steps, some decoding
// token by token), in varying slots and chunkings of its own: logits bitwise equal to one cold prefill.
TEST_P(BatchInvariance, LogitsIndependentOfOtherSequencesAndChunkStarts) {
  const Model& m = model();
  const int32_t V = m.n_vocab();
  const int64_t L = is_demo() ? 200 : 300;
  const auto x = random_ids(L, V, 31);
  std::vector<int64_t> keep;  // demo: a subset of positions (the 129k-entry head is the expensive part)
  if (is_demo())
    for (int64_t p = 0; p < L; ++p)
      if (p % 9 == 0 || (p % 128) >= 125 || (p % 128) <= 4 || p + 3 >= L) keep.push_back(p);
  const auto cold = cold_logits(m, x, [&](int64_t p) { return keep.empty() || std::count(keep.begin(), keep.end(), p); });

  struct Case {
    int others;
    std::vector<int64_t> target_chunks;
    const char* what;
  };
  std::mt19937 rng(77);
  std::vector<Case> cases;
  cases.push_back({0, {L}, "alone, one prefill"});
  cases.push_back({1, random_chunks(L, rng, 70), "1 other, random chunks"});
  cases.push_back({7, random_chunks(L, rng, 200), "7 others, random chunks"});
  {
    std::vector<int64_t> dec{5};  // a 5-token prompt, then decode one token per step
    for (int64_t i = 5; i < L; ++i) dec.push_back(1);
    cases.push_back({is_demo() ? 7 : 31, dec, "31 others, decode"});
  }
  if (!is_demo()) cases.push_back({31, random_chunks(L, rng, 129), "31 others, random chunks"});
  for (const Case& c : cases) {
    std::vector<Seq> seqs;
    const int64_t n_slots = c.others + 3;
    std::vector<int64_t> slots(static_cast<size_t>(n_slots));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    Seq t;
    t.ids = x;
    t.chunks = c.target_chunks;
    t.collect = true;
    t.keep = keep;
    t.slot = slots[0];
    seqs.push_back(t);
    for (int o = 0; o < c.others; ++o) {
      Seq s;
      const int64_t len = std::uniform_int_distribution<int64_t>(1, is_demo() ? 160 : 400)(rng);
      s.ids = random_ids(len, V, uint32_t(1000 + o));
      s.chunks = (o % 3 == 2) ? std::vector<int64_t>(size_t(len), 1) : random_chunks(len, rng, 150);
      s.start_step = std::uniform_int_distribution<int64_t>(0, 6)(rng);
      s.slot = slots[size_t(o + 1)];
      seqs.push_back(std::move(s));
    }
    const auto got = run_batched(m, seqs, n_slots, uint32_t(c.others * 13 + 5));
    const std::vector<int64_t> want = keep.empty() ? [&] {
      std::vector<int64_t> a(static_cast<size_t>(L));
      std::iota(a.begin(), a.end(), 0);
      return a;
    }() : keep;
    ASSERT_EQ(got.size(), want.size()) << c.what;
    for (int64_t p : want) {
      auto it = got.find(p);
      ASSERT_NE(it, got.end()) << c.what << " position " << p;
      ASSERT_TRUE(it->second == cold.at(p)) << c.what << ": logits differ at position " << p;
    }
  }
}

// Snapshots taken inside steps at 128-aligned positions + the pages of the prefix: a second sequence sharing a
// prefix of length L starts from the snapshot at floor(L / 128) * 128 (the shared pages stay where they are, read
// by both) and continues; its logits equal a cold run of its own tokens bitwise. The first sequence keeps going
// after the fork and is unaffected.
TEST_P(BatchInvariance, SnapshotRestoreEqualsColdRun) {
  const Model& m = model();
  const int32_t V = m.n_vocab();
  std::vector<int64_t> shared = {127, 128, 129, 255, 256, 1000};
  if (!is_demo()) shared.push_back(5000);
  for (int64_t L : shared) {
    const int64_t tail = 40;
    auto a = random_ids(L + tail, V, uint32_t(500 + L));
    auto bt = random_ids(tail, V, uint32_t(900 + L));
    std::vector<int32_t> b(a.begin(), a.begin() + L);
    b.insert(b.end(), bt.begin(), bt.end());
    const int64_t n_pages = 2 * StateLayout::pages_for(L + tail) + 2;
    const int64_t n_blocks = L / 128;
    Pool pool(m, 2, n_pages, n_blocks + 1, uint32_t(L));
    // A: chunks of 300 with snapshots at every 128-aligned position
    std::map<int64_t, int64_t> snap_of;  // position -> snapshot id
    for (int64_t done = 0; done < int64_t(a.size());) {
      const int64_t n = std::min<int64_t>(300, int64_t(a.size()) - done);
      pool.ensure(0, done + n);
      Batch bt1;
      BatchSeq s;
      s.slot = 0;
      s.p0 = done;
      s.tokens = std::span<const int32_t>(a.data() + done, size_t(n));
      s.pages = pool.pages[0];
      s.logits = BatchSeq::Logits::none;
      for (int64_t at = (done / 128 + 1) * 128; at <= done + n; at += 128)
        if (at / 128 <= n_blocks) {
          const int64_t id = int64_t(snap_of.size());
          snap_of[at] = id;
          s.snapshots.push_back({at, id});
        }
      bt1.seqs.push_back(s);
      m.forward(bt1, pool.pool, nullptr);
      done += n;
    }
    // B: shares A's first n_blocks pages, starts from the snapshot (or from scratch below 128)
    const int64_t hit = n_blocks * 128;
    if (hit > 0) {
      pool.pool.restore_snapshot(snap_of.at(hit), 1);
      pool.pages[1].assign(pool.pages[0].begin(), pool.pages[0].begin() + n_blocks);
    }
    std::map<int64_t, std::vector<float>> got;
    for (int64_t done = hit; done < int64_t(b.size());) {
      const int64_t n = std::min<int64_t>(37, int64_t(b.size()) - done);
      pool.ensure(1, done + n);
      Batch bt2;
      BatchSeq s;
      s.slot = 1;
      s.p0 = done;
      s.tokens = std::span<const int32_t>(b.data() + done, size_t(n));
      s.pages = pool.pages[1];
      s.logits = BatchSeq::Logits::all;
      bt2.seqs.push_back(s);
      m.forward(bt2, pool.pool, [&](size_t, int64_t pos, std::span<const float> lg, bool finite) {
        EXPECT_TRUE(finite);
        if (pos >= L - 2) got[pos].assign(lg.begin(), lg.end());
      });
      done += n;
    }
    // cold runs of b's tokens (only the tail positions are compared)
    const auto cold = cold_logits(m, b, [&](int64_t p) { return p >= L - 2; });
    for (int64_t p = std::max<int64_t>(hit, L - 2); p < int64_t(b.size()); ++p) {
      ASSERT_TRUE(got.count(p)) << "L " << L << " position " << p;
      ASSERT_TRUE(got[p] == cold.at(p))
          << "shared length " << L << ": restored run differs from the cold run at position " << p;
    }
  }
}

// Lanes (Model::forward_lanes): with more than one thread, a step of several sequences of a small model runs its
// sequences in groups, each group's layers on a thread of its own, then one head. The same steps (prefill chunks,
// decodes, snapshots) on 1, 2 and 3 threads (3: groups of unequal sizes): the same sink calls in the same order with
// bitwise equal logits, the same snapshots; and the steps on 2 or 3 threads that lanes suit did run as lanes.
TEST_P(BatchInvariance, LanesEqualOneThread) {
  const Model& m = model();
  const int32_t V = m.n_vocab();
  const int saved = omp_get_max_threads();
  struct Call {
    size_t seq;
    int64_t pos;
    std::vector<float> logits;
    bool operator==(const Call&) const = default;
  };
  // 5 sequences: prompts of 1 ... 140 tokens in chunks, then 3 decode steps; every step's calls and, at the end, the
  // snapshot taken at position 128 of the longest one
  auto run = [&](int threads, int64_t& lane_steps) {
    omp_set_num_threads(threads);
    const int64_t lanes0 = m.lane_steps();
    const std::vector<int64_t> lens = {140, 1, 37, 9, 64};
    std::vector<std::vector<int32_t>> ids;
    for (size_t i = 0; i < lens.size(); ++i) ids.push_back(random_ids(lens[i] + 3, V, uint32_t(60 + i)));
    Pool pool(m, int64_t(lens.size()) + 1, 16, 1, 9);
    std::vector<Call> calls;
    std::vector<int64_t> done(lens.size(), 0);
    for (int step = 0; step < 6; ++step) {
      Batch b;
      for (size_t i = 0; i < lens.size(); ++i) {
        const int64_t end = int64_t(ids[i].size());
        if (done[i] >= end) continue;
        const int64_t n = done[i] < lens[i] ? std::min<int64_t>(lens[i] - done[i], 70) : 1;  // prefill, then decode
        pool.ensure(int64_t(i) + 1, done[i] + n);
        BatchSeq bs;
        bs.slot = int64_t(i) + 1;
        bs.p0 = done[i];
        bs.tokens = std::span<const int32_t>(ids[i].data() + done[i], size_t(n));
        bs.pages = pool.pages[size_t(bs.slot)];
        bs.logits = i == 2 ? BatchSeq::Logits::all : BatchSeq::Logits::last;
        if (done[i] < 128 && done[i] + n >= 128) bs.snapshots.push_back({128, 0});
        b.seqs.push_back(std::move(bs));
        done[i] += n;
      }
      if (b.seqs.empty()) break;
      m.forward(b, pool.pool, [&](size_t si, int64_t pos, std::span<const float> lg, bool finite) {
        EXPECT_TRUE(finite);
        calls.push_back({si, pos, std::vector<float>(lg.begin(), lg.end())});
      });
    }
    omp_set_num_threads(saved);
    lane_steps = m.lane_steps() - lanes0;
    // the snapshot of sequence 0 at 128, restored into slot 0 and continued by one token: its logits
    pool.pool.restore_snapshot(0, 0);
    Batch b;
    BatchSeq bs;
    bs.slot = 0;
    bs.p0 = 128;
    bs.tokens = std::span<const int32_t>(ids[0].data() + 128, 1);
    bs.pages = pool.pages[1];
    bs.logits = BatchSeq::Logits::last;
    b.seqs.push_back(bs);
    m.forward(b, pool.pool, [&](size_t, int64_t pos, std::span<const float> lg, bool) {
      calls.push_back({99, pos, std::vector<float>(lg.begin(), lg.end())});
    });
    return calls;
  };
  int64_t lanes1 = 0, lanes2 = 0, lanes3 = 0;
  const std::vector<Call> one = run(1, lanes1);
  EXPECT_EQ(lanes1, 0);
  ASSERT_GT(one.size(), 40u);
  for (int threads : {2, 3}) {
    const std::vector<Call> got = run(threads, threads == 2 ? lanes2 : lanes3);
    ASSERT_EQ(got.size(), one.size()) << threads << " threads";
    for (size_t i = 0; i < one.size(); ++i) {
      ASSERT_EQ(got[i].seq, one[i].seq) << threads << " threads, call " << i;
      ASSERT_EQ(got[i].pos, one[i].pos) << threads << " threads, call " << i;
      ASSERT_TRUE(got[i].logits == one[i].logits) << threads << " threads: logits differ at call " << i;
    }
  }
  // the first step (prompts of 181 tokens in all, in lanes of at most 101: balanced) and the two decode steps of all
  // five; not the second (70 of its 74 tokens in one sequence)
  EXPECT_EQ(lanes2, 3);
  EXPECT_EQ(lanes3, 3);
}

INSTANTIATE_TEST_SUITE_P(Models, BatchInvariance,
                         ::testing::Combine(::testing::Values("tiny-a", "tiny-b", "demo"),
                                            ::testing::Values(Numerics::reference, Numerics::dense)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n + "_" + std::string(numerics_name(std::get<1>(info.param)));
                         });

TEST(Batch, InvalidBatchesAreRefused) {
  const Model& m = tiny("tiny-a", Numerics::reference);
  StatePool pool = m.make_pool({2, 4, 1});
  const std::vector<int32_t> ids{3, 4, 5}, pages{0, 1}, bad_pages{9};
  auto one = [&](int64_t slot, int64_t p0, std::span<const int32_t> pg) {
    Batch b;
    BatchSeq s;
    s.slot = slot;
    s.p0 = p0;
    s.tokens = ids;
    s.pages = pg;
    b.seqs.push_back(s);
    return b;
  };
  EXPECT_THROW(m.forward(one(2, 0, pages), pool, nullptr), Error);      // slot out of range
  EXPECT_THROW(m.forward(one(0, 0, bad_pages), pool, nullptr), Error);  // page out of range
  EXPECT_THROW(m.forward(one(0, 300, pages), pool, nullptr), Error);    // 2 pages do not cover position 302
  Batch twice = one(0, 0, pages);
  twice.seqs.push_back(twice.seqs[0]);
  EXPECT_THROW(m.forward(twice, pool, nullptr), Error);                 // a slot twice
  Batch snap = one(0, 0, pages);
  snap.seqs[0].snapshots.push_back({128, 0});
  EXPECT_THROW(m.forward(snap, pool, nullptr), Error);                  // snapshot beyond the tokens
  std::vector<int32_t> big{999};
  Batch vocab = one(0, 0, pages);
  vocab.seqs[0].tokens = big;
  EXPECT_THROW(m.forward(vocab, pool, nullptr), Error);                 // token outside the vocabulary
  EXPECT_NO_THROW(m.forward(one(1, 0, pages), pool, nullptr));
}

TEST(StateLayout, SizesAsStored) {
  const Model& m = tiny("tiny-a", Numerics::reference);  // ratios 4, 128 (+ MTP entry): head_dim 128, idx 128
  const StateLayout L = StateLayout::of(m.config());
  EXPECT_EQ(L.row_format, RowFormat::f32);
  // page: CSA layer 32 rows x (128 + 128) x 4 B + HCA layer 1 row x 128 x 4 B
  EXPECT_EQ(L.page_bytes, uint64_t(32 * 256 * 4 + 128 * 4));
  EXPECT_DOUBLE_EQ(L.bytes_per_token(), double(L.page_bytes) / 128.0);
  // slot: 2 rings of 128 x 128 + CSA frontiers 2 x 8 x 256 (main) + 2 x 8 x 256 (indexer) + HCA 2 x 128 x 128
  EXPECT_EQ(L.slot_bytes, uint64_t(2 * 128 * 128 * 4 + 2 * 8 * 256 * 4 * 2 + 2 * 128 * 128 * 4));
  // snapshot: 2 rings + CSA frontier rows [0, 4) of k and s, main and indexer
  EXPECT_EQ(L.snapshot_bytes, uint64_t(2 * 128 * 128 * 4 + 2 * 4 * 256 * 4 * 2));
  StatePool pool(m.config(), m.backend(), {3, 5, 2});
  EXPECT_EQ(pool.bytes(), 3 * L.slot_bytes + 5 * L.page_bytes + 2 * L.snapshot_bytes);

  // compact rows (the model's own pools in reference numerics on the CPU): KV rows of 64 e4m3 + 64 bf16 + 1 scale
  // + 3 pad = 196 B, indexer keys 64 + 4 = 68 B; frontiers stay fp32
  const StateLayout C = m.state_layout();
  ASSERT_EQ(C.row_format, RowFormat::compact);
  const uint64_t kv = 64 + 64 * 2 + 1 + 3, key = 128 / 2 + 128 / 32;
  EXPECT_EQ(C.kv_row.bytes(), int64_t(kv));
  EXPECT_EQ(C.key_row.bytes(), int64_t(key));
  EXPECT_EQ(C.page_bytes, 32 * (kv + key) + kv);
  EXPECT_EQ(C.slot_bytes, 2 * 128 * kv + uint64_t(2 * 8 * 256 * 4 * 2 + 2 * 128 * 128 * 4));
  EXPECT_EQ(C.snapshot_bytes, 2 * 128 * kv + uint64_t(2 * 4 * 256 * 4 * 2));
  StatePool cpool = m.make_pool({3, 5, 2});
  EXPECT_EQ(cpool.layout().row_format, RowFormat::compact);
  EXPECT_EQ(cpool.bytes(), 3 * C.slot_bytes + 5 * C.page_bytes + 2 * C.snapshot_bytes);
  // dense numerics keep fp32 rows (no simulation there: compact would be lossy)
  EXPECT_EQ(tiny("tiny-a", Numerics::dense).state_rows(), RowFormat::f32);
}

}  // namespace
}  // namespace dsv4::test
