// Speculative decoding with the checkpoint's drafter in the EngineLoop (engine/spec_decode.h, issue 13):
// * greedy: 20 prompts x 128 tokens on the demo model (trained MTP: many drafts accepted) and on tiny-a / tiny-b
//   (random MTP: most drafts rejected) give exactly the tokens of decoding without speculation, for k = 1..4, each
//   request alone and 8 at a time, with drafted / accepted counts reported; the same with the DSpark drafter of
//   tiny-dspark for k = 1..5 (its block size), with its random weights and with a hand-made Markov head that
//   predicts the plain run's bigrams (most drafts accepted), also through the single-request Engine;
// * sampled: the acceptance rule (verify_draft) on the demo model's real target and MTP distributions of a fixed
//   context reproduces the target distribution (chi-square over 24,000 samples, p > 0.01), and seeded sampled
//   decoding with speculation is reproducible (same seed, alone or in a batch of 8: same tokens);
// * the single-request Engine (generate / chat / serve) with a speculating model: the same ids, text, stop strings
//   and log-probabilities as without, seeded sampling reproducible;
// * requests with log-probabilities or a token constraint speculate too: the same tokens and, bitwise, the same
//   log-probabilities as decoding without speculation (sampled: as a plain run forced to the same tokens);
// * bad options are refused.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "common/checkpoint_variant.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/engine_loop.h"
#include "engine/spec_decode.h"
#include "model/batch.h"
#include "tokenizer/tokenizer.h"

using namespace dsv4;

namespace {

std::shared_ptr<const Model> load_mtp(const std::string& name) {
  static const bool single = (omp_set_num_threads(1), true);  // tiny ops: no OpenMP fork/join on a loaded CI box
  (void)single;
  static std::map<std::string, std::shared_ptr<const Model>> cache;
  auto& m = cache[name];
  if (!m) {
    ModelOptions o;
    o.drafter = true;
    m = Model::load(std::string(DSV4_SOURCE_DIR) + (name == "demo" ? "/models/dsv4-demo" : "/tests/data/" + name), o);
  }
  return m;
}

// 20 prompts: the demo fixture's (5 .. 401 tokens), or as many pseudo-random ones of 3 .. 150 tokens.
std::vector<std::vector<int32_t>> prompts_for(const std::string& name, int32_t vocab) {
  std::vector<std::vector<int32_t>> out;
  if (name == "demo") {
    std::ifstream f(std::string(DSV4_SOURCE_DIR) + "/tests/data/demo/prompts.json");
    const nlohmann::json j = nlohmann::json::parse(f);
    for (const auto& p : j["prompts"]) out.push_back(p["ids"].get<std::vector<int32_t>>());
    return out;
  }
  for (int i = 0; i < 20; ++i) {
    std::vector<int32_t> v{0};
    const int64_t n = 3 + (i * 37) % 148;
    for (int64_t t = 1; t < n; ++t) v.push_back(int32_t(3 + (t * 131 + i * 977 + (t * t) % 7) % (vocab - 3)));
    out.push_back(v);
  }
  return out;
}

struct LoopRun {
  std::vector<std::vector<int32_t>> tokens;
  int64_t drafted = 0, accepted = 0;
  EngineLoop::Stats stats;
};

LoopRun run(std::shared_ptr<const Model> m, const std::vector<std::vector<int32_t>>& prompts, int k, int64_t parallel,
        const SamplingParams& sp, int64_t max_tokens = 128) {
  EngineLoopOptions o;
  o.max_running = parallel;
  o.start_thread = false;
  o.spec_draft = k;
  o.n_pages = 8 * parallel;
  o.n_snapshots = 4;
  EngineLoop loop(m, o);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r;
    r.prompt = prompts[i];
    r.sampling = sp;
    r.sampling.seed = 1000 + i;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    streams.push_back(loop.submit(std::move(r)));
  }
  loop.run_until_idle();
  LoopRun out;
  for (auto& s : streams) {
    const RequestStream::Result r = s->wait();
    EXPECT_EQ(r.end, StreamEnd::length) << r.error;
    out.tokens.push_back(r.tokens);
    out.drafted += r.drafted_tokens;
    out.accepted += r.accepted_tokens;
  }
  out.stats = loop.stats();
  return out;
}

