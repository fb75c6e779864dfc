// The DSpark drafter (docs/dspark.md, model/dspark.cpp) on tests/data/tiny-dspark (tools/oracle/make_tiny_models.py:
// the 0731 tensor layout with random weights; 3 main layers window / CSA / HCA, window 32, 3 stages, block 5, target
// layers 0 and 1), on the CPU:
// * the checkpoint loads with its drafter: 3 window-only stages, block 5 = the most drafts, no MTP hidden rows;
// * its drafts — the logits of every Markov step and the confidences — equal an independent naive fp64 reference of
//   docs/dspark.md (tests/model/naive_dspark.h) in dense numerics, for contexts shorter and longer than the window;
//   in reference numerics they stay within the quantization noise of the dense ones;
// * several sequences drafted in one call equal each one drafted alone, bitwise;
// * a snapshot restored into another slot drafts exactly as the slot that took it (the stage rings are exact);
// * bad checkpoints: a missing or misshaped drafter tensor, dspark_* keys without mtp.* tensors and --spec-draft above
//   the block size are refused with messages that name the problem.
// Rollback after any accept pattern is tested with the MTP models in test_model_mtp.cpp (DrafterRollback), greedy
// decoding through the engines in tests/engine/test_spec_decode.cpp.
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>

#include "common/checkpoint_variant.h"
#include "loader/config.h"
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "model/batch.h"
#include "model/state_pool.h"
#include "model_test_util.h"
#include "naive_dspark.h"

