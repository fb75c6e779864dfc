// Constrained decoding cost per token on the V4 vocabulary (129,280 tokens, the demo model's tokenizer.json):
// what the server adds to each decode step for response_format / tool_choice, against the unconstrained step.
//
//   BM_BuildVocabTrie             building the vocabulary trie (once per server, on the first constrained request)
//   BM_Step/<case>/{cold,warm}    one decode step on host logits: [grammar mask + logits masking] + greedy sampling +
//                                 advancing the grammar, averaged over the tokens of a reference JSON answer
//                                 (tokenized like the model would write it). cold: a fresh automaton per answer
//                                 (first request with that schema: every mask is computed by a trie walk); warm: the
//                                 automaton the server keeps per schema (masks of recurring states come from its cache)
//   BM_Step/unconstrained         the same step without a grammar (the baseline)
// The per-token overhead of a schema is BM_Step/<case> - BM_Step/unconstrained (s_per_token: seconds per token,
// printed with SI prefixes: 1.2m = 1.2 ms).
// Usage: bench_grammar [--tokenizer=PATH] [google-benchmark flags]  (default models/dsv4-demo/tokenizer.json)
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/constraint_vocab.h"
#include "engine/output_constraint.h"
#include "sampling/sampler.h"
#include "server/json_schema_grammar.h"
#include "server/tool_call_grammar.h"
#include "tokenizer/tokenizer.h"

namespace {

using J = nlohmann::ordered_json;
std::string g_tokenizer_path = "models/dsv4-demo/tokenizer.json";
constexpr int32_t kVocab = 129280;

struct Data {
  std::unique_ptr<dsv4::Tokenizer> tok;
  std::shared_ptr<dsv4::ConstraintVocab> vocab;
  std::vector<float> logits;
};

Data& data() {
  static Data d = [] {
    Data x;
    x.tok = std::make_unique<dsv4::Tokenizer>(dsv4::Tokenizer::from_file(g_tokenizer_path));
    x.vocab = std::make_shared<dsv4::ConstraintVocab>(*x.tok, std::max(kVocab, x.tok->n_vocab()), 1);
    std::mt19937_64 rng(1);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    x.logits.resize(x.vocab->n_vocab());
    for (auto& l : x.logits) l = nd(rng);
    return x;
  }();
  return d;
}

struct Case {
  const char* name;
  J schema;          // response_format schema (null: tools)
  std::string text;  // a valid answer, as the model would write it
  bool tools = false;
};

std::vector<Case>& cases() {
  static std::vector<Case> c = [] {
    std::vector<Case> v;
    v.push_back({"json_object", J::parse(R"({"type": "object"})"),
                 R"({"name": "The State of the Union", "year": 1987, "topics": ["economy", "defense", "trade"], )"
                 R"("ok": true, "notes": {"speaker": "the President", "length_minutes": 52.5}})"});
    v.push_back({"schema_person", J::parse(R"({"type": "object", "properties": {
                   "name": {"type": "string", "maxLength": 40},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "email": {"type": "string"},
                   "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "admin", "user"]},
                            "maxItems": 4},
                   "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                               "required": ["city"], "additionalProperties": false}},
                   "required": ["name", "age", "email"], "additionalProperties": false})"),
                 R"({"name": "Abraham Lincoln", "age": 56, "email": "abe@whitehouse.gov", "tags": ["admin", "user"], )"
                 R"("address": {"city": "Springfield", "zip": "62701"}})"});
    v.push_back({"long_string", J::parse(R"({"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"], "additionalProperties": false})"),
                 R"({"text": "Mr. Speaker, Mr. President, distinguished Members of the Congress, honored guests, and )"
                 R"(fellow citizens: the state of our Union is strong, and it grows stronger every year."})"});
    Case t{"tool_call", nullptr,
           "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
           "string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3"
           "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
           true};
    v.push_back(std::move(t));
    return v;
  }();
  return c;
}

