// Speculative decoding of constrained requests (issue 13) on the demo model: JSON-schema answers (the server's
// OutputConstraint over its grammar automaton, server/json_schema_grammar.h), with and without log-probabilities,
// give exactly the tokens, ends and log-probabilities of decoding without speculation, in the EngineLoop (a batch
// of constrained and plain requests of different lengths, k = 1..4) and in the single-request Engine, with drafts
// verified (drafted > 0). Sampled constrained requests speculate into valid JSON.
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/constraint_vocab.h"
#include "engine/engine.h"
#include "engine/engine_loop.h"
#include "engine/output_constraint.h"
#include "model/model.h"
#include "server/json_schema_grammar.h"
#include "tokenizer/tokenizer.h"

using namespace dsv4;

namespace {

const std::filesystem::path kDir = std::filesystem::path(DSV4_SOURCE_DIR) / "models" / "dsv4-demo";

struct Demo {
  std::shared_ptr<const Model> model;
  Tokenizer tok = Tokenizer::from_file(kDir / "tokenizer.json");
  std::shared_ptr<ConstraintVocab> vocab;
  std::shared_ptr<GrammarAutomaton> automaton;
  Demo() {
    ModelOptions o;
    o.drafter = true;
    model = Model::load(kDir, o);
    vocab = std::make_shared<ConstraintVocab>(tok, model->n_vocab(), model->eos_id());
    const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(R"({
      "type": "object",
      "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                     "city": {"enum": ["Paris", "Boston", "Kyoto"]},
                     "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
      "required": ["name", "age", "city", "tags"]})");
    automaton = std::make_shared<GrammarAutomaton>(json_schema_grammar(schema, "schema"), vocab->trie);
  }
  std::shared_ptr<OutputConstraint> constraint(int64_t max_tokens) const {
    OutputConstraintOptions o;
    o.grammar = automaton;
    o.max_tokens = max_tokens;
    return std::make_shared<OutputConstraint>(vocab, o);
  }
  std::vector<int32_t> prompt(const std::string& text) const {
    std::vector<int32_t> p{model->bos_id()};
    for (int32_t t : tok.encode(text, false)) p.push_back(t);
    return p;
  }
};

const Demo& demo() {
  static const Demo d;
  return d;
}

const std::vector<std::string> kPrompts = {
    "The Congress of the United States", "A person, as JSON: {\"name\": \"", "Once upon a time in a small town,",
    "The weather today", "Record of the new member:", "In 1787 the delegates"};

struct LoopRun {
  std::vector<RequestStream::Result> results;
  std::vector<bool> forced;  // OutputConstraint::forced_close per request (false: unconstrained)
  EngineLoop::Stats stats;
};

// Requests i: constrained when i != 2 (the plain one shares the steps), logprobs when i is odd, max_tokens 40 + 8 i.
LoopRun run(int k, int64_t parallel, const SamplingParams& sp) {
  const Demo& d = demo();
  EngineLoopOptions o;
  o.max_running = parallel;
  o.start_thread = false;
  o.spec_draft = k;
  o.n_pages = 8 * parallel;
  o.n_snapshots = 4;
  EngineLoop loop(d.model, o);
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::shared_ptr<OutputConstraint>> cs;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EngineRequest r;
    r.prompt = d.prompt(kPrompts[i]);
    r.sampling = sp;
    r.sampling.seed = 40 + i;
    r.max_tokens = 40 + 8 * int64_t(i);
    if (i != 2) r.constraint = d.constraint(r.max_tokens);
    cs.push_back(std::static_pointer_cast<OutputConstraint>(r.constraint));
    r.top_logprobs = i % 2 ? 2 : -1;
    streams.push_back(loop.submit(std::move(r)));
  }
  loop.run_until_idle();
  LoopRun out;
  for (size_t i = 0; i < streams.size(); ++i) {
    out.results.push_back(streams[i]->wait());
    out.forced.push_back(cs[i] && cs[i]->forced_close());
  }
  out.stats = loop.stats();
  return out;
}

