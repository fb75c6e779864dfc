// EngineLoop (engine/engine_loop.h) on real checkpoints: concurrent requests give exactly the tokens of each request
// run alone (tiny-a / tiny-b up to 40 at once, the demo model 50 at once with 16 slots); prefix-cache hits at shared
// lengths 127 ... 5000 report the expected cached tokens and change nothing in the output; a chat continued turn by
// turn re-prefills only each turn's new part; a pool too small for everyone preempts and still gives the same
// tokens; seeded sampling is unaffected by batching; cancel, bad requests, a request too large for the pool, and
// the threaded mode with several submitting threads.
#include <gtest/gtest.h>
#include <omp.h>

#include <limits>
#include <map>
#include <thread>

#include "core/error.h"
#include "engine/engine_loop.h"
#include "model/sequence.h"

using namespace dsv4;

namespace {

std::string data_dir(const std::string& name) { return std::string(DSV4_SOURCE_DIR) + "/tests/data/" + name; }

std::shared_ptr<const Model> load(const std::string& name, Numerics num = Numerics::reference) {
  static const bool single = (omp_set_num_threads(1), true);  // tiny ops: no OpenMP fork/join on a loaded CI box
  (void)single;
  static std::map<std::pair<std::string, int>, std::shared_ptr<const Model>> cache;
  auto& m = cache[{name, int(num)}];
  if (!m) {
    ModelOptions o;
    o.numerics = num;
    m = Model::load(name == "demo" ? std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo" : data_dir(name), o);
  }
  return m;
}

std::vector<int32_t> ids(int64_t n, int salt, int32_t vocab) {
  std::vector<int32_t> v{0};
  for (int64_t i = 1; i < n; ++i) v.push_back(int32_t(3 + (i * 131 + salt * 977 + (i * i) % 7) % (vocab - 3)));
  return v;
}

// Greedy (or seeded) tokens of one request run alone through the single-sequence path.
std::vector<int32_t> solo(const Model& m, const std::vector<int32_t>& prompt, int64_t n, const SamplingParams& sp = {},
                          bool greedy = true) {
  ModelSequence seq(m);
  std::vector<float> lg(static_cast<size_t>(m.n_vocab()));
  seq.append(prompt, lg);
  SamplingParams p = sp;
  if (greedy) p.temperature = 0.0f;
  Sampler s(p, m.n_vocab());
  s.set_prompt(prompt);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = s.sample(lg);
    if (t == m.eos_id()) break;
    s.accept(t);
    out.push_back(t);
    if (i + 1 < n) seq.append(std::span<const int32_t>(&out.back(), 1), lg);
  }
  return out;
}

EngineRequest greedy_req(std::vector<int32_t> prompt, int64_t n) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = n;
  r.sampling.temperature = 0.0f;
  return r;
}

EngineLoopOptions manual(int64_t max_running, int64_t batch_tokens) {
  EngineLoopOptions o;
  o.max_running = max_running;
  o.batch_tokens = batch_tokens;
  o.start_thread = false;
  o.state_bytes = uint64_t(256) << 20;
  return o;
}

}  // namespace

TEST(EngineLoop, ConcurrentRequestsEqualEachRunAlone) {
  for (const char* name : {"tiny-a", "tiny-b"})
    for (Numerics num : {Numerics::reference, Numerics::dense}) {
      auto m = load(name, num);
      EngineLoop loop(m, manual(16, 300));
      std::vector<std::vector<int32_t>> prompts;
      std::vector<int64_t> n_gen;
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (int r = 0; r < 40; ++r) {
        prompts.push_back(ids(1 + (r * 37) % 290, r, m->n_vocab()));
        n_gen.push_back(5 + (r * 13) % 150);
        streams.push_back(loop.submit(greedy_req(prompts.back(), n_gen.back())));
      }
      loop.run_until_idle();
      for (size_t r = 0; r < streams.size(); ++r) {
        const auto res = streams[r]->wait();
        const auto want = solo(*m, prompts[r], n_gen[r]);
        EXPECT_EQ(res.tokens, want) << name << " request " << r;
        EXPECT_EQ(res.end, want.size() < size_t(n_gen[r]) ? StreamEnd::stop : StreamEnd::length);
      }
      const auto st = loop.stats();
      EXPECT_EQ(st.requests_finished, 40);
      EXPECT_GT(st.step_tokens / std::max<int64_t>(st.steps, 1), 4) << "steps should batch several sequences";
    }
}

