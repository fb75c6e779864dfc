// The engine's constraint hook and log-probabilities, and OutputConstraint: reasoning budget, the reasoning phase's
// masks, the answer grammar and EOS.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/fake_lm.h"
#include "common/tiny_tokenizer.h"
#include "core/error.h"
#include "engine/constraint_vocab.h"
#include "engine/engine.h"
#include "engine/output_constraint.h"

using namespace dsv4;
using dsv4::test::FakeLm;

namespace {

// Forces a fixed token sequence, records what it was told.
class Forcing : public TokenConstraint {
 public:
  explicit Forcing(std::vector<int32_t> seq) : seq_(std::move(seq)) {}
  void apply(std::span<float> logits) override {
    const int32_t t = i_ < seq_.size() ? seq_[i_] : 1;
    for (size_t k = 0; k < logits.size(); ++k)
      if (static_cast<int32_t>(k) != t) logits[k] = -std::numeric_limits<float>::infinity();
  }
  void accept(int32_t token) override {
    accepted.push_back(token);
    ++i_;
  }
  std::vector<int32_t> accepted;

 private:
  std::vector<int32_t> seq_;
  size_t i_ = 0;
};

GenerationRequest req(std::vector<int32_t> prompt, int64_t max_tokens, float temp) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temp;
  r.sampling.seed = 3;
  return r;
}

struct Tiny {
  Tokenizer tok = Tokenizer::from_json_text(test::tiny_tokenizer_json());
  std::shared_ptr<ConstraintVocab> vocab = std::make_shared<ConstraintVocab>(tok, tok.n_vocab(), 1);
  int32_t id(const std::string& s) const { return *tok.token_id(s); }
  int32_t byte(char c) const { return tok.encode(std::string(1, c), false)[0]; }
};

std::vector<float> flat(int32_t n) { return std::vector<float>(n, 0.0f); }
bool allowed(const std::vector<float>& l, int32_t t) { return std::isfinite(l[t]); }

}  // namespace

TEST(EngineConstraint, ConstraintIsAppliedAndToldEveryToken) {
  auto lm = std::make_shared<FakeLm>();
  Engine e(lm, 512);
  for (float temp : {0.0f, 1.0f}) {
    auto forcing_t = std::make_shared<Forcing>(std::vector<int32_t>{7, 8, 9, 10});
    auto r = req({0, 5, 6}, 10, temp);
    r.constraint = forcing_t;
    const auto out = e.generate(r, nullptr);
    EXPECT_EQ(out.ids, (std::vector<int32_t>{7, 8, 9, 10}));  // then EOS (1) is forced
    EXPECT_EQ(out.finish, FinishReason::stop);
    EXPECT_EQ(forcing_t->accepted, (std::vector<int32_t>{7, 8, 9, 10, 1}));
  }
}

TEST(EngineConstraint, LogprobsAreTheRawLogSoftmax) {
  auto lm = std::make_shared<FakeLm>();
  Engine e(lm, 512);
  auto r = req({0, 5, 6}, 6, 1.0f);
  r.top_logprobs = 4;
  r.constraint = std::make_shared<Forcing>(std::vector<int32_t>{20, 21, 22, 23, 24, 25});
  std::vector<TokenLogprobs> seen;
  GenerationCallbacks cb;
  cb.on_logprobs = [&](const TokenLogprobs& lp) { seen.push_back(lp); };
  const auto out = e.generate(r, nullptr, cb);
  ASSERT_EQ(seen.size(), out.ids.size());
  std::vector<int32_t> hist = {0, 5, 6};
  std::vector<float> l(lm->n_vocab());
  for (size_t i = 0; i < seen.size(); ++i) {
    lm->logits_for(hist, l);
    double z = 0;
    for (float x : l) z += std::exp(static_cast<double>(x));
    EXPECT_EQ(seen[i].id, out.ids[i]);
    // Before the constraint's mask: the forced token's own (small) probability.
    EXPECT_NEAR(seen[i].logprob, l[out.ids[i]] - std::log(z), 1e-4);
    ASSERT_EQ(seen[i].top.size(), 4u);
    EXPECT_EQ(seen[i].top[0].id, std::max_element(l.begin(), l.end()) - l.begin());
    hist.push_back(out.ids[i]);
  }
}

