#include <gtest/gtest.h>

#include "common/fake_lm.h"
#include "common/tiny_tokenizer.h"
#include "core/error.h"
#include "engine/engine.h"

using namespace dsv4;
using dsv4::test::FakeLm;

namespace {

std::vector<int32_t> seq_ids(int n, int start = 3) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(start + (i * 37) % 250);
  return v;
}

GenerationRequest req(std::vector<int32_t> prompt, int64_t max_tokens, float temp = 0.8f, uint64_t seed = 5) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temp;
  r.sampling.seed = seed;
  return r;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST(Engine, ColdRunIsDeterministicAndFollowsTheModel) {
  auto lm = std::make_shared<FakeLm>();
  Engine e(lm, 1024);
  auto r1 = e.generate(req(seq_ids(20), 16, 0.0f), nullptr);
  ASSERT_EQ(r1.ids.size(), 16u);
  EXPECT_EQ(r1.finish, FinishReason::length);
  // Greedy: every token is the argmax of the model's logits for its history.
  std::vector<int32_t> hist = seq_ids(20);
  std::vector<float> l(lm->n_vocab());
  for (int32_t id : r1.ids) {
    lm->logits_for(hist, l);
    EXPECT_EQ(id, std::max_element(l.begin(), l.end()) - l.begin());
    hist.push_back(id);
  }
  Engine e2(lm, 1024);
  EXPECT_EQ(e2.generate(req(seq_ids(20), 16), nullptr).ids,
            Engine(lm, 1024).generate(req(seq_ids(20), 16), nullptr).ids);
}

TEST(Engine, PrefixReuseEqualsColdRun) {
  auto lm = std::make_shared<FakeLm>();
  const auto p1 = seq_ids(40);
  Engine warm(lm, 1024, 8);
  auto first = warm.generate(req(p1, 10), nullptr);
  ASSERT_EQ(first.ids.size(), 10u);

  struct Case {
    const char* name;
    std::vector<int32_t> prompt;
    int64_t expect_cached;
  };
  std::vector<Case> cases{
      {"continuation (prompt + output + new turn)", cat(cat(p1, first.ids), seq_ids(7, 9)), 40 + 9},
      {"shared prefix, different suffix", cat(std::vector<int32_t>(p1.begin(), p1.begin() + 25), seq_ids(5, 100)), 25},
      {"identical prompt", p1, 39},
      {"shorter prefix of the held tokens", std::vector<int32_t>(p1.begin(), p1.begin() + 13), 12},
      {"nothing in common", seq_ids(30, 50), 0},
  };
  for (const auto& c : cases) {
    Engine cold(lm, 1024, 8);
    auto want = cold.generate(req(c.prompt, 12), nullptr);
    // The warm engine holds p1 + its output (but the last token) before every case.
    ASSERT_EQ(warm.generate(req(p1, 10), nullptr).ids, first.ids);
    int64_t before = lm->appended_tokens;
    auto got = warm.generate(req(c.prompt, 12), nullptr);
    int64_t appended = lm->appended_tokens - before;
    EXPECT_EQ(got.ids, want.ids) << c.name;
    EXPECT_EQ(got.finish, want.finish) << c.name;
    EXPECT_EQ(got.timings.cached_tokens, c.expect_cached) << c.name;
    EXPECT_EQ(got.timings.prefill_tokens, static_cast<int64_t>(c.prompt.size()) - c.expect_cached) << c.name;
    // Only the uncached part of the prompt was computed (plus one decode step per token but the last).
    EXPECT_EQ(appended, static_cast<int64_t>(c.prompt.size()) - c.expect_cached + 11) << c.name;
    EXPECT_EQ(want.timings.cached_tokens, 0) << c.name;
  }
}

TEST(Engine, PrefillChunksEndOnTheGrid) {
  auto lm = std::make_shared<FakeLm>();
  Engine e(lm, 1024, 16);
  auto p = seq_ids(50);
  e.generate(req(p, 1), nullptr);  // chunks [0,16) [16,32) [32,48) [48,50)
  EXPECT_EQ(lm->append_calls, 4);
  lm->append_calls = 0;
  p.resize(45);
  auto p2 = cat(p, seq_ids(10, 7));  // cached 45 -> chunks [45,48) [48,55)
  auto r = e.generate(req(p2, 1), nullptr);
  EXPECT_EQ(r.timings.cached_tokens, 45);
  EXPECT_EQ(lm->append_calls, 2);
  EXPECT_EQ(r.ids, Engine(lm, 1024, 512).generate(req(p2, 1), nullptr).ids);
}

