// `dsv4 bench structured -m DIR [-n N] [--threads T] [--repeat R] [--json]`: decode speed of a real model with and
// without a JSON-schema constraint (what response_format costs per token end to end: trie walks for new grammar states,
// cached masks, masking the logits, advancing the grammar).
//   unconstrained: N greedy tokens of a chat answer, EOS ignored;
//   schema cold:   the same prompt with a schema constraint on a fresh grammar automaton (first request with that
//                  schema: every new state's mask is computed);
//   schema warm:   again, on the automaton of the cold run (what a repeated schema costs; the server caches them).
// The constrained runs know max_tokens = N, as in the server: the shortest completion is watched and the JSON is
// closed before the budget runs out (that cost is included).
// The schema (at least 64 records with strings, numbers, enums, nested objects) never lets the output end early,
// so every run decodes N tokens. Reports ms per decoded token and the difference to the unconstrained run.
#include "cli/int_option.h"
#include "cli/numerics_option.h"
#include "cli/bench_structured.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_encoding.h"
#include "cli/device_option.h"
#include "core/error.h"
#include "engine/constraint_vocab.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "engine/output_constraint.h"
#include "server/json_schema_grammar.h"

namespace dsv4::cli {

namespace {

struct Opts {
  std::string model, numerics = "reference", device;
  int n = 128, threads = 0, repeat = 3;
  bool json = false;
};

constexpr const char* kSchema = R"({"type": "array", "minItems": 64, "items": {"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 24}, "year": {"type": "integer", "minimum": 1776, "maximum": 2100},
  "party": {"enum": ["Democratic", "Republican", "Whig", "Federalist", "None"]},
  "score": {"type": "number"}, "topics": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
  "office": {"type": "object", "properties": {"title": {"type": "string", "maxLength": 20}, "term": {"type": "integer"}},
             "required": ["title"], "additionalProperties": false}},
  "required": ["name", "year", "party"], "additionalProperties": false}})";

}  // namespace

void setup_bench_structured(CLI::App& app, Runner& run) {
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "model folder (with tokenizer.json)")->required();
  app.add_option("-n,--tokens", o->n, "tokens to decode per run (default 128)")
      ->transform(dsv4::cli::integer_in<int64_t>(8, 100000));
  app.add_option("--threads", o->threads, "compute threads (default 0: all cores)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, 4096));
  app.add_option("--repeat", o->repeat, "runs of each kind; the fastest counts (default 3)")
      ->transform(dsv4::cli::integer_in<int64_t>(1, 100));
  dsv4::cli::add_numerics_option(app, o->numerics, "reference | dense (default reference)");
  add_device_option(app, o->device);
  app.add_flag("--json", o->json, "print one JSON object");
  run = [o] {
    LoadedModel lm = load_model(o->model, o->numerics, o->threads, resolve_device(o->device));
    if (!lm.tokenizer) fail("{}: no tokenizer.json", o->model);
    const auto req = OrderedJson::parse(
        R"({"messages": [{"role": "user", "content": "List the presidents who gave the addresses."}],
            "thinking": {"type": "disabled"}})");
    GenerationRequest gen;
    gen.prompt = tokenize_prompt(*lm.tokenizer, render_chat(req));
    gen.sampling.temperature = 0;
    gen.max_tokens = o->n;
    gen.ignore_eos = true;
    Engine engine(lm.model, static_cast<int64_t>(gen.prompt.size()) + o->n + 1);

    const auto t_vocab = std::chrono::steady_clock::now();
    auto vocab = std::make_shared<ConstraintVocab>(*lm.tokenizer, lm.model->n_vocab(), lm.model->eos_id());
    const double vocab_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_vocab).count();
    std::shared_ptr<GrammarAutomaton> automaton;

    auto decode_ms_per_token = [&](bool constrained) {
      GenerationRequest g = gen;
      if (constrained) {
        OutputConstraintOptions co;
        co.grammar = automaton;
        co.max_tokens = g.max_tokens;  // as the server sets it: completion lengths are watched, the end closes the JSON
        g.constraint = std::make_shared<OutputConstraint>(vocab, co);
      }
      engine.reset();  // every run prefills the prompt cold
      const GenerationResult r = engine.generate(g, lm.tokenizer.get());
      if (r.timings.decode_tokens <= 0) fail("bench structured: nothing decoded");
      return std::pair<double, std::string>(r.timings.decode_ms / static_cast<double>(r.timings.decode_tokens), r.text);
    };
    const auto schema = nlohmann::ordered_json::parse(kSchema);
    auto fresh = [&] {
      automaton = std::make_shared<GrammarAutomaton>(json_schema_grammar(schema, "schema"), vocab->trie);
    };
    decode_ms_per_token(false);  // warm-up (page cache, allocations)
    // The fastest of `repeat` runs of each kind (shared machines are noisy); cold runs get a fresh automaton each.
    double plain = 1e30, cold = 1e30, warm = 1e30;
    std::string cold_text, warm_text;
    GrammarAutomaton::Stats stats_cold, stats;
    for (int k = 0; k < o->repeat; ++k) plain = std::min(plain, decode_ms_per_token(false).first);
    for (int k = 0; k < o->repeat; ++k) {
      fresh();
      const auto [ms, text] = decode_ms_per_token(true);
      cold = std::min(cold, ms);
      cold_text = text;
    }
    stats_cold = automaton->stats();
    for (int k = 0; k < o->repeat; ++k) {
      const auto [ms, text] = decode_ms_per_token(true);
      warm = std::min(warm, ms);
      warm_text = text;
    }
    stats = automaton->stats();
    if (cold_text != warm_text) fail("bench structured: the warm run differs from the cold run");
    if (o->json) {
      nlohmann::ordered_json j = {
          {"model", lm.name},
          {"vocab", lm.model->n_vocab()},
          {"tokens", o->n},
          {"vocab_trie_ms", vocab_ms},
          {"trie_nodes", vocab->trie->n_nodes()},
          {"unconstrained_ms_per_token", plain},
          {"schema_cold_ms_per_token", cold},
          {"schema_warm_ms_per_token", warm},
          {"masks_computed_cold", stats_cold.masks_computed},
          {"mask_cache_hits_warm", (stats.mask_cache_hits - stats_cold.mask_cache_hits) / o->repeat},
          {"output", cold_text}};
      std::printf("%s\n", j.dump(2).c_str());
      return 0;
    }
    std::printf("model %s, vocabulary %d (trie: %d nodes, built in %.1f ms), %d greedy tokens per run\n",
                lm.name.c_str(), lm.model->n_vocab(), vocab->trie->n_nodes(), vocab_ms, o->n);
    std::printf("  unconstrained  %8.3f ms/token\n", plain);
    std::printf("  schema, cold   %8.3f ms/token  (+%.3f; %lld masks computed)\n", cold, cold - plain,
                static_cast<long long>(stats_cold.masks_computed));
    std::printf("  schema, warm   %8.3f ms/token  (+%.3f; %lld masks from the cache)\n", warm, warm - plain,
                static_cast<long long>((stats.mask_cache_hits - stats_cold.mask_cache_hits) / o->repeat));
    std::printf("  output: %.200s\n", cold_text.c_str());
    return 0;
  };
}

}  // namespace dsv4::cli