namespace dsv4::test {
namespace {

const Model& dspark_model(Numerics num) {
  (void)tiny("tiny-a", num);  // single-thread policy of the model tests
  static std::map<int, std::unique_ptr<Model>> cache;
  auto& m = cache[int(num)];
  if (!m) {
    ModelOptions o;
    o.numerics = num;
    o.drafter = true;
    m = Model::load(tiny_dir("tiny-dspark"), o);
  }
  return *m;
}

struct Drafted {
  std::vector<std::vector<float>> logits;  // per draft
  std::vector<int32_t> tokens;             // the sink's choices (argmax)
  std::vector<float> confidence;
};

// Prefill `context` into `slot` of `pool` (pages 0 .. 1 of the slot's own), then draft k tokens after `anchor`.
Drafted prefill_and_draft(const Model& m, StatePool& pool, int64_t slot, std::span<const int32_t> pages,
                          const std::vector<int32_t>& context, int32_t anchor, int k) {
  Batch b;
  BatchSeq& q = b.seqs.emplace_back();
  q.slot = slot;
  q.tokens = context;
  q.pages = pages;
  q.logits = BatchSeq::Logits::none;
  m.forward(b, pool, nullptr);
  Drafted d;
  const DraftSeq ds{slot, int64_t(context.size()) - 1, anchor, k};
  std::vector<std::vector<float>> conf;
  m.draft(
      std::span<const DraftSeq>(&ds, 1), pool,
      [&](size_t, int, std::span<const float> lg, bool finite) {
        EXPECT_TRUE(finite);
        d.logits.emplace_back(lg.begin(), lg.end());
        d.tokens.push_back(argmax(lg));
        return d.tokens.back();
      },
      &conf);
  d.confidence = conf.at(0);
  return d;
}

void expect_bitwise(const Drafted& a, const Drafted& b, const std::string& what) {
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t j = 0; j < a.logits.size(); ++j) {
    size_t diff = 0;
    for (size_t v = 0; v < a.logits[j].size(); ++v) diff += a.logits[j][v] != b.logits[j][v];
    EXPECT_EQ(diff, 0u) << what << " draft " << j;
  }
  EXPECT_EQ(a.tokens, b.tokens) << what;
  EXPECT_EQ(a.confidence, b.confidence) << what;
}

TEST(Dspark, LoadsTheDrafter) {
  const Model& m = dspark_model(Numerics::reference);
  EXPECT_EQ(m.drafter(), StateLayout::Drafter::dspark);
  EXPECT_EQ(m.max_draft(), 5);
  const StateLayout L = m.state_layout(true);
  EXPECT_TRUE(L.has_dspark());
  EXPECT_EQ(L.n_draft_layers, 3);
  EXPECT_EQ(L.draft_layer, 3);
  EXPECT_EQ(L.spec_rows, 6);
  EXPECT_EQ(L.hidden_width, 0);
  ASSERT_EQ(L.layers.size(), 6u);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(L.layers[size_t(3 + s)].ratio, 0);
  // without --spec-draft the drafter stays on disk, its pool layout has no drafter layers
  const Model& plain = tiny("tiny-dspark", Numerics::reference);
  EXPECT_FALSE(plain.has_drafter());
  EXPECT_EQ(plain.max_draft(), 0);
  EXPECT_EQ(plain.state_layout(false).layers.size(), 3u);
}

// The drafter against the naive fp64 reference (dense numerics): base logits + Markov bias of every step and the
// confidences, after a context shorter than the window (20) and one that has wrapped the stage rings (45 > 32).
TEST(Dspark, DraftMatchesTheNaiveReference) {
  const Model& m = dspark_model(Numerics::dense);
  const ModelConfig cfg = load_config(tiny_dir("tiny-dspark") + "/config.json");
  const SafetensorsSet set = SafetensorsSet::open(tiny_dir("tiny-dspark"));
  const ModelWeights w = bind_weights(set, cfg);
  NaiveDspark naive(cfg, w);
  const std::vector<int32_t> pages = {0, 1};
  for (int64_t P : {int64_t(1), int64_t(20), int64_t(45)}) {
    const std::vector<int32_t> ctx = random_ids(P, m.n_vocab(), 11 + uint32_t(P));
    const int32_t anchor = random_ids(1, m.n_vocab(), 5 + uint32_t(P))[0];
    StatePool pool = m.make_pool({1, 2, 0, true});
    const Drafted d = prefill_and_draft(m, pool, 0, pages, ctx, anchor, 5);
    ASSERT_EQ(d.logits.size(), 5u);
    std::vector<int32_t> prev = {anchor};
    prev.insert(prev.end(), d.tokens.begin(), d.tokens.end() - 1);
    const NaiveDspark::Draft ref = naive.draft(ctx, prev);
    ASSERT_EQ(ref.logits.size(), 5u);
    double worst = 0, worst_c = 0;
    for (size_t j = 0; j < 5; ++j) {
      double spread = 0;
      for (size_t v = 0; v < ref.logits[j].size(); ++v) {
        worst = std::max(worst, std::fabs(double(d.logits[j][v]) - ref.logits[j][v]));
        spread = std::max(spread, std::fabs(ref.logits[j][v]));
      }
      EXPECT_GT(spread, 1.0) << "degenerate logits at P " << P;
      worst_c = std::max(worst_c, std::fabs(double(d.confidence[j]) - ref.confidence[j]));
      EXPECT_GT(d.confidence[j], 0.0f);
      EXPECT_LT(d.confidence[j], 1.0f);
    }
    std::printf("P %lld: max |logit - naive| %.3g, max |confidence - naive| %.3g, drafts %d %d %d %d %d\n",
                (long long)P, worst, worst_c, d.tokens[0], d.tokens[1], d.tokens[2], d.tokens[3], d.tokens[4]);
    EXPECT_LT(worst, 5e-5) << "P " << P;
    EXPECT_LT(worst_c, 1e-5) << "P " << P;
  }
}

// Reference numerics (bf16 roundings, FP8 activation and KV simulation) stay near the dense drafts.
TEST(Dspark, ReferenceNumericsStayNearDense) {
  const std::vector<int32_t> pages = {0, 1};
  const std::vector<int32_t> ctx = random_ids(40, 256, 3);
  StatePool pr = dspark_model(Numerics::reference).make_pool({1, 2, 0, true});
  StatePool pd = dspark_model(Numerics::dense).make_pool({1, 2, 0, true});
  const Drafted r = prefill_and_draft(dspark_model(Numerics::reference), pr, 0, pages, ctx, 17, 1);
  const Drafted d = prefill_and_draft(dspark_model(Numerics::dense), pd, 0, pages, ctx, 17, 1);
  double diff = 0, var = 0, mean = 0;
  const size_t V = d.logits[0].size();
  for (size_t v = 0; v < V; ++v) mean += d.logits[0][v] / double(V);
  for (size_t v = 0; v < V; ++v) {
    diff += std::fabs(double(r.logits[0][v]) - d.logits[0][v]) / double(V);
    var += (d.logits[0][v] - mean) * (d.logits[0][v] - mean) / double(V);
  }
  std::printf("reference vs dense: mean |d logit| %.3f, logit std %.3f\n", diff, std::sqrt(var));
  EXPECT_GT(diff, 0.0) << "the two numerics should differ a little";
  EXPECT_LT(diff, 0.25 * std::sqrt(var));
}

// Drafting several sequences in one call equals drafting each alone, bitwise (reference numerics, compact rows).
TEST(Dspark, BatchedDraftEqualsAlone) {
  const Model& m = dspark_model(Numerics::reference);
  const std::vector<int64_t> lens = {5, 70, 33};
  const std::vector<int> ks = {5, 2, 4};
  StatePool pool = m.make_pool({4, 8, 0, true});
  std::vector<DraftSeq> ds;
  std::vector<Drafted> alone;
  for (size_t i = 0; i < lens.size(); ++i) {
    const std::vector<int32_t> ids = random_ids(lens[i], m.n_vocab(), 7 + uint32_t(i));
    const std::vector<int32_t> pages = {int32_t(2 * i), int32_t(2 * i + 1)};
    const int64_t slot = int64_t(3 - i);
    Batch b;
    BatchSeq& q = b.seqs.emplace_back();
    q.slot = slot;
    q.tokens = ids;
    q.pages = pages;
    q.logits = BatchSeq::Logits::none;
    m.forward(b, pool, nullptr);
    ds.push_back({slot, lens[i] - 1, int32_t(100 + i), ks[i]});
    StatePool own = m.make_pool({1, 2, 0, true});
    const std::vector<int32_t> own_pages = {0, 1};
    alone.push_back(prefill_and_draft(m, own, 0, own_pages, ids, int32_t(100 + i), ks[i]));
  }
  std::vector<Drafted> batched(lens.size());
  std::vector<std::vector<float>> conf;
  m.draft(
      ds, pool,
      [&](size_t seq, int, std::span<const float> lg, bool) {
        batched[seq].logits.emplace_back(lg.begin(), lg.end());
        batched[seq].tokens.push_back(argmax(lg));
        return batched[seq].tokens.back();
      },
      &conf);
  for (size_t i = 0; i < lens.size(); ++i) {
    batched[i].confidence = conf[i];
    ASSERT_EQ(batched[i].logits.size(), size_t(ks[i]));
    expect_bitwise(batched[i], alone[i], "sequence " + std::to_string(i));
  }
  // a sink that stops a sequence early stops only that one; n_draft 0 drafts nothing
  std::vector<int> calls(lens.size(), 0);
  ds[1].n_draft = 0;
  m.draft(ds, pool, [&](size_t seq, int j, std::span<const float> lg, bool) {
    ++calls[seq];
    return seq == 0 && j == 1 ? -1 : argmax(lg);
  });
  EXPECT_EQ(calls, (std::vector<int>{2, 0, 4}));
}

// A snapshot at 128 holds the stage rings as they are; restored into another slot it drafts exactly as the slot that
// took it, before and after more tokens.
TEST(Dspark, RestoredSnapshotDraftsAsTheOriginal) {
  const Model& m = dspark_model(Numerics::reference);
  const std::vector<int32_t> ids = random_ids(150, m.n_vocab(), 21);
  StatePool pool = m.make_pool({2, 4, 1, true});
  const std::vector<int32_t> pages0 = {0, 1}, pages1 = {0, 2};  // page 0 shared (full), then own pages
  Batch b;
  BatchSeq& q = b.seqs.emplace_back();
  q.tokens = std::span<const int32_t>(ids.data(), 128);
  q.pages = pages0;
  q.logits = BatchSeq::Logits::none;
  q.snapshots = {{128, 0}};
  m.forward(b, pool, nullptr);
  pool.restore_snapshot(0, 1);
  std::vector<Drafted> out[2];
  for (int64_t slot : {int64_t(0), int64_t(1)}) {
    auto draft_at = [&](int64_t pos) {
      Drafted d;
      const DraftSeq ds{slot, pos, ids[size_t(pos + 1)], 5};
      m.draft(std::span<const DraftSeq>(&ds, 1), pool, [&](size_t, int, std::span<const float> lg, bool) {
        d.logits.emplace_back(lg.begin(), lg.end());
        d.tokens.push_back(argmax(lg));
        return d.tokens.back();
      });
      return d;
    };
    out[slot].push_back(draft_at(127));
    Batch b2;
    BatchSeq& q2 = b2.seqs.emplace_back();
    q2.slot = slot;
    q2.p0 = 128;
    q2.tokens = std::span<const int32_t>(&ids[128], 20);
    q2.pages = slot ? pages1 : pages0;
    q2.logits = BatchSeq::Logits::none;
    m.forward(b2, pool, nullptr);
    out[slot].push_back(draft_at(147));
  }
  for (size_t i = 0; i < 2; ++i) expect_bitwise(out[1][i], out[0][i], "restored draft " + std::to_string(i));
}

// ---- refused checkpoints --------------------------------------------------------------------------------------

// A copy of tiny-dspark in `dir`: tensors filtered / reshaped by `edit` (false: drop it), config edited.
void write_variant(const std::filesystem::path& dir, const std::function<bool(dsv4::testing::ReplicaTensor&)>& edit,
                   const std::function<void(nlohmann::json&)>& edit_config = nullptr) {
  dsv4::testing::VariantEdits e;
  e.tensor = edit;
  e.config = edit_config;
  dsv4::testing::write_checkpoint_variant(tiny_dir("tiny-dspark"), dir, e);
}

std::string load_error(const std::filesystem::path& dir, int spec_draft) {
  ModelOptions o;
  o.spec_draft = spec_draft;
  try {
    (void)Model::load(dir, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Dspark, RefusesBadCheckpoints) {
  dsv4::testing::TempDir tmp;
  // a missing Markov head tensor: named, with or without speculation (the drafter is always checked)
  write_variant(tmp.path / "missing", [](dsv4::testing::ReplicaTensor& t) {
    return t.name != "mtp.2.markov_head.markov_w2.weight";
  });
  for (int k : {0, 3}) {
    const std::string e = load_error(tmp.path / "missing", k);
    EXPECT_NE(e.find("1 missing tensor(s): mtp.2.markov_head.markov_w2.weight"), std::string::npos) << e;
  }
  // a missing stage tensor
  write_variant(tmp.path / "stage", [](dsv4::testing::ReplicaTensor& t) { return t.name != "mtp.1.attn.wkv.scale"; });
  EXPECT_NE(load_error(tmp.path / "stage", 2).find("missing tensor(s): mtp.1.attn.wkv.scale"), std::string::npos);
  // a misshaped confidence projection
  write_variant(tmp.path / "shape", [](dsv4::testing::ReplicaTensor& t) {
    if (t.name == "mtp.2.confidence_head.proj.weight") t.shape = {1, 64 + 32 + 1};
    return true;
  });
  {
    const std::string e = load_error(tmp.path / "shape", 2);
    EXPECT_NE(e.find("wrong dtype/shape: mtp.2.confidence_head.proj.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("expected BF16|F32 [1, 96]"), std::string::npos) << e;
  }
  // main_proj for a different number of target layers
  write_variant(tmp.path / "targets", [](dsv4::testing::ReplicaTensor&) { return true; },
                [](nlohmann::json& c) { c["dspark_target_layer_ids"] = {0, 1, 2}; });
  EXPECT_NE(load_error(tmp.path / "targets", 1).find("wrong dtype/shape: mtp.0.main_proj.weight"), std::string::npos);
  // dspark_* keys but no mtp.* tensors: loads without speculation, refused with it
  write_variant(tmp.path / "none", [](dsv4::testing::ReplicaTensor& t) { return t.name.rfind("mtp.", 0) != 0; });
  EXPECT_EQ(load_error(tmp.path / "none", 0), "");
  {
    const std::string e = load_error(tmp.path / "none", 1);
    EXPECT_NE(e.find("DSpark drafter (dspark_* keys) but the checkpoint has no mtp.* tensors"), std::string::npos)
        << e;
  }
  // more drafts than the block: refused before any weight is read
  {
    const std::string e = load_error(tiny_dir("tiny-dspark"), 6);
    EXPECT_NE(e.find("--spec-draft 6"), std::string::npos) << e;
    EXPECT_NE(e.find("at most its block size 5"), std::string::npos) << e;
  }
  EXPECT_EQ(load_error(tiny_dir("tiny-dspark"), 5), "");
}

}  // namespace
}  // namespace dsv4::test
