// `dsv4 generate`: raw text completion from a prompt (text with BOS prepended, or token ids as given).
// The prompt text (-p) is echoed, then the continuation streams to stdout as it is produced, so that the output reads
// as one text (as llama.cpp's CLI; --no-echo: the continuation alone); progress and prefill/decode speed go to stderr;
// --json prints one object instead. Ctrl-C stops the generation and prints what was produced.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli/numerics_option.h"
#include "cli/command.h"
#include "cli/device_option.h"
#include "cli/config_checks.h"
#include "cli/int_list_option.h"
#include "cli/int_option.h"
#include "cli/placement_option.h"
#include "cli/sampling_options.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "model/model.h"
#include "model/state_layout.h"

namespace {

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted = true; }

struct Opts {
  std::string model, prompt, numerics = "reference";
  std::vector<int32_t> prompt_ids;
  int64_t n = 128, ctx = 0;
  dsv4::cli::SamplingOptions sampling;
  float repeat = 1.0f, presence = 0.0f, frequency = 0.0f;
  int threads = 0;
  int spec_draft = 0;
  dsv4::PlacementOptions placement;
  std::string device;
  std::vector<std::string> stop;
  bool json = false, ignore_eos = false, echo = true;
};

void setup_generate(CLI::App& app, dsv4::cli::Runner& run) {
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "model folder (config.json, safetensors, tokenizer.json)")->required();
  auto* p = app.add_option("-p,--prompt", o->prompt, "prompt text (BOS is prepended; special tokens are parsed)");
  auto* ids = dsv4::cli::add_int_list_option(app, "--prompt-ids", o->prompt_ids,
                                             "comma-separated prompt token ids (used as given)", 0, INT32_MAX);
  p->excludes(ids);
  app.add_option("-n,--max-tokens", o->n, "tokens to generate at most (default 128; -1: until the context is full)")
      ->transform(CLI::Validator(
          [](std::string& s) -> std::string {
            const std::optional<int64_t> v = dsv4::cli::parse_integer<int64_t>(s);
            if (!v || !(*v == -1 || (*v >= 1 && *v <= int64_t(1) << 40)))
              return fmt::format("must be -1 (until the context is full) or in [1, 2^40] (got '{}')", s);
            s = std::to_string(*v);  // (CLI11 would read a leading 0 as octal)
            return {};
          },
          "INT"));
  dsv4::cli::add_sampling_options(app, o->sampling);
  app.add_option("--stop", o->stop, "stop string (repeatable); not printed")
      ->check([](const std::string& s) { return s.empty() ? "stop strings must not be empty" : std::string(); });
  app.add_option("--repeat-penalty", o->repeat, "repetition penalty on prompt + output tokens (default 1 = off)")
      ->check(dsv4::cli::sampling_range(&dsv4::SamplingParams::repetition_penalty));
  app.add_option("--presence-penalty", o->presence, "presence penalty on output tokens (default 0)")
      ->check(dsv4::cli::sampling_range(&dsv4::SamplingParams::presence_penalty));
  app.add_option("--frequency-penalty", o->frequency, "frequency penalty on output tokens (default 0)")
      ->check(dsv4::cli::sampling_range(&dsv4::SamplingParams::frequency_penalty));
  dsv4::cli::add_numerics_option(app, o->numerics, "reference | dense (default reference)");
  app.add_option("--threads", o->threads, "compute threads (default 0: all cores)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, 4096));
  app.add_option("--spec-draft", o->spec_draft,
                 "speculative decoding: draft tokens per step with the checkpoint's drafter (its MTP module: 1-4; a "
                 "DSpark drafter: 1 .. its block size; default 0: off)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, int(dsv4::StateLayout::kMaxDraftLimit)));
  dsv4::cli::add_device_option(app, o->device);
  dsv4::cli::add_placement_options(app, o->placement);
  app.add_option("--ctx", o->ctx, "context size in tokens (default 0: the model's maximum)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, int64_t(1) << 40));
  app.add_flag("--ignore-eos", o->ignore_eos, "keep generating after the end-of-sequence token");
  app.add_flag("--echo,!--no-echo", o->echo,
               "print the -p prompt text before the generated text (default; --no-echo: the generated text alone)");
  app.add_flag("--json", o->json,
               "print one JSON object {prompt_ids, ids, text, finish_reason, timings} instead of streaming text");
  run = [o, p] {
    using namespace dsv4;
    // Everything the command line alone can tell is checked before the model is loaded (usage errors: exit 2).
    if (p->count() > 0 && o->prompt.empty())
      usage_fail("-p/--prompt is empty: give some prompt text (or --prompt-ids LIST)");
    if (o->prompt.empty() && o->prompt_ids.empty()) usage_fail("give a prompt with -p TEXT or --prompt-ids LIST");
    if (const std::optional<ModelConfig> cfg = cli::config_if_present(o->model)) {  // (before the "loading" line)
      cli::check_ctx(*cfg, o->ctx);
      cli::check_prompt_ids(*cfg, o->prompt_ids);
      const int64_t n_ctx = o->ctx > 0 ? o->ctx : cfg->max_position_embeddings;
      if (int64_t(o->prompt_ids.size()) >= n_ctx)
        usage_fail("--prompt-ids: {} ids leave no room to generate in a context of {} tokens (--ctx)",
                   o->prompt_ids.size(), n_ctx);
      if (o->spec_draft > 0) Model::check_draft(*cfg, o->spec_draft);
      check_placement(*cfg, o->placement);
    }
    std::fprintf(stderr, "loading %s ...\n", o->model.c_str());
    LoadedModel lm =
        load_model(o->model, o->numerics, o->threads, dsv4::cli::resolve_device(o->device), o->spec_draft,
                   o->placement);
    std::fprintf(stderr, "device: %s\n", lm.device.c_str());
    const Tokenizer* tok = lm.tokenizer.get();
    GenerationRequest req;
    if (!o->prompt_ids.empty()) {
      req.prompt = o->prompt_ids;
    } else {
      if (!tok) fail("{}: no tokenizer.json; use --prompt-ids", o->model);
      req.prompt = tok->encode(o->prompt, true);
      if (req.prompt.empty() || req.prompt.front() != lm.model->bos_id())
        req.prompt.insert(req.prompt.begin(), lm.model->bos_id());
    }
    if (!o->stop.empty() && !tok) fail("{}: no tokenizer.json, --stop needs one", o->model);
    req.max_tokens = o->n;
    req.stop = o->stop;
    req.ignore_eos = o->ignore_eos;
    auto& s = req.sampling;
    s = o->sampling.params();
    s.repetition_penalty = o->repeat;
    s.presence_penalty = o->presence;
    s.frequency_penalty = o->frequency;
    s.validate();

    Engine engine(lm.model, o->ctx);
    std::signal(SIGINT, on_sigint);
    GenerationCallbacks cb;
    size_t n_out = 0;
    cb.on_token = [&](int32_t id, std::string_view text) {
      if (!o->json) {
        if (tok) {
          std::fwrite(text.data(), 1, text.size(), stdout);
        } else if (id >= 0) {
          std::printf("%s%d", n_out ? "," : "", id);
        }
        std::fflush(stdout);
      }
      if (id >= 0) ++n_out;
      return true;
    };
    cb.should_cancel = [] { return g_interrupted.load(); };
    std::fprintf(stderr, "prompt: %zu tokens\n", req.prompt.size());
    if (o->echo && !o->json && !o->prompt.empty()) {  // the text as typed (--prompt-ids: nothing to echo)
      std::fwrite(o->prompt.data(), 1, o->prompt.size(), stdout);
      std::fflush(stdout);
    }
    GenerationResult r = engine.generate(req, tok, cb);
    std::signal(SIGINT, SIG_DFL);
    const auto& t = r.timings;
    if (o->json) {
      nlohmann::json j = {{"prompt_ids", req.prompt},
                          {"ids", r.ids},
                          {"text", r.text},
                          {"finish_reason", to_string(r.finish)},
                          {"timings",
                           {{"prompt_tokens", t.prompt_tokens},
                            {"prefill_tokens", t.prefill_tokens},
                            {"prefill_ms", t.prefill_ms},
                            {"prefill_tokens_per_s", t.prefill_tokens_per_s()},
                            {"generated_tokens", r.ids.size()},
                            {"decode_tokens", t.decode_tokens},
                            {"decode_ms", t.decode_ms},
                            {"decode_tokens_per_s", t.decode_tokens_per_s()},
                            {"drafted_tokens", t.drafted_tokens},
                            {"accepted_tokens", t.accepted_tokens}}}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("\n");
    }
    std::fflush(stdout);
    std::fprintf(stderr,
                 "prefill: %lld tokens in %.1f ms (%.2f tok/s); decode: %lld step%s in %.1f ms (%.2f tok/s); "
                 "generated %zu tokens, finish: %s\n",
                 static_cast<long long>(t.prefill_tokens), t.prefill_ms, t.prefill_tokens_per_s(),
                 static_cast<long long>(t.decode_tokens), t.decode_tokens == 1 ? "" : "s", t.decode_ms,
                 t.decode_tokens_per_s(), r.ids.size(), to_string(r.finish));
    if (t.drafted_tokens > 0)
      std::fprintf(stderr, "speculative decoding: %lld of %lld draft tokens accepted (%.1f%%)\n",
                   static_cast<long long>(t.accepted_tokens), static_cast<long long>(t.drafted_tokens),
                   100.0 * double(t.accepted_tokens) / double(t.drafted_tokens));
    return r.finish == FinishReason::cancelled ? 130 : 0;
  };
}

}  // namespace

DSV4_COMMAND(generate, "Generate a raw text completion", setup_generate);
