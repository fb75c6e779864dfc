// `dsv4 chat`: interactive chat in the terminal. History is kept (and its KV state reused between turns through
// the engine's prefix reuse); reasoning is shown apart from the answer. Commands: /think on|off, /reset, /exit.
// EOF (Ctrl-D) exits; Ctrl-C stops the current answer (and exits when pressed at the prompt).
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>

#include "chat/chat_encoding.h"
#include "chat/output_parser.h"
#include "cli/int_option.h"
#include "cli/numerics_option.h"
#include "cli/command.h"
#include "cli/config_checks.h"
#include "cli/device_option.h"
#include "cli/placement_option.h"
#include "cli/sampling_options.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "model/model.h"
#include "model/state_layout.h"

namespace {

std::atomic<bool> g_generating{false};
std::atomic<bool> g_cancel{false};
void on_sigint(int) {
  if (g_generating) {
    g_cancel = true;
  } else {
    const char nl = '\n';
    (void)!write(STDOUT_FILENO, &nl, 1);
    _exit(130);
  }
}

struct Opts {
  std::string model, numerics = "reference", system;
  int64_t n = 4096, ctx = 32768;
  dsv4::cli::SamplingOptions sampling;
  int threads = 0;
  int spec_draft = 0;
  dsv4::PlacementOptions placement;
  std::string device;
  bool think = false;
};

void setup_chat(CLI::App& app, dsv4::cli::Runner& run) {
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "model folder (config.json, safetensors, tokenizer.json)")->required();
  app.add_option("-n,--max-tokens", o->n, "tokens per answer at most (default 4096)")
      ->transform(dsv4::cli::integer_in<int64_t>(int64_t(1), int64_t(1) << 40));
  app.add_option("--ctx", o->ctx, "context size in tokens (default 32768)")
      ->transform(dsv4::cli::integer_in<int64_t>(int64_t(2), int64_t(1) << 40));
  dsv4::cli::add_sampling_options(app, o->sampling);
  app.add_option("--system", o->system, "system prompt");
  app.add_flag("--think", o->think, "start with thinking mode on (toggle with /think on|off)");
  dsv4::cli::add_numerics_option(app, o->numerics, "reference | dense (default reference)");
  app.add_option("--threads", o->threads, "compute threads (default 0: all cores)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, 4096));
  app.add_option("--spec-draft", o->spec_draft,
                 "speculative decoding: draft tokens per step with the checkpoint's drafter (its MTP module: 1-4; a "
                 "DSpark drafter: 1 .. its block size; default 0: off)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, int(dsv4::StateLayout::kMaxDraftLimit)));
  dsv4::cli::add_device_option(app, o->device);
  dsv4::cli::add_placement_options(app, o->placement);
  run = [o] {
    using namespace dsv4;
    if (const std::optional<ModelConfig> cfg = cli::config_if_present(o->model)) {  // before the model loads
      if (o->spec_draft > 0) Model::check_draft(*cfg, o->spec_draft);
      check_placement(*cfg, o->placement);
    }
    std::fprintf(stderr, "loading %s ...\n", o->model.c_str());
    LoadedModel lm =
        load_model(o->model, o->numerics, o->threads, dsv4::cli::resolve_device(o->device), o->spec_draft,
                   o->placement);
    std::fprintf(stderr, "device: %s\n", lm.device.c_str());
    if (!lm.tokenizer) fail("{}: no tokenizer.json (chat needs one)", o->model);
    const Tokenizer& tok = *lm.tokenizer;
    Engine engine(lm.model, std::min(o->ctx, lm.model->max_context()));
    SamplingParams sp = o->sampling.params();
    sp.validate();
    const bool tty = isatty(STDOUT_FILENO);
    const char* dim = tty ? "\x1b[2m" : "";
    const char* reset = tty ? "\x1b[0m" : "";
    bool think = o->think;
    OrderedJson messages = OrderedJson::array();
    if (!o->system.empty()) messages.push_back({{"role", "system"}, {"content", o->system}});
    std::signal(SIGINT, on_sigint);
    std::fprintf(stderr, "dsv4 chat: %s. /think on|off, /reset, /exit; Ctrl-D exits.\n", lm.name.c_str());
    std::string line;
    for (;;) {
      std::printf("%s> ", think ? "[think] " : "");
      std::fflush(stdout);
      if (!std::getline(std::cin, line)) break;
      if (line.empty()) continue;
      if (line == "/exit" || line == "/quit") break;
      if (line == "/think on" || line == "/think off") {
        think = line == "/think on";
        continue;
      }
      if (line == "/reset") {
        messages = OrderedJson::array();
        if (!o->system.empty()) messages.push_back({{"role", "system"}, {"content", o->system}});
        continue;
      }
      if (line[0] == '/') {
        std::printf("commands: /think on|off, /reset, /exit\n");
        continue;
      }
      messages.push_back({{"role", "user"}, {"content", line}});
      OrderedJson req = {{"messages", messages}, {"thinking", {{"type", think ? "enabled" : "disabled"}}}};
      ChatPrompt prompt = render_chat(req);
      GenerationRequest gr;
      gr.prompt = tokenize_prompt(tok, prompt);
      gr.sampling = sp;
      gr.sampling.seed = sp.seed + messages.size();
      gr.max_tokens = std::min<int64_t>(o->n, engine.n_ctx() - static_cast<int64_t>(gr.prompt.size()));
      if (gr.max_tokens < 1) {
        std::printf("(the conversation fills the context; /reset to start over)\n");
        messages.erase(messages.size() - 1);
        continue;
      }
      OutputParser parser(prompt.thinking);
      bool in_reasoning = false;
      auto show = [&](const ChatDelta& d) {
        if (!d.reasoning.empty()) {
          if (!in_reasoning) std::printf("%s[thinking]\n", dim);
          in_reasoning = true;
          std::printf("%s%s", dim, d.reasoning.c_str());
        }
        if (!d.content.empty() || !d.tool_calls.empty()) {
          if (in_reasoning) std::printf("%s\n[answer]\n", reset);
          in_reasoning = false;
          std::printf("%s", d.content.c_str());
          for (const auto& t : d.tool_calls) std::printf("\n[tool call] %s(%s)", t.name.c_str(), t.arguments.c_str());
        }
        std::fflush(stdout);
      };
      GenerationCallbacks cb;
      cb.on_token = [&](int32_t, std::string_view text) {
        show(parser.push(text));
        return true;
      };
      cb.should_cancel = [] { return g_cancel.load(); };
      g_cancel = false;
      g_generating = true;
      GenerationResult r = engine.generate(gr, &tok, cb);
      g_generating = false;
      show(parser.finish());
      std::printf("%s\n", reset);
      std::fflush(stdout);  // the reply's newline before the stats line (stdout may share a file with stderr)
      std::fprintf(stderr, "%s[%zu tokens, prefill %.1f tok/s (%lld cached), decode %.2f tok/s%s]%s\n", dim,
                   r.ids.size(), r.timings.prefill_tokens_per_s(), static_cast<long long>(r.timings.cached_tokens),
                   r.timings.decode_tokens_per_s(), r.finish == FinishReason::cancelled ? ", interrupted" : "", reset);
      OrderedJson msg = {{"role", "assistant"}, {"content", parser.content()}};
      if (!parser.reasoning().empty()) msg["reasoning_content"] = parser.reasoning();
      messages.push_back(msg);
    }
    std::printf("\n");
    return 0;
  };
}

}  // namespace

DSV4_COMMAND(chat, "Interactive chat in the terminal", setup_chat);
