// `dsv4 bench spec -m DIR | --config CFG --load-format dummy [--batch 1,8] [--draft 1,2,3,4] [-n N] [--json]`:
// speculative decoding with the checkpoint's drafter (the MTP module or the DSpark drafter, engine/spec_decode.h)
// against plain decoding, through the EngineLoop:
// per batch size B, B greedy requests of N tokens (EOS ignored) without speculation and with k drafts per step;
// decode tok/s (timed from the end of the first step, which prefills the short prompts and samples every request's
// first token; the fastest of --repeat runs), speed-up, acceptance
// rate (accepted / drafted), tokens per target step, the measured cost of a verify step and of the drafts per step
// (so that the speed-up at another acceptance rate can be computed), and whether the tokens equal plain decoding.
// Dummy weights (--load-format dummy) give a random drafter, hence a low acceptance rate.
// Greedy tokens must equal plain decoding where the backend guarantees it (the CPU; CUDA with --deterministic): a
// difference there is an error. CUDA's default fast mode is batch invariant only up to 8 tokens per linear (verify
// steps of more tokens run other GEMM kernels), so there a difference is reported, not an error.
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/parallel.h"
#include "cli/int_option.h"
#include "cli/numerics_option.h"
#include "cli/command.h"
#include "cli/int_list_option.h"
#include "cli/device_option.h"
#include "core/error.h"
#include "engine/engine_loop.h"
#include "model/dummy_weights.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::cli {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Opts {
  std::string model, config, load_format = "auto", device, numerics = "reference";
  std::vector<int> batch{1, 8}, draft{1, 2, 3, 4};
  int n = 128, threads = 0, layers = 0, repeat = 1;
  bool json = false;
};

const char* const kTexts[] = {
    "The Congress of the United States has",
    "In the last year our commerce with foreign nations",
    "I have the honor to submit to the Senate and the House of Representatives",
    "The finances of the Government are in a sound condition, and",
    "Fellow citizens, the state of the Union is",
    "Our relations with the other powers of the world",
    "The army and the navy of the United States",
    "It is my duty to call the attention of Congress to",
};

struct Result {
  std::vector<std::vector<int32_t>> tokens;
  double seconds = 0;               // decode: after the first step
  int64_t decode_tokens = 0, steps = 0, drafted = 0, accepted = 0;
  double draft_seconds = 0;
};

Result run_once(std::shared_ptr<const Model> m, const std::vector<std::vector<int32_t>>& prompts, int k, int64_t n) {
  EngineLoopOptions o;
  o.max_running = int64_t(prompts.size());
  o.start_thread = false;
  o.spec_draft = k;
  o.n_pages = int64_t(prompts.size()) * (StateLayout::pages_for(256 + n) + 1);
  o.n_snapshots = 0;
  EngineLoop loop(m, o);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : prompts) {
    EngineRequest r;
    r.prompt = p;
    r.sampling.temperature = 0.0f;
    r.max_tokens = n;
    r.ignore_eos = true;
    streams.push_back(loop.submit(std::move(r)));
  }
  loop.step();  // prefill (short prompts: one step) and every first token
  const EngineLoop::Stats s0 = loop.stats();
  if (s0.generated_tokens != int64_t(prompts.size())) fail("bench spec: the prompts did not fit in one step");
  const auto t0 = Clock::now();
  loop.run_until_idle();
  Result res;
  res.seconds = since(t0);
  for (auto& s : streams) {
    const RequestStream::Result r = s->wait();
    if (r.end == StreamEnd::error) fail("bench spec: a request failed: {}", r.error);
    res.tokens.push_back(r.tokens);
  }
  const EngineLoop::Stats s1 = loop.stats();
  res.decode_tokens = s1.generated_tokens - s0.generated_tokens;
  res.steps = s1.steps - s0.steps;
  res.drafted = s1.drafted_tokens - s0.drafted_tokens;
  res.accepted = s1.accepted_tokens - s0.accepted_tokens;
  res.draft_seconds = s1.draft_seconds - s0.draft_seconds;
  return res;
}