TEST(OutputConstraint, ReasoningBudgetForcesThinkEnd) {
  Tiny t;
  OutputConstraintOptions o;
  o.thinking = true;
  o.reasoning_budget = 2;
  OutputConstraint c(t.vocab, o);
  auto l = flat(t.vocab->n_vocab());
  c.apply(l);
  EXPECT_TRUE(allowed(l, t.byte('a')));
  EXPECT_TRUE(allowed(l, 1));  // without a grammar, EOS may end the reasoning
  c.accept(t.byte('a'));
  c.accept(t.byte('b'));
  l = flat(t.vocab->n_vocab());
  c.apply(l);
  for (int32_t k = 0; k < t.vocab->n_vocab(); ++k) EXPECT_EQ(allowed(l, k), k == t.id("</think>")) << k;
  c.accept(t.id("</think>"));
  EXPECT_FALSE(c.in_reasoning());
  EXPECT_EQ(c.reasoning_tokens(), 2);
  l = flat(t.vocab->n_vocab());
  c.apply(l);
  EXPECT_TRUE(allowed(l, t.byte('z')));  // the answer is free
}

TEST(OutputConstraint, GrammarAfterReasoning) {
  Tiny t;
  GrammarBuilder b;
  const int32_t root = b.rule("root");
  b.add(root, b.lit("ok"));
  OutputConstraintOptions o;
  o.thinking = true;
  o.grammar = std::make_shared<GrammarAutomaton>(b.build(root), t.vocab->trie);
  OutputConstraint c(t.vocab, o);
  // Reasoning: free, but no EOS, no ｜DSML｜, and "</think>" only as the special token.
  for (char ch : std::string("</think")) {
    auto l = flat(t.vocab->n_vocab());
    c.apply(l);
    EXPECT_FALSE(allowed(l, 1));
    EXPECT_FALSE(allowed(l, t.id("｜DSML｜")));
    EXPECT_TRUE(allowed(l, t.byte(ch)));
    c.accept(t.byte(ch));
  }
  auto l = flat(t.vocab->n_vocab());
  c.apply(l);
  EXPECT_FALSE(allowed(l, t.byte('>'))) << "the text </think> may only be the </think> token";
  EXPECT_TRUE(allowed(l, t.id("</think>")));
  c.accept(t.id("</think>"));
  EXPECT_FALSE(c.in_reasoning());
  // Answer: exactly "ok", then only EOS.
  l = flat(t.vocab->n_vocab());
  c.apply(l);
  for (int32_t k = 0; k < t.vocab->n_vocab(); ++k) EXPECT_EQ(allowed(l, k), k == t.byte('o')) << k;
  c.accept(t.byte('o'));
  c.accept(t.byte('k'));
  EXPECT_TRUE(c.answer_complete());
  l = flat(t.vocab->n_vocab());
  c.apply(l);
  for (int32_t k = 0; k < t.vocab->n_vocab(); ++k) EXPECT_EQ(allowed(l, k), k == 1) << k;
}