TEST(EngineLoop, DemoModel50ConcurrentGreedyRequestsEqualEachRunAlone) {
  auto m = load("demo");
  EngineLoop loop(m, manual(16, 256));
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int r = 0; r < 50; ++r) {
    prompts.push_back(ids(2 + (r * 29) % 140, r, 129280));
    streams.push_back(loop.submit(greedy_req(prompts.back(), 12)));
  }
  loop.run_until_idle();
  for (size_t r = 0; r < streams.size(); ++r) EXPECT_EQ(streams[r]->wait().tokens, solo(*m, prompts[r], 12)) << r;
}

TEST(EngineLoop, PrefixHitsReportCachedTokensAndEqualColdRuns) {
  for (const char* name : {"tiny-a", "tiny-b", "demo"}) {
    auto m = load(name);
    EngineLoopOptions o = manual(4, 512);
    EngineLoop loop(m, o);
    std::vector<int64_t> shared = {127, 128, 129, 255, 256, 1000, 5000};
    for (int64_t L : shared) {
      auto a = ids(L + 20, int(L), m->n_vocab());
      auto b = std::vector<int32_t>(a.begin(), a.begin() + L);
      auto tail = ids(15, int(L) + 1, m->n_vocab());
      b.insert(b.end(), tail.begin() + 1, tail.end());
      auto ra = loop.submit(greedy_req(a, 3));
      loop.run_until_idle();
      EXPECT_EQ(ra->wait().cached_tokens, 0) << name << " L " << L;  // nothing shared with earlier prompts
      auto rb = loop.submit(greedy_req(b, 6));
      loop.run_until_idle();
      const auto res = rb->wait();
      EXPECT_EQ(res.cached_tokens, L / 128 * 128) << name << " shared " << L;
      EXPECT_EQ(res.tokens, solo(*m, b, 6)) << name << " shared " << L;
    }
  }
}

TEST(EngineLoop, ChatTurnsRePrefillOnlyTheNewPart) {
  auto m = load("demo");
  EngineLoop loop(m, manual(2, 512));
  std::vector<int32_t> history = ids(150, 1, m->n_vocab());
  std::vector<std::vector<int32_t>> computed;  // the positions each earlier request computed
  int64_t prefilled = 0, total = 0;
  for (int turn = 0; turn < 6; ++turn) {
    const bool drop_reply = turn % 2 == 1;  // thinking mode drops the reply's reasoning: the next prompt diverges
    // expected hit: the longest prefix shared with anything computed before, floored to 128, < the prompt length
    int64_t want = 0;
    for (const auto& c : computed) {
      size_t l = 0;
      while (l < c.size() && l < history.size() && c[l] == history[l]) ++l;
      want = std::max<int64_t>(want, std::min<int64_t>(int64_t(l), int64_t(history.size()) - 1) / 128 * 128);
    }
    auto r = loop.submit(greedy_req(history, 140));
    loop.run_until_idle();
    const auto res = r->wait();
    EXPECT_EQ(res.cached_tokens, want) << "turn " << turn;
    EXPECT_EQ(res.tokens, solo(*m, history, 140)) << "turn " << turn;
    prefilled += int64_t(history.size()) - res.cached_tokens;
    total += int64_t(history.size());
    auto c = history;
    c.insert(c.end(), res.tokens.begin(), res.tokens.end() - 1);  // the last token is sampled, never computed
    computed.push_back(std::move(c));
    if (!drop_reply) history.insert(history.end(), res.tokens.begin(), res.tokens.end());
    auto user = ids(30, 100 + turn, m->n_vocab());
    history.insert(history.end(), user.begin() + 1, user.end());
  }
  EXPECT_LT(prefilled * 3, total) << "the turns re-prefilled more than their new parts";
}

TEST(EngineLoop, SmallPoolPreemptsAndStillGivesTheSameTokens) {
  auto m = load("tiny-b", Numerics::dense);
  EngineLoopOptions o = manual(6, 256);
  o.n_pages = 10;      // 1280 positions for 6 sequences growing to ~400 each
  o.n_snapshots = 24;
  EngineLoop loop(m, o);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int r = 0; r < 6; ++r) {
    prompts.push_back(ids(60 + 40 * r, r, m->n_vocab()));
    EngineRequest q = greedy_req(prompts.back(), 250);
    q.ignore_eos = true;
    streams.push_back(loop.submit(q));
  }
  loop.run_until_idle();
  EXPECT_GT(loop.stats().preemptions, 0);
  for (size_t r = 0; r < streams.size(); ++r) {
    const auto res = streams[r]->wait();
    EXPECT_EQ(res.end, StreamEnd::length);
    ModelSequence seq(*m);  // ignore_eos: compare with a solo run that also ignores EOS
    std::vector<float> lg(static_cast<size_t>(m->n_vocab()));
    seq.append(prompts[r], lg);
    std::vector<int32_t> want;
    for (int i = 0; i < 250; ++i) {
      want.push_back(argmax(lg));
      if (i + 1 < 250) seq.append(std::span<const int32_t>(&want.back(), 1), lg);
    }
    EXPECT_EQ(res.tokens, want) << r;
  }
}

