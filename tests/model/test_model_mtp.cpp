// MTP drafting and verify/rollback (model/speculation.h) on the CPU, bitwise:
// * rollback: sequences that run verify steps of random draft counts and keep random prefixes (two of them in the
//   same batches, plus a prefill in another slot, with draft() calls between the rounds) end in exactly the state
//   of a straight run over the kept tokens: every kept position's logits, the next step's logits and the drafts
//   from the final position are bitwise equal (MTP: demo model, tiny-a, tiny-b; the DSpark drafter: tiny-dspark,
//   verify steps of up to its block size; reference and dense numerics);
// * draft() of several sequences in one call equals each alone;
// * the demo model's MTP drafts predict the held-out passages of tests/data/demo/prompts.json far above chance;
// * a snapshot whose MTP row was provisional is made exact by the next draft() (restored == original, bitwise);
// * a checkpoint without a drafter, or --spec-draft above the drafter's limit, is refused with a clear message.
#include <nlohmann/json.hpp>

#include <fstream>

#include "model_test_util.h"
#include "model/batch.h"
#include "model/state_pool.h"

namespace dsv4::test {
namespace {

const Model& mtp_model(const std::string& name, Numerics num) {
  (void)tiny("tiny-a", num);  // single-thread policy of the model tests
  static std::map<std::pair<std::string, int>, std::unique_ptr<Model>> cache;
  auto& m = cache[{name, int(num)}];
  if (!m) {
    ModelOptions o;
    o.numerics = num;
    o.drafter = true;
    m = Model::load(name == "demo" ? std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo" : tiny_dir(name), o);
    EXPECT_EQ(m->drafter(), name == "tiny-dspark" ? StateLayout::Drafter::dspark : StateLayout::Drafter::mtp);
  }
  return *m;
}

using Logits = std::map<int64_t, std::vector<float>>;

// One sequence under speculation: its slot and pages, the tokens its state holds, the pending token x_P.
struct SpecRun {
  int64_t slot = 0;
  std::vector<int32_t> pages;
  std::vector<int32_t> kept;   // tokens at positions [0, P)
  int32_t next = 0;            // x_P
  Logits logits;               // logits of every kept position
  std::vector<int32_t> step_tokens;
  int64_t keep = 0;
};

std::vector<std::vector<float>> drafts_of(const Model& m, StatePool& pool, std::span<const DraftSeq> ds) {
  std::vector<std::vector<float>> out;
  m.draft(ds, pool, [&](size_t, int, std::span<const float> lg, bool finite) {
    EXPECT_TRUE(finite);
    out.emplace_back(lg.begin(), lg.end());
    return test::argmax(lg);
  });
  return out;
}

void expect_same(std::span<const float> a, std::span<const float> b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  EXPECT_EQ(diff, 0u) << what;
}

class DrafterRollback : public ::testing::TestWithParam<std::tuple<std::string, Numerics>> {};

TEST_P(DrafterRollback, AnyAcceptPatternEqualsStraightRun) {
  const auto [name, num] = GetParam();
  const Model& m = mtp_model(name, num);
  const int32_t V = m.n_vocab();
  const int64_t target = 300;  // crosses page, HCA and ring boundaries
  StatePool pool = m.make_pool({3, 12, 0, true});
  std::mt19937 rng(name.size() * 7 + int(num));
  std::vector<SpecRun> runs(2);
  runs[0].slot = 2;
  runs[0].pages = {7, 1, 4};
  runs[1].slot = 0;
  runs[1].pages = {3, 9, 0};
  const std::vector<int32_t> other = random_ids(260, V, 99);  // a prefill in slot 1, sharing the steps
  const std::vector<int32_t> other_pages = {5, 2, 8};
  int64_t other_done = 0;

  for (size_t r = 0; r < runs.size(); ++r) {
    SpecRun& s = runs[r];
    s.kept = random_ids(r == 0 ? 37 : 126, V, 11 + uint32_t(r));
    Batch b;
    BatchSeq& q = b.seqs.emplace_back();
    q.slot = s.slot;
    q.tokens = s.kept;
    q.pages = s.pages;
    q.logits = BatchSeq::Logits::all;
    m.forward(b, pool, [&](size_t, int64_t p, std::span<const float> lg, bool) {
      s.logits[p] = std::vector<float>(lg.begin(), lg.end());
    });
    s.next = random_ids(1, V, 50 + uint32_t(r))[0];
  }
  std::uniform_int_distribution<int> dk(1, m.max_draft());
  int rounds = 0;
  for (;;) {
    Batch b;
    std::vector<size_t> who;
    for (size_t r = 0; r < runs.size(); ++r) {
      SpecRun& s = runs[r];
      if (int64_t(s.kept.size()) >= target) continue;
      const int k = dk(rng);
      s.step_tokens = {s.next};
      for (int j = 0; j < k; ++j) s.step_tokens.push_back(random_ids(1, V, rng())[0]);
      s.keep = std::uniform_int_distribution<int64_t>(1, k + 1)(rng);
      BatchSeq& q = b.seqs.emplace_back();
      q.slot = s.slot;
      q.p0 = int64_t(s.kept.size());
      q.tokens = s.step_tokens;
      q.pages = s.pages;
      q.logits = BatchSeq::Logits::all;
      q.spec = true;
      who.push_back(r);
    }
    if (who.empty()) break;
    if (other_done < int64_t(other.size())) {  // another sequence's prefill chunk in the same step
      const int64_t n = std::min<int64_t>(int64_t(other.size()) - other_done, 1 + rng() % 40);
      BatchSeq& q = b.seqs.emplace_back();
      q.slot = 1;
      q.p0 = other_done;
      q.tokens = std::span<const int32_t>(other.data() + other_done, size_t(n));
      q.pages = other_pages;
      q.logits = BatchSeq::Logits::none;
      other_done += n;
    }
    std::map<std::pair<size_t, int64_t>, std::vector<float>> got;
    m.forward(b, pool, [&](size_t si, int64_t p, std::span<const float> lg, bool) {
      got[{si, p}] = std::vector<float>(lg.begin(), lg.end());
    });
    std::vector<SpecRollback> rb;
    std::vector<DraftSeq> ds;
    for (size_t i = 0; i < who.size(); ++i) {
      SpecRun& s = runs[who[i]];
      const int64_t P = int64_t(s.kept.size());
      for (int64_t j = 0; j < s.keep; ++j) {
        s.logits[P + j] = got.at({i, P + j});
        s.kept.push_back(s.step_tokens[size_t(j)]);
      }
      if (s.keep < int64_t(s.step_tokens.size())) rb.push_back({s.slot, P, int64_t(s.step_tokens.size()), s.keep});
      s.next = random_ids(1, V, rng())[0];
      ds.push_back({s.slot, int64_t(s.kept.size()) - 1, s.next, dk(rng) - 1});  // 0: the MTP row only
    }
    m.rollback(rb, pool);
    (void)drafts_of(m, pool, ds);  // drafting between rounds (chained drafts) must not change anything
    ++rounds;
  }

  // the straight runs: one sequence alone in a fresh pool, the kept tokens in one step
  std::vector<DraftSeq> ds_batch;
  const int kf = m.max_draft();  // drafts from the final position
  for (const SpecRun& s : runs) ds_batch.push_back({s.slot, int64_t(s.kept.size()) - 1, s.next, kf});
  const auto batch_drafts = drafts_of(m, pool, ds_batch);
  for (size_t r = 0; r < runs.size(); ++r) {
    const SpecRun& s = runs[r];
    StatePool alone = m.make_pool({1, 4, 0, true});
    const std::vector<int32_t> pages = {0, 1, 2, 3};
    Batch b;
    BatchSeq& q = b.seqs.emplace_back();
    q.tokens = s.kept;
    q.pages = pages;
    q.logits = BatchSeq::Logits::all;
    Logits straight;
    m.forward(b, alone, [&](size_t, int64_t p, std::span<const float> lg, bool) {
      straight[p] = std::vector<float>(lg.begin(), lg.end());
    });
    ASSERT_EQ(straight.size(), s.logits.size());
    for (const auto& [p, lg] : straight) expect_same(s.logits.at(p), lg, name + " position " + std::to_string(p));
    // the drafts from the final position (batched above, alone here)
    const DraftSeq d{0, int64_t(s.kept.size()) - 1, s.next, kf};
    const auto alone_drafts = drafts_of(m, alone, std::span<const DraftSeq>(&d, 1));
    ASSERT_EQ(alone_drafts.size(), size_t(kf));
    for (size_t j = 0; j < size_t(kf); ++j)
      expect_same(batch_drafts[j * runs.size() + r], alone_drafts[j], name + " draft " + std::to_string(j));
    // and one more step of the main model
    auto step = [&](StatePool& pl, int64_t slot, std::span<const int32_t> pg) {
      Batch b2;
      BatchSeq& q2 = b2.seqs.emplace_back();
      q2.slot = slot;
      q2.p0 = int64_t(s.kept.size());
      q2.tokens = std::span<const int32_t>(&s.next, 1);
      q2.pages = pg;
      std::vector<float> out;
      m.forward(b2, pl, [&](size_t, int64_t, std::span<const float> lg, bool) { out.assign(lg.begin(), lg.end()); });
      return out;
    };
    expect_same(step(pool, s.slot, s.pages), step(alone, 0, pages), name + " next step");
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DrafterRollback,
                         ::testing::Combine(::testing::Values("demo", "tiny-a", "tiny-b", "tiny-dspark"),
                                            ::testing::Values(Numerics::reference, Numerics::dense)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n + (std::get<1>(info.param) == Numerics::reference ? "_reference" : "_dense");
                         });

nlohmann::json demo_prompts() {
  std::ifstream f(std::string(DSV4_SOURCE_DIR) + "/tests/data/demo/prompts.json");
  return nlohmann::json::parse(f);
}

// Top-1 of the MTP draft (token t + 2 from the hidden state of t and token t + 1) over held-out text, one
// position at a time as decoding runs it.
TEST(Mtp, DemoDraftsPredictHeldOutText) {
  const nlohmann::json prompts = demo_prompts();
  for (Numerics num : {Numerics::dense, Numerics::reference}) {
    const Model& m = mtp_model("demo", num);
    int64_t hits = 0, total = 0;
    for (const auto& p : prompts["prompts"]) {
      const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
      if (ids.size() < 100 || ids.size() > 250) continue;  // the held-out passages of 121 and 201 tokens
      StatePool pool = m.make_pool({1, 4, 0, true});
      const std::vector<int32_t> pages = {0, 1, 2, 3};
      for (size_t t = 0; t + 2 < ids.size(); ++t) {
        Batch b;
        BatchSeq& q = b.seqs.emplace_back();
        q.p0 = int64_t(t);
        q.tokens = std::span<const int32_t>(&ids[t], 1);
        q.pages = pages;
        q.logits = BatchSeq::Logits::none;
        m.forward(b, pool, nullptr);
        const DraftSeq d{0, int64_t(t), ids[t + 1], 1};
        const auto lg = drafts_of(m, pool, std::span<const DraftSeq>(&d, 1));
        hits += test::argmax(lg[0]) == ids[t + 2];
        ++total;
      }
    }
    ASSERT_GT(total, 300);
    const double top1 = double(hits) / double(total);
    // chance is 1 / 129280; the exported checkpoint's MTP top-1 on the whole held-out set is 22.9% (README)
    EXPECT_GT(top1, 0.12) << numerics_name(num) << ": MTP top-1 " << top1 << " over " << total << " positions";
    std::printf("demo MTP top-1 (%s): %.4f over %lld positions\n", std::string(numerics_name(num)).c_str(), top1,
                (long long)total);
  }
}

TEST(Mtp, DraftBatchedEqualsAlone) {
  const Model& m = mtp_model("demo", Numerics::reference);
  const int32_t V = m.n_vocab();
  const std::vector<int64_t> lens = {5, 130, 61};
  StatePool pool = m.make_pool({4, 8, 0, true});
  std::vector<DraftSeq> ds;
  std::vector<std::vector<std::vector<float>>> alone;
  for (size_t i = 0; i < lens.size(); ++i) {
    const std::vector<int32_t> ids = random_ids(lens[i], V, 7 + uint32_t(i));
    const std::vector<int32_t> pages = {int32_t(2 * i), int32_t(2 * i + 1)};
    const int64_t slot = int64_t(3 - i);
    for (StatePool* pl : {&pool, (StatePool*)nullptr}) {
      StatePool own = m.make_pool({1, 8, 0, true});
      StatePool& target = pl ? *pl : own;
      Batch b;
      BatchSeq& q = b.seqs.emplace_back();
      q.slot = pl ? slot : 0;
      q.tokens = ids;
      q.pages = pages;
      q.logits = BatchSeq::Logits::none;
      m.forward(b, target, nullptr);
      const DraftSeq d{q.slot, lens[i] - 1, int32_t(100 + i), int(i) + 2};
      if (pl) ds.push_back(d);
      else alone.push_back(drafts_of(m, own, std::span<const DraftSeq>(&d, 1)));
    }
  }
  std::vector<std::vector<std::vector<float>>> batched(lens.size());
  m.draft(ds, pool, [&](size_t seq, int, std::span<const float> lg, bool) {
    batched[seq].emplace_back(lg.begin(), lg.end());
    return test::argmax(lg);
  });
  for (size_t i = 0; i < lens.size(); ++i) {
    ASSERT_EQ(batched[i].size(), size_t(i + 2));
    ASSERT_EQ(alone[i].size(), size_t(i + 2));
    for (size_t j = 0; j < alone[i].size(); ++j) expect_same(batched[i][j], alone[i][j], "draft");
  }
}

// A snapshot taken where the next token was not known yet holds a provisional MTP row; draft() with the snapshot
// rewrites it, so that a sequence restored from it drafts exactly as the one that took it.
TEST(Mtp, DraftMakesTheSnapshotsMtpRowExact) {
  for (bool patch : {true, false}) {
    const Model& m = mtp_model("demo", Numerics::reference);
    const std::vector<int32_t> ids = random_ids(131, m.n_vocab(), 3);
    StatePool pool = m.make_pool({2, 4, 1, true});
    const std::vector<int32_t> pages0 = {0, 1}, pages1 = {0, 2};  // block 0 shared (full), then own pages
    Batch b;
    BatchSeq& q = b.seqs.emplace_back();
    q.tokens = std::span<const int32_t>(ids.data(), 128);
    q.pages = pages0;
    q.logits = BatchSeq::Logits::none;
    q.snapshots = {{128, 0}};  // next token unknown here: the MTP row of 127 is provisional
    m.forward(b, pool, nullptr);
    const DraftSeq d{0, 127, ids[128], 2, patch ? 0 : -1};
    (void)drafts_of(m, pool, std::span<const DraftSeq>(&d, 1));
    pool.restore_snapshot(0, 1);
    std::vector<std::vector<float>> out[2];
    for (int64_t slot : {int64_t(0), int64_t(1)}) {
      Batch b2;
      BatchSeq& q2 = b2.seqs.emplace_back();
      q2.slot = slot;
      q2.p0 = 128;
      q2.tokens = std::span<const int32_t>(&ids[128], 1);
      q2.pages = slot ? pages1 : pages0;
      q2.logits = BatchSeq::Logits::none;
      m.forward(b2, pool, nullptr);
      const DraftSeq d2{slot, 128, ids[129], 2};
      out[slot] = drafts_of(m, pool, std::span<const DraftSeq>(&d2, 1));
    }
    ASSERT_EQ(out[0].size(), 2u);
    ASSERT_EQ(out[1].size(), 2u);
    if (patch) {
      for (size_t j = 0; j < 2; ++j) expect_same(out[1][j], out[0][j], "restored draft " + std::to_string(j));
    } else {
      EXPECT_NE(out[1][0], out[0][0]) << "without the rewrite the restored MTP ring differs (the test has power)";
    }
  }
}

TEST(Mtp, RefusesCheckpointsWithoutADrafter) {
  // a config with neither an MTP layer nor dspark_* keys
  ModelConfig c = load_config(std::string(DSV4_SOURCE_DIR) + "/tests/data/configs/deepseek-v4-flash-config.json");
  c.num_nextn_predict_layers = 0;
  try {
    (void)StateLayout::of(c, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no drafter"), std::string::npos) << e.what();
  }
  // loading it for speculative decoding says which drafters it lacks, before any weight is made or read
  ModelOptions o;
  o.spec_draft = 2;
  try {
    (void)Model::load_dummy(c, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the checkpoint has none (no MTP module"), std::string::npos) << msg;
    EXPECT_NE(msg.find("no DSpark drafter"), std::string::npos) << msg;
  }
  // the MTP module drafts at most 4 tokens per step; the 0731 config's DSpark drafter its block size, 5
  for (const char* name : {"deepseek-v4-flash-config.json", "deepseek-v4-flash-0731-config.json"}) {
    const ModelConfig f = load_config(std::string(DSV4_SOURCE_DIR) + "/tests/data/configs/" + name);
    o.spec_draft = f.dspark.present ? 6 : 5;
    try {
      (void)Model::load_dummy(f, o);
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(f.dspark.present ? "DSpark drafter" : "MTP module"), std::string::npos) << msg;
      EXPECT_NE(msg.find(f.dspark.present ? "at most its block size 5" : "at most 4 tokens"), std::string::npos)
          << msg;
    }
  }
  // the 0731 config's pool layout with its drafter: three window-only stage layers, verify steps of up to 6 tokens
  const ModelConfig d =
      load_config(std::string(DSV4_SOURCE_DIR) + "/tests/data/configs/deepseek-v4-flash-0731-config.json");
  const StateLayout L = StateLayout::of(d, true);
  EXPECT_TRUE(L.has_dspark());
  EXPECT_EQ(L.layers.size(), 46u);
  EXPECT_EQ(L.draft_layer, 43);
  EXPECT_EQ(L.spec_rows, 6);
  // a model loaded without its MTP module cannot run a pool with the MTP layer
  const Model& plain = tiny("tiny-a", Numerics::reference);
  StatePool pool = plain.make_pool({1, 1, 0, true});
  Batch b;
  const int32_t t = 5;
  const int32_t page = 0;
  BatchSeq& q = b.seqs.emplace_back();
  q.tokens = std::span<const int32_t>(&t, 1);
  q.pages = std::span<const int32_t>(&page, 1);
  EXPECT_THROW(plain.forward(b, pool, nullptr), Error);
}

}  // namespace
}  // namespace dsv4::test