TEST(Engine, CancelStopsWithinOneToken) {
  auto lm = std::make_shared<FakeLm>();
  Engine e(lm, 1024);
  int seen = 0;
  GenerationCallbacks cb;
  cb.on_token = [&](int32_t, std::string_view) { return ++seen < 3; };
  auto r = e.generate(req(seq_ids(10), 50), nullptr, cb);
  EXPECT_EQ(r.finish, FinishReason::cancelled);
  EXPECT_EQ(r.ids.size(), 3u);

  std::atomic<int> polls{0};
  GenerationCallbacks cb2;
  cb2.should_cancel = [&] { return ++polls > 5; };
  int64_t before = lm->appended_tokens;
  auto r2 = e.generate(req(seq_ids(10, 20), 50), nullptr, cb2);
  EXPECT_EQ(r2.finish, FinishReason::cancelled);
  EXPECT_LE(r2.ids.size(), 5u);
  EXPECT_LE(lm->appended_tokens - before, 10 + 5);
  // The engine stays usable and correct after a cancel.
  EXPECT_EQ(e.generate(req(seq_ids(10, 20), 8), nullptr).ids,
            Engine(lm, 1024).generate(req(seq_ids(10, 20), 8), nullptr).ids);
}

TEST(Engine, EosStopsAndMaxTokensAndContextLimit) {
  auto lm = std::make_shared<FakeLm>();
  const auto& tok = test::tiny_tokenizer();
  ASSERT_EQ(tok.n_vocab(), test::tiny_vocab_size());
  auto lm2 = std::make_shared<FakeLm>(tok.n_vocab());
  lm2->set_script(tok.encode("Hi there", false), *tok.token_id("<｜Assistant｜>"));
  Engine e(lm2, 64);
  auto prompt = tok.encode("<｜begin▁of▁sentence｜><｜User｜>hey<｜Assistant｜>", true);
  auto r = e.generate(req(prompt, 100, 0.0f), &tok);
  EXPECT_EQ(r.finish, FinishReason::stop);
  EXPECT_EQ(r.text, "Hi there");
  EXPECT_EQ(r.ids, tok.encode("Hi there", false));

  auto r2 = e.generate(req(prompt, 3, 0.0f), &tok);
  EXPECT_EQ(r2.finish, FinishReason::length);
  EXPECT_EQ(r2.text, "Hi ");

  Engine small(lm, 12);
  auto r3 = small.generate(req(seq_ids(10), 100), nullptr);
  EXPECT_EQ(r3.finish, FinishReason::length);
  EXPECT_EQ(r3.ids.size(), 2u);  // prompt + output fill the 12 positions

  auto ig = req(prompt, 12, 0.0f);
  ig.ignore_eos = true;
  auto r4 = e.generate(ig, &tok);
  EXPECT_EQ(r4.ids.size(), 12u);
  EXPECT_EQ(r4.finish, FinishReason::length);
}

TEST(Engine, StopStringsAcrossTokensAreCutAndHeldTextIsReleased) {
  const auto& tok = test::tiny_tokenizer();
  auto lm = std::make_shared<FakeLm>(tok.n_vocab());
  lm->set_script(tok.encode("Hello world END more", false), *tok.token_id("<｜Assistant｜>"));
  Engine e(lm, 256);
  auto prompt = tok.encode("<｜User｜>x<｜Assistant｜>", true);
  auto r = req(prompt, 100, 0.0f);
  r.stop = {"END", "zzz"};
  std::string streamed;
  GenerationCallbacks cb;
  cb.on_token = [&](int32_t, std::string_view t) {
    streamed += t;
    return true;
  };
  auto res = e.generate(r, &tok, cb);
  EXPECT_EQ(res.finish, FinishReason::stop);
  EXPECT_EQ(res.stop_matched, "END");
  EXPECT_EQ(res.text, "Hello world ");
  EXPECT_EQ(streamed, "Hello world ");
  EXPECT_EQ(res.ids.size(), std::string("Hello world END").size());

  // A trailing partial match ("mo" of "more!") is released at EOS.
  r.stop = {"more!"};
  streamed.clear();
  res = e.generate(r, &tok, cb);
  EXPECT_EQ(res.finish, FinishReason::stop);
  EXPECT_EQ(res.text, "Hello world END more");
  EXPECT_EQ(streamed, "Hello world END more");
  EXPECT_TRUE(res.stop_matched.empty());
}

TEST(Engine, RejectsBadRequests) {
  auto lm = std::make_shared<FakeLm>();
  Engine e(lm, 32);
  EXPECT_THROW(e.generate(req({}, 4), nullptr), Error);
  EXPECT_THROW(e.generate(req({5, 999}, 4), nullptr), Error);
  EXPECT_THROW(e.generate(req(seq_ids(32), 4), nullptr), Error);
  EXPECT_EQ(e.generate(req(seq_ids(31), 4), nullptr).ids.size(), 1u);
  auto r = req(seq_ids(3), 4);
  r.stop = {"x"};
  EXPECT_THROW(e.generate(r, nullptr), Error);
  r = req(seq_ids(3), 4);
  r.sampling.top_p = 2.0f;
  EXPECT_THROW(e.generate(r, nullptr), Error);
  EXPECT_THROW(Engine(lm, 100000), Error);
  EXPECT_THROW(Engine(lm, 16, 0), Error);
  // Still serves after errors.
  EXPECT_EQ(e.generate(req(seq_ids(3), 4), nullptr).ids.size(), 4u);
}