TEST(EngineLoop, SeededSamplingIsIndependentOfBatching) {
  auto m = load("tiny-a");
  EngineLoop loop(m, manual(8, 128));
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_p = 0.95f;
  for (int r = 0; r < 8; ++r) {
    prompts.push_back(ids(20 + r * 30, r, m->n_vocab()));
    EngineRequest q;
    q.prompt = prompts.back();
    q.sampling = sp;
    q.sampling.seed = uint64_t(100 + r);
    q.max_tokens = 60;
    streams.push_back(loop.submit(q));
  }
  loop.run_until_idle();
  for (int r = 0; r < 8; ++r) {
    SamplingParams p = sp;
    p.seed = uint64_t(100 + r);
    EXPECT_EQ(streams[size_t(r)]->wait().tokens, solo(*m, prompts[size_t(r)], 60, p, false)) << r;
  }
}

TEST(EngineLoop, CancelBadRequestsAndOversizedRequests) {
  auto m = load("tiny-a");
  EngineLoopOptions o = manual(2, 64);
  o.n_pages = 3;
  o.n_snapshots = 2;
  o.n_ctx = 2000;
  EngineLoop loop(m, o);
  EXPECT_THROW(loop.submit(greedy_req({}, 3)), Error);
  EXPECT_THROW(loop.submit(greedy_req({0, 999}, 3)), Error);                  // outside the vocabulary
  EXPECT_THROW(loop.submit(greedy_req(ids(2000, 1, 256), 3)), Error);         // no room in n_ctx
  EXPECT_THROW(loop.submit(greedy_req(ids(500, 1, 256), 3)), Error);          // prompt larger than the pool
  EngineRequest bad = greedy_req({0, 5}, 3);
  bad.sampling.top_p = 2.0f;
  EXPECT_THROW(loop.submit(bad), Error);
  auto big = greedy_req(ids(300, 2, 256), 500);  // grows past the pool's 384 positions
  big.ignore_eos = true;
  auto r1 = loop.submit(big);
  auto r2 = loop.submit(greedy_req(ids(10, 3, 256), 200));
  auto r3 = loop.submit(greedy_req(ids(10, 4, 256), 5));
  loop.step();
  loop.step();
  loop.cancel(r2->id());
  loop.run_until_idle();
  EXPECT_EQ(r1->wait().end, StreamEnd::error);
  EXPECT_NE(r1->wait().error.find("state memory"), std::string::npos);
  EXPECT_EQ(r2->wait().end, StreamEnd::cancelled);
  EXPECT_EQ(r3->wait().tokens, solo(*m, ids(10, 4, 256), 5));
}

TEST(EngineLoop, ThreadedLoopServesSubmittersOnOtherThreads) {
  auto m = load("tiny-b");
  EngineLoopOptions o;
  o.max_running = 8;
  o.batch_tokens = 256;
  o.state_bytes = uint64_t(64) << 20;
  o.n_threads = 1;
  EngineLoop loop(m, o);
  constexpr int kThreads = 4, kEach = 5;
  std::vector<std::vector<int32_t>> got(kThreads * kEach);
  std::vector<std::thread> th;
  for (int t = 0; t < kThreads; ++t)
    th.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const int r = t * kEach + i;
        auto s = loop.submit(greedy_req(ids(10 + r * 7, r, m->n_vocab()), 30));
        // stream the tokens as they come
        std::vector<int32_t> acc;
        for (;;) {
          auto more = s->next(acc.size());
          if (more.empty()) break;
          acc.insert(acc.end(), more.begin(), more.end());
        }
        EXPECT_EQ(acc, s->wait().tokens);
        got[size_t(r)] = acc;
      }
    });
  for (auto& x : th) x.join();
  for (int r = 0; r < kThreads * kEach; ++r)
    EXPECT_EQ(got[size_t(r)], solo(*m, ids(10 + r * 7, r, m->n_vocab()), 30)) << r;
  // a cancel of a request in flight on the thread
  auto s = loop.submit(greedy_req(ids(20, 99, m->n_vocab()), 100000));
  while (s->next(0).empty() && !s->finished()) {
  }
  loop.cancel(s->id());
  EXPECT_EQ(s->wait().end, StreamEnd::cancelled);
}