TEST(OutputConstraint, EngineRunWithGrammarAndBudget) {
  Tiny t;
  auto lm = std::make_shared<FakeLm>(t.tok.n_vocab());
  Engine e(lm, 1024);
  GrammarBuilder b;
  const int32_t root = b.rule("root");
  b.add(root, GrammarBuilder::cat(b.lit("n="), b.repeat({b.bytes(ByteSet::range('0', '9'))}, 1, 3)));
  OutputConstraintOptions o;
  o.thinking = true;
  o.reasoning_budget = 4;
  o.grammar = std::make_shared<GrammarAutomaton>(b.build(root), t.vocab->trie);
  for (uint64_t seed : {1, 2, 3}) {
    auto r = req({0, t.id("<｜Assistant｜>"), t.id("<think>")}, 50, 1.0f);
    r.sampling.seed = seed;
    r.constraint = std::make_shared<OutputConstraint>(t.vocab, o);
    const auto out = e.generate(r, &t.tok);
    ASSERT_EQ(out.finish, FinishReason::stop);
    const size_t close = out.text.find("</think>");
    ASSERT_NE(close, std::string::npos) << out.text;
    const std::string answer = out.text.substr(close + 8);
    EXPECT_EQ(answer.rfind("n=", 0), 0u) << answer;
    EXPECT_LE(answer.size(), 5u);
    ASSERT_GE(out.ids.size(), 5u);
    EXPECT_LE(std::find(out.ids.begin(), out.ids.end(), t.id("</think>")) - out.ids.begin(), 4);
  }
}

TEST(OutputConstraint, RejectsForeignGrammars) {
  Tiny t;
  GrammarBuilder b;
  const int32_t root = b.rule("root");
  b.add(root, b.lit("x"));
  OutputConstraintOptions o;
  o.grammar =
      std::make_shared<GrammarAutomaton>(b.build(root), std::make_shared<VocabTrie>(std::vector<std::string>{"x"}));
  EXPECT_THROW(OutputConstraint(t.vocab, o), Error);
}

// A copy (clone(), the drafts of speculative decoding) steps the shared automaton ahead of the original; with caches
// small enough that every step drops them (GrammarAutomaton::Limits), the states are renumbered all the time, yet
// the original and each copy give at every position the masks of a constraint over an automaton of its own.
TEST(OutputConstraint, ClonesOverASharedAutomatonThatResetsKeepTheirStates) {
  Tiny t;
  auto grammar = [] {
    GrammarBuilder b;
    const int32_t root = b.rule("root");
    b.add(root, GrammarBuilder::cat(b.lit("ab"), b.repeat({b.bytes(ByteSet::range('0', '9'))}, 1, 8), b.lit(";")));
    return b.build(root);
  };
  GrammarAutomaton::Limits tiny;
  tiny.max_masks = 0;  // any cached mask: the next step_token drops the caches
  auto shared = std::make_shared<GrammarAutomaton>(grammar(), t.vocab->trie, tiny);
  OutputConstraintOptions o;
  o.grammar = shared;
  OutputConstraint c(t.vocab, o);
  o.grammar = std::make_shared<GrammarAutomaton>(grammar(), t.vocab->trie);
  OutputConstraint ref(t.vocab, o);
  const std::string text = "ab12345;";
  auto mask_of = [&](TokenConstraint& x) {
    std::vector<float> l = flat(t.vocab->n_vocab());
    x.apply(l);
    std::vector<int32_t> ok;
    for (int32_t k = 0; k < t.vocab->n_vocab(); ++k)
      if (allowed(l, k)) ok.push_back(k);
    return ok;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    std::unique_ptr<TokenConstraint> d = c.clone();
    ASSERT_TRUE(d);
    for (size_t j = i; j < text.size(); ++j) {  // the copy runs ahead to the end
      (void)mask_of(*d);
      d->accept(t.byte(text[j]));
    }
    EXPECT_TRUE(static_cast<OutputConstraint&>(*d).answer_complete());
    const auto want = mask_of(ref);
    EXPECT_EQ(mask_of(c), want) << "position " << i;
    EXPECT_NE(std::find(want.begin(), want.end(), t.byte(text[i])), want.end());
    c.accept(t.byte(text[i]));
    ref.accept(t.byte(text[i]));
  }
  EXPECT_TRUE(c.answer_complete());
  EXPECT_GT(shared->stats().resets, int64_t(text.size())) << "the caches were never dropped: the test checks nothing";
}