int run_bench(const Opts& o) {
  auto say = [&](const std::string& s) { std::fprintf(o.json ? stderr : stdout, "%s\n", s.c_str()); };
  const auto num = parse_numerics(o.numerics);
  if (!num) usage_fail("bench spec: --numerics must be reference or dense (got '{}')", o.numerics);
  const std::vector<int>& batches = o.batch;
  const std::vector<int>& drafts = o.draft;
  if (o.model.empty() == o.config.empty()) usage_fail("bench spec: give exactly one of -m DIR and --config FILE");
  std::string fmt_ = o.load_format;
  if (fmt_ == "auto") fmt_ = o.config.empty() ? "safetensors" : "dummy";
  if (fmt_ != "dummy" && fmt_ != "safetensors")
    usage_fail("bench spec: --load-format must be auto, dummy or safetensors");
  if (fmt_ == "safetensors" && o.model.empty())
    usage_fail("bench spec: give -m DIR (or --config CFG --load-format dummy)");
  // --layers checked as bench model does, before loading (a checkpoint holds all of its layers)
  const ModelConfig full = load_config(o.config.empty() ? o.model + "/config.json" : o.config);
  if (o.layers < 0 || o.layers > full.num_hidden_layers)
    usage_fail("bench spec: --layers must be in [1, {}], or 0 for all (got {})", full.num_hidden_layers, o.layers);
  if (fmt_ == "safetensors" && o.layers != 0 && o.layers != full.num_hidden_layers)
    usage_fail("bench spec: --layers needs --load-format dummy (a checkpoint holds all of its layers)");
  for (int k : drafts) Model::check_draft(full, k, "--draft");  // the checkpoint's drafter bounds the drafts
  if (o.threads > 0) set_num_threads(o.threads);
  ModelOptions mo;
  mo.numerics = *num;
  mo.device = resolve_device(o.device);
  mo.drafter = true;
  std::shared_ptr<const Model> m;
  std::shared_ptr<const Tokenizer> tok;
  if (fmt_ == "dummy") {
    m = Model::load_dummy(keep_first_layers(full, o.layers), mo);
  } else {
    m = Model::load(o.model, mo);
    if (std::filesystem::exists(std::filesystem::path(o.model) / "tokenizer.json"))
      tok = std::make_shared<Tokenizer>(Tokenizer::from_file(std::filesystem::path(o.model) / "tokenizer.json"));
  }
  say(fmt::format("bench spec: {} ({}), {} numerics, on {}", o.model.empty() ? o.config : o.model, fmt_, o.numerics,
                  m->backend().description()));

  nlohmann::json out;
  out["model"] = o.model.empty() ? o.config : o.model;
  out["load_format"] = fmt_;
  out["device"] = m->backend().description();
  out["drafter"] = m->drafter() == StateLayout::Drafter::dspark ? "dspark" : "mtp";
  out["numerics"] = o.numerics;
  out["tokens_per_request"] = o.n;
  out["repeat"] = o.repeat;
  out["runs"] = nlohmann::json::array();
  const bool exact = m->backend().device().is_cpu() || cuda_deterministic();
  out["deterministic"] = exact;
  for (int B : batches) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < B; ++i) {
      std::vector<int32_t> p;
      if (tok) {
        p = tok->encode(kTexts[i % 8], true);
        if (p.empty() || p.front() != m->bos_id()) p.insert(p.begin(), m->bos_id());
      } else {
        p.push_back(m->bos_id());
        for (int t = 1; t < 24; ++t) p.push_back(int32_t(3 + (t * 131 + i * 977) % (m->n_vocab() - 3)));
      }
      prompts.push_back(std::move(p));
    }
    (void)run_once(m, prompts, 0, 8);  // warm-up
    auto best = [&](int k) {
      Result r = run_once(m, prompts, k, o.n);
      for (int i = 1; i < o.repeat; ++i) {
        Result x = run_once(m, prompts, k, o.n);
        if (x.seconds < r.seconds) r = std::move(x);
      }
      return r;
    };
    const Result base = best(0);
    const double base_tps = double(base.decode_tokens) / base.seconds;
    const double base_ms = 1e3 * base.seconds / double(base.steps);
    say(fmt::format("batch {}: plain {:.1f} tok/s ({:.2f} ms per decode step)", B, base_tps, base_ms));
    out["runs"].push_back({{"batch", B}, {"draft", 0}, {"decode_tokens_per_s", base_tps},
                           {"decode_steps", base.steps}, {"ms_per_step", base_ms}});
    for (int k : drafts) {
      const Result r = best(k);
      const double tps = double(r.decode_tokens) / r.seconds;
      const double acc = r.drafted ? double(r.accepted) / double(r.drafted) : 0;
      const double verify_s = r.seconds - r.draft_seconds;
      const double per_step = double(r.decode_tokens) / double(r.steps);
      const bool same = r.tokens == base.tokens;
      say(fmt::format("batch {} k={}: {:.1f} tok/s (x{:.2f}), {} of {} drafts accepted ({:.1f}%), {:.2f} tokens per "
                      "step, verify step {:.2f} ms, drafts {:.2f} ms per step, tokens {}",
                      B, k, tps, tps / base_tps, r.accepted, r.drafted, 100 * acc, per_step,
                      1e3 * verify_s / double(r.steps), 1e3 * r.draft_seconds / double(r.steps),
                      same ? "identical" : exact ? "DIFFERENT" : "different (fast CUDA mode: not batch invariant here)"));
      out["runs"].push_back({{"batch", B},
                             {"draft", k},
                             {"decode_tokens_per_s", tps},
                             {"speedup", tps / base_tps},
                             {"drafted_tokens", r.drafted},
                             {"accepted_tokens", r.accepted},
                             {"acceptance_rate", acc},
                             {"decode_steps", r.steps},
                             {"tokens_per_step", per_step},
                             {"verify_ms_per_step", 1e3 * verify_s / double(r.steps)},
                             {"draft_ms_per_step", 1e3 * r.draft_seconds / double(r.steps)},
                             {"identical_to_plain", same}});
      if (!same && exact) fail("bench spec: batch {} k={}: greedy tokens differ from plain decoding", B, k);
    }
  }
  if (o.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

void setup_bench_spec(CLI::App& app, Runner& run) {
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "checkpoint folder");
  app.add_option("--config", o->config, "config.json of the model to build (with --load-format dummy)");
  dsv4::cli::add_load_format_option(app, o->load_format, "auto (dummy with --config) | dummy | safetensors");
  app.add_option("--layers", o->layers, "keep the first N layers (dummy weights; 0: all)");  // checked in run_bench
  add_int_list_option(app, "--batch", o->batch, "comma-separated batch sizes (default 1,8)", 1, 256);
  add_int_list_option(app, "--draft", o->draft, "comma-separated draft counts (default 1,2,3,4)", 1,
                      int(StateLayout::kMaxDraftLimit));
  app.add_option("-n,--tokens", o->n, "tokens per request (default 128)")
      ->transform(dsv4::cli::integer_in<int64_t>(2, 1 << 20));
  app.add_option("--threads", o->threads, "CPU threads (default 0: all)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, 4096));
  app.add_option("--repeat", o->repeat, "runs of each kind; the fastest counts (default 1)")
      ->transform(dsv4::cli::integer_in<int64_t>(1, 100));
  dsv4::cli::add_numerics_option(app, o->numerics, "reference | dense");
  add_device_option(app, o->device);
  app.add_flag("--json", o->json, "print one JSON object on stdout (progress on stderr)");
  run = [o] { return run_bench(*o); };
}

}  // namespace dsv4::cli