TEST(EngineLoop, ThreadCountReachesTheLoopThread) {
  // serve --threads N: OpenMP's pool size is per calling thread, so the loop thread that runs the steps must set it
  // itself; N differs from the default pool size of a new thread (all cores) and from this thread's.
  auto m = load("tiny-b");
  const int want = omp_get_num_procs() + 1;
  omp_set_num_threads(1);
  EngineLoopOptions o;
  o.max_running = 2;
  o.batch_tokens = 64;
  o.state_bytes = uint64_t(16) << 20;
  o.n_threads = want;
  {
    EngineLoop loop(m, o);
    auto s = loop.submit(greedy_req(ids(12, 5, m->n_vocab()), 3));
    EXPECT_EQ(s->wait().tokens, solo(*m, ids(12, 5, m->n_vocab()), 3));
    EXPECT_EQ(loop.stats().compute_threads, want);
  }
  EXPECT_EQ(omp_get_max_threads(), 1);  // the submitting thread's pool is untouched
  omp_set_num_threads(omp_get_num_procs());
}

namespace {
// Allows only tokens t with t % 3 == r (a per-request mask), and records the tokens it was told.
class ModuloConstraint : public TokenConstraint {
 public:
  explicit ModuloConstraint(int r) : r_(r) {}
  void apply(std::span<float> logits) override {
    for (size_t t = 0; t < logits.size(); ++t)
      if (int(t % 3) != r_) logits[t] = -std::numeric_limits<float>::infinity();
  }
  void accept(int32_t token) override { seen.push_back(token); }
  std::vector<int32_t> seen;

 private:
  int r_;
};
}  // namespace

TEST(EngineLoop, ConstraintsAndLogprobsArePerRequestAndBatchInvariant) {
  auto m = load("tiny-a");
  // Alone (one request per loop) vs. all at once with unconstrained neighbours.
  auto run = [&](bool together) {
    EngineLoop loop(m, manual(8, 200));
    std::vector<std::shared_ptr<RequestStream>> streams;
    std::vector<std::shared_ptr<ModuloConstraint>> cs;
    for (int r = 0; r < 9; ++r) {
      EngineRequest q = greedy_req(ids(20 + 17 * r, r, m->n_vocab()), 12);
      if (r % 3 != 2) {
        cs.push_back(std::make_shared<ModuloConstraint>(r % 3));
        q.constraint = cs.back();
      }
      if (r % 2 == 0) q.top_logprobs = 3;
      if (r == 4) {
        q.sampling.temperature = 0.8f;
        q.sampling.seed = 77;
      }
      streams.push_back(loop.submit(std::move(q)));
      if (!together) loop.run_until_idle();
    }
    loop.run_until_idle();
    std::vector<RequestStream::Result> out;
    for (auto& s : streams) out.push_back(s->wait());
    return std::make_pair(out, cs);
  };
  const auto [alone, cs_alone] = run(false);
  const auto [together, cs_together] = run(true);
  for (size_t r = 0; r < alone.size(); ++r) {
    EXPECT_EQ(together[r].tokens, alone[r].tokens) << r;
    ASSERT_EQ(together[r].logprobs.size(), r % 2 == 0 ? together[r].tokens.size() : 0u) << r;
    for (size_t i = 0; i < together[r].logprobs.size(); ++i) {
      EXPECT_EQ(together[r].logprobs[i].id, together[r].tokens[i]);
      EXPECT_EQ(together[r].logprobs[i].logprob, alone[r].logprobs[i].logprob);  // bitwise: the same raw logits
      ASSERT_EQ(together[r].logprobs[i].top.size(), 3u);
      EXPECT_EQ(together[r].logprobs[i].top[0].id, alone[r].logprobs[i].top[0].id);
    }
    if (r % 3 != 2) {
      for (int32_t t : together[r].tokens) EXPECT_EQ(int(t % 3), int(r % 3)) << "request " << r << " token " << t;
    }
  }
  // Each constraint was told exactly its request's tokens (plus a final EOS when the request stopped).
  for (size_t k = 0; k < cs_together.size(); ++k) {
    const size_t r = k + k / 2;  // requests 0, 1, 3, 4, 6, 7 are constrained
    std::vector<int32_t> seen = cs_together[k]->seen;
    if (together[r].end == StreamEnd::stop) seen.pop_back();
    EXPECT_EQ(seen, together[r].tokens) << r;
  }
  // Logprobs of the unmasked raw logits: the first token's equals the solo path's log_softmax.
  {
    const auto prompt = ids(20, 0, m->n_vocab());
    ModelSequence seq(*m);
    std::vector<float> lg(static_cast<size_t>(m->n_vocab()));
    seq.append(prompt, lg);
    const TokenLogprobs want = token_logprobs(lg, alone[0].tokens[0], 3);
    EXPECT_EQ(alone[0].logprobs[0].logprob, want.logprob);
    EXPECT_EQ(alone[0].logprobs[0].top[0].id, want.top[0].id);
  }
}