class SpecGreedy : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(SpecGreedy, IdenticalTokensAloneAndBatched) {
  const auto [name, k] = GetParam();
  auto m = load_mtp(name);
  const auto prompts = prompts_for(name, m->n_vocab());
  ASSERT_EQ(prompts.size(), 20u);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const LoopRun base = run(m, prompts, 0, 8, greedy);
  for (const auto& t : base.tokens) ASSERT_EQ(t.size(), 128u);
  EXPECT_EQ(base.drafted, 0);
  for (int64_t parallel : {int64_t(1), int64_t(8)}) {
    const LoopRun r = run(m, prompts, k, parallel, greedy);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(r.tokens[i], base.tokens[i]) << name << " k=" << k << " parallel=" << parallel << " prompt " << i;
    EXPECT_GT(r.drafted, 0);
    EXPECT_LE(r.accepted, r.drafted);
    EXPECT_EQ(r.stats.drafted_tokens, r.drafted);
    EXPECT_EQ(r.stats.accepted_tokens, r.accepted);
    std::printf("%s k=%d parallel=%lld: drafted %lld accepted %lld (%.1f%%), %lld steps\n", name.c_str(), k,
                (long long)parallel, (long long)r.drafted, (long long)r.accepted,
                100.0 * double(r.accepted) / double(std::max<int64_t>(r.drafted, 1)), (long long)r.stats.steps);
    if (name == "demo") {
      EXPECT_GT(double(r.accepted) / double(r.drafted), 0.2) << "the demo's MTP is trained";
    }
  }
}

auto spec_greedy_name = [](const auto& info) {
  std::string n = std::get<0>(info.param);
  n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
  return n + "_k" + std::to_string(std::get<1>(info.param));
};
INSTANTIATE_TEST_SUITE_P(Models, SpecGreedy,
                         ::testing::Combine(::testing::Values("demo", "tiny-a", "tiny-b"), ::testing::Range(1, 5)),
                         spec_greedy_name);
// the DSpark drafter: up to its block size (5)
INSTANTIATE_TEST_SUITE_P(Dspark, SpecGreedy, ::testing::Combine(::testing::Values("tiny-dspark"), ::testing::Range(1, 6)),
                         spec_greedy_name);