dsv4::Grammar grammar_of(const Case& c) {
  if (!c.tools) return dsv4::json_schema_grammar(c.schema, "response_format");
  std::vector<dsv4::ToolSpec> tools{{"get_weather",
                                     J::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
                                       "days": {"type": "integer", "minimum": 1, "maximum": 14}},
                                       "required": ["city"]})"),
                                     "tools[0].function"}};
  dsv4::ToolGrammarOptions o;
  o.mode = dsv4::ToolMode::kRequired;
  return dsv4::tool_call_grammar(tools, o);
}

// One constrained answer: the reference tokens forced through mask + greedy sampling, the way the engine runs.
void run_answer(const std::vector<int32_t>& ids, std::shared_ptr<dsv4::GrammarAutomaton> a, dsv4::Sampler& s,
                std::vector<float>& l) {
  const Data& d = data();
  dsv4::OutputConstraintOptions o;
  o.grammar = std::move(a);
  dsv4::OutputConstraint c(d.vocab, o);
  for (int32_t id : ids) {
    std::memcpy(l.data(), d.logits.data(), l.size() * sizeof(float));
    l[id] += 100.0f;  // the model's choice
    if (o.grammar) c.apply(l);
    const int32_t t = s.sample(l);
    if (t != id) throw std::runtime_error("bench: the reference answer is not allowed by its grammar");
    if (o.grammar) c.accept(t);
  }
}

void BM_Step(benchmark::State& state, int ci, bool warm) {
  Data& d = data();
  const Case& c = cases()[ci];
  const auto ids = d.tok->encode(c.text, /*parse_special=*/true);
  dsv4::SamplingParams p;
  p.temperature = 0;
  dsv4::Sampler s(p, d.vocab->n_vocab());
  std::vector<float> l(d.vocab->n_vocab());
  const dsv4::Grammar g = grammar_of(c);
  auto shared = std::make_shared<dsv4::GrammarAutomaton>(g, d.vocab->trie);
  if (warm) run_answer(ids, shared, s, l);
  for (auto _ : state) {
    run_answer(ids, warm ? shared : std::make_shared<dsv4::GrammarAutomaton>(g, d.vocab->trie), s, l);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(ids.size()));
  state.counters["s_per_token"] = benchmark::Counter(static_cast<double>(state.iterations() * ids.size()),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["tokens"] = static_cast<double>(ids.size());
}

void BM_Unconstrained(benchmark::State& state) {
  Data& d = data();
  const auto ids = d.tok->encode(cases()[1].text, true);
  dsv4::SamplingParams p;
  p.temperature = 0;
  dsv4::Sampler s(p, d.vocab->n_vocab());
  std::vector<float> l(d.vocab->n_vocab());
  for (auto _ : state) run_answer(ids, nullptr, s, l);
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(ids.size()));
  state.counters["s_per_token"] = benchmark::Counter(static_cast<double>(state.iterations() * ids.size()),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_BuildVocabTrie(benchmark::State& state) {
  Data& d = data();
  for (auto _ : state) {
    dsv4::ConstraintVocab v(*d.tok, d.vocab->n_vocab(), 1);
    benchmark::DoNotOptimize(v.trie->n_nodes());
    state.counters["nodes"] = v.trie->n_nodes();
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--tokenizer=", 12) == 0)
      g_tokenizer_path = argv[i] + 12;
    else
      rest.push_back(argv[i]);
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RegisterBenchmark("BM_BuildVocabTrie", BM_BuildVocabTrie)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_Step/unconstrained", BM_Unconstrained)->Unit(benchmark::kMillisecond);
  for (int i = 0; i < static_cast<int>(cases().size()); ++i)
    for (bool warm : {false, true})
      benchmark::RegisterBenchmark((std::string("BM_Step/") + cases()[i].name + (warm ? "/warm" : "/cold")).c_str(),
                                   [i, warm](benchmark::State& st) { BM_Step(st, i, warm); })
          ->Unit(benchmark::kMillisecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