TEST(SpecLoop, ConstrainedRequestsSpeculateWithIdenticalOutput) {
  ASSERT_TRUE(std::filesystem::exists(kDir / "config.json")) << "demo model missing: " << kDir;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const LoopRun plain = run(0, 6, greedy);
  int ended_json = 0;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    const RequestStream::Result& r = plain.results[i];
    ASSERT_NE(r.end, StreamEnd::error) << r.error;
    if (i == 2 || r.end != StreamEnd::stop) continue;
    const std::string text = demo().tok.decode(r.tokens);
    const auto j = nlohmann::json::parse(text, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("name") && j.contains("tags")) << text;
    ++ended_json;
  }
  EXPECT_GT(ended_json, 0) << "no constrained answer completed: the test checks nothing about the grammar";
  for (int k = 1; k <= 4; ++k) {
    const LoopRun s = run(k, k % 2 ? 6 : 3, greedy);
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      const std::string what = "k=" + std::to_string(k) + " #" + std::to_string(i);
      const RequestStream::Result &a = s.results[i], &b = plain.results[i];
      EXPECT_EQ(a.end, b.end) << what << ": " << a.error;
      EXPECT_EQ(a.tokens, b.tokens) << what << "\n" << demo().tok.decode(a.tokens) << "\n" << demo().tok.decode(b.tokens);
      EXPECT_EQ(s.forced[i], plain.forced[i]) << what;
      ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
      for (size_t j = 0; j < a.logprobs.size(); ++j) {
        EXPECT_EQ(a.logprobs[j].id, b.logprobs[j].id) << what;
        EXPECT_EQ(std::bit_cast<uint32_t>(a.logprobs[j].logprob), std::bit_cast<uint32_t>(b.logprobs[j].logprob))
            << what << " token " << j;
        ASSERT_EQ(a.logprobs[j].top.size(), b.logprobs[j].top.size());
        for (size_t t = 0; t < a.logprobs[j].top.size(); ++t)
          EXPECT_EQ(std::bit_cast<uint32_t>(a.logprobs[j].top[t].logprob),
                    std::bit_cast<uint32_t>(b.logprobs[j].top[t].logprob));
      }
      if (i != 2) {
        EXPECT_GT(a.drafted_tokens, 0) << what << ": a constrained request decoded without drafts";
      }
    }
    EXPECT_GT(s.stats.accepted_tokens, 0);
    std::printf("k=%d: drafted %lld accepted %lld\n", k, (long long)s.stats.drafted_tokens,
                (long long)s.stats.accepted_tokens);
  }
  // sampled: speculation draws differently, but the answers still follow the schema
  SamplingParams sampled;
  sampled.temperature = 0.9f;
  const LoopRun s = run(3, 6, sampled);
  EXPECT_GT(s.stats.drafted_tokens, 0);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    const RequestStream::Result& r = s.results[i];
    ASSERT_NE(r.end, StreamEnd::error) << r.error;
    if (i == 2 || r.end != StreamEnd::stop) continue;
    const std::string text = demo().tok.decode(r.tokens);
    EXPECT_TRUE(nlohmann::json::parse(text, nullptr, false).is_object()) << text;
  }
}

// The single-request Engine with a speculating model: a constrained request gives the plain Engine's ids and text.
TEST(SpecEngine, ConstrainedGenerateMatchesPlainDecoding) {
  const Demo& d = demo();
  auto plain = std::shared_ptr<const Model>(Model::load(kDir));
  ModelOptions so;
  so.spec_draft = 3;
  auto spec = std::shared_ptr<const Model>(Model::load(kDir, so));
  Engine e0(plain, 1024), e1(spec, 1024);
  for (size_t i = 0; i < 3; ++i) {
    GenerationRequest r;
    r.prompt = d.prompt(kPrompts[i]);
    r.max_tokens = 48;
    r.sampling.temperature = 0.0f;
    r.top_logprobs = 1;
    std::vector<TokenLogprobs> lp0, lp1;
    GenerationCallbacks c0, c1;
    c0.on_logprobs = [&](const TokenLogprobs& l) { lp0.push_back(l); };
    c1.on_logprobs = [&](const TokenLogprobs& l) { lp1.push_back(l); };
    r.constraint = d.constraint(r.max_tokens);
    const GenerationResult a = e0.generate(r, &d.tok, c0);
    r.constraint = d.constraint(r.max_tokens);
    const GenerationResult b = e1.generate(r, &d.tok, c1);
    EXPECT_EQ(b.ids, a.ids) << "prompt " << i;
    EXPECT_EQ(b.text, a.text);
    EXPECT_EQ(b.finish, a.finish);
    ASSERT_EQ(lp1.size(), lp0.size());
    for (size_t j = 0; j < lp0.size(); ++j)
      EXPECT_EQ(std::bit_cast<uint32_t>(lp1[j].logprob), std::bit_cast<uint32_t>(lp0[j].logprob));
    EXPECT_GT(b.timings.drafted_tokens, 0);
  }
}

}  // namespace