// tiny-dspark with a hand-made Markov head: markov_w1 maps each of the r most frequent previous tokens of the plain
// greedy runs to a unit vector, markov_w2 turns it into a +30 logit on that token's most frequent successor; the
// drafts then follow the plain runs' bigrams and many more are accepted than with the random head (~1% at k = 5),
// exercising partial and full acceptance. Greedy decoding with k = 5 (alone, in a batch of 8, and through the single-request Engine) gives
// exactly the plain tokens.
TEST(SpecDspark, AcceptedDraftsChangeNothing) {
  auto m0 = load_mtp("tiny-dspark");
  const auto prompts = prompts_for("tiny-dspark", m0->n_vocab());
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const LoopRun base = run(m0, prompts, 0, 8, greedy);
  const ModelConfig cfg = load_config(std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-dspark/config.json");
  const int64_t V = cfg.vocab_size, r = cfg.dspark.markov_rank;
  std::map<int32_t, std::map<int32_t, int>> next;  // prev -> successor -> count
  std::map<int32_t, int> from;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> all = prompts[i];
    all.insert(all.end(), base.tokens[i].begin(), base.tokens[i].end());
    for (size_t t = prompts[i].size(); t < all.size(); ++t) {
      ++next[all[t - 1]][all[t]];
      ++from[all[t - 1]];
    }
  }
  std::vector<std::pair<int, int32_t>> order;
  for (const auto& [p, n] : from) order.push_back({-n, p});
  std::sort(order.begin(), order.end());
  std::vector<uint16_t> w1(size_t(V * r), 0), w2(size_t(V * r), 0);  // BF16 bits: 1.0 = 0x3F80, 30.0 = 0x41F0
  for (int64_t k = 0; k < r && k < int64_t(order.size()); ++k) {
    const int32_t p = order[size_t(k)].second;
    int32_t best = -1, best_n = 0;
    for (const auto& [t, n] : next[p])
      if (n > best_n) best = t, best_n = n;
    w1[size_t(p * r + k)] = 0x3F80;
    w2[size_t(best * r + k)] = 0x41F0;
  }
  dsv4::testing::TempDir tmp;
  dsv4::testing::VariantEdits e;
  e.fill = [&](const dsv4::testing::ReplicaTensor& t, uint8_t* d) {
    const std::vector<uint16_t>* src = t.name == "mtp.2.markov_head.markov_w1.weight"   ? &w1
                                       : t.name == "mtp.2.markov_head.markov_w2.weight" ? &w2
                                                                                        : nullptr;
    if (src) std::memcpy(d, src->data(), src->size() * 2);
    return src != nullptr;
  };
  dsv4::testing::write_checkpoint_variant(std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-dspark", tmp.path, e);
  ModelOptions o;
  o.drafter = true;
  auto m = std::shared_ptr<const Model>(Model::load(tmp.path, o));
  for (int64_t parallel : {int64_t(1), int64_t(8)}) {
    const LoopRun got = run(m, prompts, 5, parallel, greedy);
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got.tokens[i], base.tokens[i]) << "prompt " << i;
    const double rate = double(got.accepted) / double(std::max<int64_t>(got.drafted, 1));
    std::printf("tiny-dspark, bigram Markov head, k=5 parallel=%lld: drafted %lld accepted %lld (%.1f%%), %lld steps "
                "(plain: %lld)\n",
                (long long)parallel, (long long)got.drafted, (long long)got.accepted, 100 * rate,
                (long long)got.stats.steps, (long long)base.stats.steps);
    EXPECT_GT(rate, 0.1) << "the hand-made Markov head should predict many plain tokens";
    EXPECT_LT(rate, 1.0) << "some drafts must be rejected";
  }
  // seeded sampled decoding with the DSpark drafter: reproducible alone and in a batch (rejection sampling against
  // the Markov-corrected draft distributions)
  SamplingParams sp;
  sp.temperature = 0.7f;
  sp.top_p = 0.95f;
  sp.repetition_penalty = 1.05f;
  const LoopRun sa = run(m, prompts, 4, 1, sp, 48), sb = run(m, prompts, 4, 8, sp, 48);
  EXPECT_EQ(sa.tokens, sb.tokens);
  EXPECT_GT(sa.accepted, 0);
  // the single-request path (generate / chat / serve)
  ModelOptions so;
  so.spec_draft = 5;
  auto spec = std::shared_ptr<const Model>(Model::load(tmp.path, so));
  ModelOptions po;
  auto plain = std::shared_ptr<const Model>(Model::load(tmp.path, po));
  Engine e0(plain, 4096), e1(spec, 4096);
  ASSERT_EQ(e1.spec_draft(), 5);
  int64_t drafted = 0, accepted = 0;
  for (size_t i = 0; i < 6; ++i) {
    GenerationRequest rq;
    rq.prompt = prompts[i];
    rq.max_tokens = 64;
    rq.ignore_eos = true;
    rq.sampling.temperature = 0.0f;
    const GenerationResult a = e0.generate(rq, nullptr);
    const GenerationResult b = e1.generate(rq, nullptr);
    EXPECT_EQ(b.ids, a.ids) << "prompt " << i;
    drafted += b.timings.drafted_tokens;
    accepted += b.timings.accepted_tokens;
  }
  EXPECT_GT(accepted, drafted / 10);
}

// Chi-square upper tail for `dof` degrees of freedom (Wilson-Hilferty; accurate to ~1e-3 in p for dof >= 10).
double chi2_p_value(double x, double dof) {
  const double z = (std::cbrt(x / dof) - (1.0 - 2.0 / (9.0 * dof))) / std::sqrt(2.0 / (9.0 * dof));
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

TEST(SpecSampled, AcceptanceRuleReproducesTheTargetDistribution) {
  auto m = load_mtp("demo");
  const int32_t V = m->n_vocab();
  // a fixed context: the target's logits after it and the MTP's draft logits for the same position
  const std::vector<int32_t> ctx = {0, 671, 6102, 294, 260, 1934, 14, 305};
  StatePool pool = m->make_pool({1, 1, 0, true});
  const std::vector<int32_t> pages = {0};
  Batch b;
  BatchSeq& q = b.seqs.emplace_back();
  q.tokens = std::span<const int32_t>(ctx.data(), ctx.size() - 1);
  q.pages = pages;
  q.logits = BatchSeq::Logits::none;
  m->forward(b, pool, nullptr);
  std::vector<float> q_logits, p_logits;
  const DraftSeq d{0, int64_t(ctx.size()) - 2, ctx.back(), 1};
  m->draft(std::span<const DraftSeq>(&d, 1), pool, [&](size_t, int, std::span<const float> lg, bool) {
    q_logits.assign(lg.begin(), lg.end());
    return -1;
  });
  Batch b2;
  BatchSeq& q2 = b2.seqs.emplace_back();
  q2.p0 = int64_t(ctx.size()) - 1;
  q2.tokens = std::span<const int32_t>(&ctx.back(), 1);
  q2.pages = pages;
  m->forward(b2, pool,
             [&](size_t, int64_t, std::span<const float> lg, bool) { p_logits.assign(lg.begin(), lg.end()); });
  ASSERT_EQ(q_logits.size(), size_t(V));
  ASSERT_EQ(p_logits.size(), size_t(V));

  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_k = 200;
  sp.seed = 7;
  Sampler smp(sp, V);
  std::vector<float> P, Q, scratch;
  scratch = p_logits;
  smp.distribution(scratch, P);
  scratch = q_logits;
  smp.distribution(scratch, Q);
  const int kSamples = 24000;
  std::vector<int64_t> count(size_t(V), 0);
  int64_t n_accepted = 0;
  for (int i = 0; i < kSamples; ++i) {
    const int32_t dft = draw_token(Q, smp.uniform());
    bool ok = false;
    ++count[size_t(verify_draft(P, Q, dft, smp, ok))];
    n_accepted += ok;
  }
  // bins: every token with an expected count >= 5, the rest pooled
  double chi2 = 0, rest_e = 0, rest_o = 0;
  int bins = 0;
  for (int32_t t = 0; t < V; ++t) {
    const double e = double(P[size_t(t)]) * kSamples;
    if (e >= 5) {
      chi2 += (double(count[size_t(t)]) - e) * (double(count[size_t(t)]) - e) / e;
      ++bins;
    } else {
      rest_e += e;
      rest_o += double(count[size_t(t)]);
    }
  }
  if (rest_e >= 5) {
    chi2 += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
    ++bins;
  }
  ASSERT_GE(bins, 11) << "too few bins for a meaningful test";
  const double p_value = chi2_p_value(chi2, bins - 1);
  std::printf("chi2 %.1f over %d bins, p = %.3f; drafts accepted %.1f%%\n", chi2, bins, p_value,
              100.0 * double(n_accepted) / kSamples);
  EXPECT_GT(p_value, 0.01);
  EXPECT_GT(n_accepted, 0);
  EXPECT_LT(n_accepted, kSamples) << "draft and target differ: some drafts must be rejected";
  // the draft distribution alone is a different one: the test has the power to see it
  double chi2_q = 0;
  for (int32_t t = 0; t < V; ++t) {
    const double e = double(P[size_t(t)]) * kSamples;
    if (e >= 5) chi2_q += (double(Q[size_t(t)]) * kSamples - e) * (double(Q[size_t(t)]) * kSamples - e) / e;
  }
  EXPECT_LT(chi2_p_value(chi2_q, bins - 1), 1e-6) << "Q is indistinguishable from P: choose another context";
}

TEST(SpecSampled, SeededRunsAreReproducibleAloneAndBatched) {
  auto m = load_mtp("demo");
  auto prompts = prompts_for("demo", m->n_vocab());
  prompts.resize(8);
  SamplingParams sp;
  sp.temperature = 0.7f;
  sp.top_p = 0.9f;
  sp.repetition_penalty = 1.1f;
  const LoopRun a = run(m, prompts, 3, 1, sp, 32);
  const LoopRun b = run(m, prompts, 3, 8, sp, 32);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(a.accepted, 0);
  const LoopRun plain = run(m, prompts, 0, 8, sp, 32);  // the same seeds without speculation: other draws, other text
  EXPECT_NE(plain.tokens, a.tokens);
}

TEST(SpecOptions, BadValuesAreRefused) {
  auto m = load_mtp("tiny-a");
  EngineLoopOptions o;
  o.start_thread = false;
  o.n_pages = 4;
  o.spec_draft = 5;
  EXPECT_THROW(EngineLoop(m, o), Error);
  o.spec_draft = -1;
  EXPECT_THROW(EngineLoop(m, o), Error);
  ModelOptions mo;
  auto plain = std::shared_ptr<const Model>(Model::load(std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a", mo));
  o.spec_draft = 2;
  try {
    EngineLoop loop(plain, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MTP"), std::string::npos) << e.what();
  }
  // the DSpark drafter: up to its block size
  auto ds = load_mtp("tiny-dspark");
  o.spec_draft = 6;
  try {
    EngineLoop loop(ds, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DSpark drafter drafts at most 5"), std::string::npos) << e.what();
  }
  o.spec_draft = 5;
  EXPECT_NO_THROW(EngineLoop(ds, o));
}

}  // namespace

namespace {

// The single-request path (Engine, `dsv4 generate` / `chat` / `serve` today) with a model loaded with spec_draft.
TEST(SpecEngine, GenerateMatchesPlainDecoding) {
  const std::string dir = std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo";
  (void)load_mtp("tiny-a");  // thread policy
  ModelOptions plain_o;
  auto plain = std::shared_ptr<const Model>(Model::load(dir, plain_o));
  const Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
  auto prompts = prompts_for("demo", plain->n_vocab());
  prompts.resize(6);
  Engine e0(plain, 4096);
  for (int k : {1, 4}) {
    ModelOptions so;
    so.spec_draft = k;
    auto spec = std::shared_ptr<const Model>(Model::load(dir, so));
    Engine e1(spec, 4096);
    ASSERT_EQ(e1.spec_draft(), k);
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest r;
      r.prompt = prompts[i];
      r.max_tokens = 48;
      r.sampling.temperature = 0.0f;
      r.top_logprobs = 2;
      r.stop = {i % 2 ? "States," : "\n\n"};
      std::vector<TokenLogprobs> lp0, lp1;
      GenerationCallbacks c0, c1;
      c0.on_logprobs = [&](const TokenLogprobs& l) { lp0.push_back(l); };
      c1.on_logprobs = [&](const TokenLogprobs& l) { lp1.push_back(l); };
      const GenerationResult a = e0.generate(r, &tok, c0);
      const GenerationResult b = e1.generate(r, &tok, c1);
      EXPECT_EQ(b.ids, a.ids) << "k=" << k << " prompt " << i;
      EXPECT_EQ(b.text, a.text);
      EXPECT_EQ(b.finish, a.finish);
      EXPECT_EQ(b.stop_matched, a.stop_matched);
      ASSERT_EQ(lp1.size(), lp0.size());
      for (size_t j = 0; j < lp0.size(); ++j) {
        EXPECT_EQ(lp1[j].id, lp0[j].id);
        EXPECT_EQ(lp1[j].logprob, lp0[j].logprob);
        ASSERT_EQ(lp1[j].top.size(), lp0[j].top.size());
        for (size_t t = 0; t < lp0[j].top.size(); ++t) EXPECT_EQ(lp1[j].top[t].id, lp0[j].top[t].id);
      }
      if (a.ids.size() > 8) {
        EXPECT_GT(b.timings.drafted_tokens, 0);
      }
      EXPECT_LE(b.timings.accepted_tokens, b.timings.drafted_tokens);
    }
    // seeded sampling is reproducible
    GenerationRequest r;
    r.prompt = prompts[0];
    r.max_tokens = 32;
    r.sampling.temperature = 0.9f;
    r.sampling.seed = 3;
    EXPECT_EQ(e1.generate(r, &tok).ids, e1.generate(r, &tok).ids);
  }
}

}  // namespace

namespace {

// Prefix-cache hits (restored snapshots include the MTP ring) and preemption (a pool too small for everyone) with
// speculation: the same greedy tokens as plain decoding with room for all.
TEST(SpecLoop, PrefixHitsAndPreemptionChangeNothing) {
  auto m = load_mtp("demo");
  auto base_prompts = prompts_for("demo", m->n_vocab());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {  // a 401-token held-out passage, then different endings
    std::vector<int32_t> p = base_prompts[19];
    p.insert(p.end(), base_prompts[size_t(i)].begin() + 1, base_prompts[size_t(i)].end());
    prompts.push_back(p);
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto go = [&](int k, int64_t n_pages) {
    EngineLoopOptions o;
    o.max_running = 3;
    o.start_thread = false;
    o.spec_draft = k;
    o.n_pages = n_pages;
    o.n_snapshots = 16;
    EngineLoop loop(m, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& p : prompts) {
      EngineRequest r;
      r.prompt = p;
      r.sampling = greedy;
      r.max_tokens = 120;  // past position 512: a fifth page during decode
      r.ignore_eos = true;
      streams.push_back(loop.submit(std::move(r)));
    }
    loop.run_until_idle();
    std::vector<RequestStream::Result> out;
    for (auto& s : streams) out.push_back(s->wait());
    return std::make_pair(out, loop.stats());
  };
  const auto [plain, plain_stats] = go(0, 64);
  const auto [spec, stats] = go(3, 8);  // 3 shared pages + 2 own per running sequence would need 9: preempts
  int64_t cached = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(spec[i].end, StreamEnd::length) << spec[i].error;
    EXPECT_EQ(spec[i].tokens, plain[i].tokens) << "prompt " << i;
    cached += spec[i].cached_tokens;
  }
  EXPECT_GT(cached, 0) << "the shared passage was not reused";
  EXPECT_GT(stats.preemptions, 0) << "the pool was large enough for everyone";
  EXPECT_GT(stats.accepted_tokens, 0);
}

}  // namespace

namespace {

// A continued conversation hits blocks whose snapshots were taken while decoding with speculation: its sampled
// tokens and draft counts equal a cold run's, seed for seed (the bitwise check of the restored MTP state is
// Mtp.DraftMakesTheSnapshotsMtpRowExact in tests/model).
TEST(SpecLoop, HitsOnGeneratedBlocksGiveTheColdRunsDrafts) {
  auto m = load_mtp("demo");
  const std::vector<int32_t> first = prompts_for("demo", m->n_vocab())[16];  // 121 tokens: decode crosses 128, 256
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_k = 50;
  auto loop_options = [] {
    EngineLoopOptions o;
    o.max_running = 2;
    o.start_thread = false;
    o.spec_draft = 3;
    o.n_pages = 16;
    o.n_snapshots = 16;
    return o;
  };
  auto ask = [&](EngineLoop& loop, const std::vector<int32_t>& prompt, int64_t n, uint64_t seed) {
    EngineRequest r;
    r.prompt = prompt;
    r.sampling = sp;
    r.sampling.seed = seed;
    r.max_tokens = n;
    r.ignore_eos = true;
    auto s = loop.submit(std::move(r));
    loop.run_until_idle();
    return s->wait();
  };
  EngineLoop warm(m, loop_options());
  const RequestStream::Result a = ask(warm, first, 200, 5);
  ASSERT_EQ(a.tokens.size(), 200u);
  std::vector<int32_t> second = first;
  second.insert(second.end(), a.tokens.begin(), a.tokens.end());
  second.insert(second.end(), first.begin() + 1, first.begin() + 9);
  const RequestStream::Result hit = ask(warm, second, 64, 6);
  EXPECT_GE(hit.cached_tokens, 256) << "the continued prompt should reuse the generated blocks";
  EngineLoop cold_loop(m, loop_options());
  const RequestStream::Result cold = ask(cold_loop, second, 64, 6);
  EXPECT_EQ(cold.cached_tokens, 0);
  EXPECT_EQ(hit.tokens, cold.tokens);
  EXPECT_EQ(hit.drafted_tokens, cold.drafted_tokens);
  EXPECT_EQ(hit.accepted_tokens, cold.accepted_tokens);
  EXPECT_GT(hit.accepted_tokens, 0);
}

}  // namespace

namespace {

// Allows exactly the given tokens in order (then anything): a plain run under it recomputes the log-probabilities of
// another run's tokens position by position, without speculation.
class ForceTokens : public TokenConstraint {
 public:
  explicit ForceTokens(std::vector<int32_t> seq) : seq_(std::move(seq)) {}
  void apply(std::span<float> logits) override {
    if (i_ >= seq_.size()) return;
    for (size_t t = 0; t < logits.size(); ++t)
      if (int32_t(t) != seq_[i_]) logits[t] = -std::numeric_limits<float>::infinity();
  }
  void accept(int32_t token) override {
    if (i_ < seq_.size() && token != seq_[i_]) fail("forced token {} expected, got {}", seq_[i_], token);
    ++i_;
  }

 private:
  std::vector<int32_t> seq_;
  size_t i_ = 0;
};

struct LpRun {
  std::vector<RequestStream::Result> results;
  EngineLoop::Stats stats;
};

// Requests i = 0.. with top_logprobs 3, seed seed0 + i and max_tokens 24 + 5 i (drafts capped at different steps),
// all in one loop of `parallel` slots; forced[i] non-empty: that request runs under ForceTokens(forced[i]).
LpRun run_logprobs(std::shared_ptr<const Model> m, const std::vector<std::vector<int32_t>>& prompts, int k,
                   int64_t parallel, const SamplingParams& sp, const std::vector<std::vector<int32_t>>& forced = {},
                   uint64_t seed0 = 2000) {
  EngineLoopOptions o;
  o.max_running = parallel;
  o.start_thread = false;
  o.spec_draft = k;
  o.n_pages = 8 * parallel;
  o.n_snapshots = 4;
  EngineLoop loop(m, o);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r;
    r.prompt = prompts[i];
    r.sampling = sp;
    r.sampling.seed = seed0 + i;
    r.max_tokens = 24 + 5 * int64_t(i);
    r.ignore_eos = true;
    r.top_logprobs = 3;
    if (i < forced.size() && !forced[i].empty()) r.constraint = std::make_shared<ForceTokens>(forced[i]);
    streams.push_back(loop.submit(std::move(r)));
  }
  loop.run_until_idle();
  LpRun out;
  for (auto& s : streams) out.results.push_back(s->wait());
  out.stats = loop.stats();
  return out;
}

// Bitwise: ids, log-probabilities and alternatives.
void expect_same_logprobs(const RequestStream::Result& got, const RequestStream::Result& want, const std::string& what) {
  EXPECT_EQ(got.end, StreamEnd::length) << what << ": " << got.error;
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logprobs.size(), got.tokens.size()) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (size_t j = 0; j < got.logprobs.size(); ++j) {
    const TokenLogprobs &a = got.logprobs[j], &b = want.logprobs[j];
    ASSERT_EQ(a.id, got.tokens[j]) << what << " token " << j;
    EXPECT_EQ(a.id, b.id) << what << " token " << j;
    EXPECT_EQ(std::bit_cast<uint32_t>(a.logprob), std::bit_cast<uint32_t>(b.logprob)) << what << " token " << j;
    ASSERT_EQ(a.top.size(), 3u);
    ASSERT_EQ(a.top.size(), b.top.size());
    for (size_t t = 0; t < a.top.size(); ++t) {
      EXPECT_EQ(a.top[t].id, b.top[t].id) << what << " token " << j;
      EXPECT_EQ(std::bit_cast<uint32_t>(a.top[t].logprob), std::bit_cast<uint32_t>(b.top[t].logprob))
          << what << " token " << j;
    }
  }
}

// Logprobs requests speculate (drafts verified) and report, per token, the log-probabilities of the target's raw
// logits at its position: bitwise those of decoding without speculation. Greedy: the plain run's tokens and
// logprobs. Seeded sampled: speculation draws differently, so the reference is a plain run forced (ForceTokens) to
// the speculative run's tokens; the same forcing under speculation with other seeds (other drafts: the constraint
// rejects those that differ) too.
// Six requests of different lengths share the loop's steps, one slot each or two slots for all.
TEST(SpecLoop, LogprobsRequestsSpeculateWithIdenticalLogprobs) {
  auto m = load_mtp("demo");
  auto prompts = prompts_for("demo", m->n_vocab());
  prompts.resize(6);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams sampled;
  sampled.temperature = 0.8f;
  sampled.top_k = 40;
  const LpRun plain = run_logprobs(m, prompts, 0, 6, greedy);
  EXPECT_EQ(plain.stats.drafted_tokens, 0);
  for (int k = 1; k <= 4; ++k) {
    const int64_t parallel = k % 2 ? 6 : 2;
    const LpRun g = run_logprobs(m, prompts, k, parallel, greedy);
    int64_t drafted = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      expect_same_logprobs(g.results[i], plain.results[i], "greedy k=" + std::to_string(k) + " #" + std::to_string(i));
      drafted += g.results[i].drafted_tokens;
      EXPECT_LE(g.results[i].accepted_tokens, g.results[i].drafted_tokens);
    }
    EXPECT_GT(drafted, 0) << "k=" << k << ": logprobs requests decoded without drafts";
    EXPECT_GT(g.stats.accepted_tokens, 0);

    const LpRun s = run_logprobs(m, prompts, k, parallel, sampled);
    std::vector<std::vector<int32_t>> forced;
    for (const auto& r : s.results) forced.push_back(r.tokens);
    const LpRun ref = run_logprobs(m, prompts, 0, 6, sampled, forced);
    const LpRun ref_spec = run_logprobs(m, prompts, k, parallel, sampled, forced, 3000);
    EXPECT_EQ(ref.stats.drafted_tokens, 0);
    EXPECT_GT(s.stats.drafted_tokens, 0);
    EXPECT_GT(s.stats.accepted_tokens, 0);
    EXPECT_GT(ref_spec.stats.drafted_tokens, 0);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::string what = "sampled k=" + std::to_string(k) + " #" + std::to_string(i);
      ASSERT_EQ(s.results[i].tokens.size(), size_t(24 + 5 * i)) << what;
      expect_same_logprobs(s.results[i], ref.results[i], what);
      expect_same_logprobs(ref_spec.results[i], ref.results[i], what + " forced");
    }
  }
}

}  // namespace
