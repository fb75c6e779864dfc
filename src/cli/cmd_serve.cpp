// `dsv4 serve`: OpenAI- and Anthropic-compatible HTTP server (src/server/server.h). SIGINT / SIGTERM cancel running
// requests and shut down cleanly (exit code 0). --api-key / --api-key-file require a key on every route but /health;
// --reasoning-budget caps thinking requests that set no budget of their own; /admin/park releases the model, which
// /admin/unpark (or, with --auto-unpark, the next request) loads again from the same folder with the same options.
// Continuous batching (engine/engine_loop.h): --parallel sequences run at once, --batch-tokens tokens per forward
// step, --kv-memory bytes of sequence state (slots + pages + snapshots of the prefix cache), --queue sequences may
// wait beyond the running ones (then 503 queue_full). Defaults per device:
//   cpu:  --parallel 16, --batch-tokens 512, --kv-memory 1G (a fraction f means f * 1G);
//   cuda: --parallel 256, --batch-tokens 2048, --kv-memory 0.9 (a fraction of the GPU memory free once the weights
//         are resident).
// --cache-dir / --cache-size: the prefix cache's disk tier (EngineLoopOptions::cache_dir / cache_size).
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "cli/int_option.h"
#include "cli/numerics_option.h"
#include "server/http_transport.h"
#include "cli/byte_size.h"
#include "cli/command.h"
#include "cli/device_option.h"
#include "cli/kv_memory_check.h"
#include "cli/placement_option.h"
#include "core/error.h"
#include "engine/batch_model.h"
#include "engine/disk_cache.h"
#include "engine/model_loader.h"
#include "model/state_layout.h"
#include "model/model.h"
#include "server/auth.h"
#include "server/server.h"

namespace {

struct Opts {
  std::string model, host = "127.0.0.1", numerics = "reference", model_name;
  int port = 8080, queue = 64, threads = 0;
  int64_t parallel = 0, batch_tokens = 0;  // 0: the device's default
  std::string kv_memory, cache_dir, cache_size = "16G";
  int spec_draft = 0;
  dsv4::PlacementOptions placement;
  std::string device;
  int64_t ctx = 32768;
  double keepalive = 5.0;
  std::string api_key, api_key_file;
  int64_t reasoning_budget = -1;
  bool auto_unpark = false;
};

void setup_serve(CLI::App& app, dsv4::cli::Runner& run) {
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "model folder (config.json, safetensors, tokenizer.json)")->required();
  app.add_option("--host", o->host, "address to listen on (default 127.0.0.1)")
      ->check(CLI::Validator([](std::string& s) { return s.empty() ? "needs an address" : std::string(); }, ""));
  app.add_option("--port", o->port, "port (default 8080; 0 = any free port)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, 65535));
  app.add_option("--ctx", o->ctx, "context size per request: prompt + output tokens (default 32768)")
      ->transform(dsv4::cli::integer_in<int64_t>(int64_t(2), int64_t(1) << 40));
  app.add_option("--queue", o->queue,
                 "sequences that may wait beyond the running ones; more get 503 queue_full (default 64)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, 1 << 20));
  app.add_option("--parallel", o->parallel, "sequences running at once (default: cpu 16, cuda 256)")
      ->transform(dsv4::cli::integer_in<int64_t>(int64_t(1), int64_t(1) << 16));
  app.add_option("--batch-tokens", o->batch_tokens, "tokens per forward step (default: cpu 512, cuda 2048)")
      ->transform(dsv4::cli::integer_in<int64_t>(int64_t(1), int64_t(1) << 20));
  app.add_option("--kv-memory", o->kv_memory,
                 "sequence-state memory: bytes (8G, 512M) or a fraction such as 0.9 (cuda: of the free GPU memory; "
                 "cpu: of 1G); default cpu 1G, cuda 0.9");
  app.add_option("--cache-dir", o->cache_dir, "disk tier of the prefix cache (default: none)");
  app.add_option("--cache-size", o->cache_size, "bytes the disk tier may use (default 16G)");
  dsv4::cli::add_numerics_option(app, o->numerics, "reference | dense (default reference)");
  app.add_option("--threads", o->threads, "compute threads (default 0: all cores)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, 4096));
  app.add_option("--spec-draft", o->spec_draft,
                 "speculative decoding: draft tokens per step with the checkpoint's drafter (its MTP module: 1-4; a "
                 "DSpark drafter: 1 .. its block size; default 0: off)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, int(dsv4::StateLayout::kMaxDraftLimit)));
  dsv4::cli::add_device_option(app, o->device);
  dsv4::cli::add_placement_options(app, o->placement);
  app.add_option("--model-name", o->model_name, "model id reported by the API (default: the folder name)");
  app.add_option("--keepalive", o->keepalive, "seconds between SSE keepalive comments while waiting (default 5)")
      ->check(CLI::Validator(
          [](std::string& s) {
            double v = 0;
            if (!CLI::detail::lexical_cast(s, v)) return std::string();  // the conversion's own error
            return v >= 0.01 && v <= 3600.0 ? std::string()  // (CLI::Range lets NaN through)
                                            : "must be in [0.01, 3600] seconds (got '" + s + "')";
          },
          ""));
  // An empty key (--api-key "$KEY" with KEY unset) is a usage error, not a server without authentication.
  auto* key =
      app.add_option("--api-key", o->api_key,
                     "require this key (Authorization: Bearer KEY or x-api-key: KEY) on every route but /health")
          ->check(CLI::Validator(
              [](std::string& v) {
                return v.find_first_not_of(" \t\r\n") == std::string::npos
                           ? std::string("the key is empty (an unset variable?); leave the option out to serve "
                                         "without a key")
                           : std::string();
              },
              ""));
  app.add_option("--api-key-file", o->api_key_file, "read the required API key from the first line of this file")
      ->excludes(key);
  app.add_option("--reasoning-budget", o->reasoning_budget,
                 "default cap on reasoning tokens of thinking requests (then </think> is forced; default: none)")
      ->transform(dsv4::cli::integer_in<int64_t>(int64_t(1), int64_t(1) << 40));
  app.add_flag("--auto-unpark", o->auto_unpark, "a request to a parked model loads it again (instead of 503)");
  run = [o] {
    using namespace dsv4;
    // Signals are taken by a dedicated thread (sigwait); every other thread, including the model's, blocks them.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);

    std::string api_key = o->api_key;
    if (!o->api_key_file.empty()) api_key = read_api_key_file(o->api_key_file);
    const std::optional<cli::ByteSize> kv_arg =
        o->kv_memory.empty() ? std::nullopt
                             : std::optional<cli::ByteSize>(cli::parse_byte_size(o->kv_memory, "--kv-memory", true));
    const uint64_t cache_size = std::get<uint64_t>(cli::parse_byte_size(o->cache_size, "--cache-size", false));
    if (!o->cache_dir.empty())  // an unusable disk tier is an error here, not a warning after the model loaded
      if (const std::string why = DiskCache::unusable_reason(o->cache_dir); !why.empty())
        fail("--cache-dir {}: {}", o->cache_dir, why);
    // A port in use is reported before the model loads (minutes on a large model); Server::bind() below still
    // reports what changes in between.
    if (const std::string why = probe_listen(o->host, o->port); !why.empty())
      fail("cannot listen on {}:{}: {}", o->host, o->port, why);
    const Device device = dsv4::cli::resolve_device(o->device);
    if (const std::optional<ModelConfig> cfg = cli::config_if_present(o->model)) {  // before the model loads
      if (o->spec_draft > 0) Model::check_draft(*cfg, o->spec_draft);
      check_placement(*cfg, o->placement);
    }
    {  // an impossible absolute --kv-memory (or a CPU fraction of 1G) is an error before the model loads
      const bool on_gpu = device.kind != DeviceKind::cpu;
      const int64_t running = o->parallel > 0 ? o->parallel : on_gpu ? 256 : 16;
      const cli::ByteSize kv = kv_arg ? *kv_arg : on_gpu ? cli::ByteSize(cli::Fraction{0.9}) : cli::ByteSize(uint64_t(1) << 30);
      if (const auto* b = std::get_if<uint64_t>(&kv))
        cli::check_kv_memory_early(o->model, *b, running, o->spec_draft > 0);
      else if (!on_gpu)
        cli::check_kv_memory_early(o->model, uint64_t(std::get<cli::Fraction>(kv).value * double(uint64_t(1) << 30)),
                                   running, o->spec_draft > 0);
    }
    std::fprintf(stderr, "loading %s ...\n", o->model.c_str());
    LoadedModel lm = load_model(o->model, o->numerics, o->threads, device, o->spec_draft, o->placement);
    std::fprintf(stderr, "device: %s\n", lm.device.c_str());
    if (!lm.tokenizer) fail("{}: no tokenizer.json (the server needs one)", o->model);
    auto model = std::dynamic_pointer_cast<const Model>(lm.model);
    if (!model) fail("internal: the loaded model is not a DeepSeek V4 model");
    lm.model.reset();
    const bool gpu = device.kind != DeviceKind::cpu;
    EngineLoopOptions eo;
    eo.max_running = o->parallel > 0 ? o->parallel : gpu ? 256 : 16;
    eo.batch_tokens = o->batch_tokens > 0 ? o->batch_tokens : gpu ? 2048 : 512;
    eo.n_threads = o->threads;
    {
      const uint64_t cpu_default = uint64_t(1) << 30;
      const cli::ByteSize kv = kv_arg ? *kv_arg : gpu ? cli::ByteSize(cli::Fraction{0.9}) : cli::ByteSize(cpu_default);
      if (const auto* f = std::get_if<cli::Fraction>(&kv))
        eo.state_bytes = uint64_t(f->value * double(gpu ? model->backend().memory().free : cpu_default));
      else
        eo.state_bytes = std::get<uint64_t>(kv);
    }
    eo.cache_dir = o->cache_dir;
    eo.cache_size = cache_size;
    eo.spec_draft = o->spec_draft;
    ServerOptions so;
    so.host = o->host;
    so.port = o->port;
    so.n_ctx = o->ctx;
    so.queue = o->queue;
    so.model_name = o->model_name.empty() ? lm.name : o->model_name;
    so.keepalive_s = o->keepalive;
    so.api_key = api_key;
    so.reasoning_budget = o->reasoning_budget;
    so.auto_unpark = o->auto_unpark;
    so.engine = eo;
    so.reload = [o, device]() -> std::shared_ptr<const BatchModel> {
      auto m = std::dynamic_pointer_cast<const Model>(
          load_model(o->model, o->numerics, o->threads, device, o->spec_draft, o->placement).model);
      if (!m) fail("internal: the loaded model is not a DeepSeek V4 model");
      return batch_model_of(std::move(m));
    };
    // the only reference: /admin/park frees the model
    Server server(so, batch_model_of(std::move(model)), lm.tokenizer);
    int port = server.bind();

    std::atomic<bool> done{false};
    std::thread sig([&] {
      int signo = 0;
      sigwait(&set, &signo);
      if (done) return;
      std::fprintf(stderr, "dsv4 serve: %s, shutting down\n", signo == SIGINT ? "SIGINT" : "SIGTERM");
      while (!done) {
        server.stop();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
    std::fprintf(stderr,
                 "dsv4 serve: model '%s' on http://%s:%d (ctx %lld, parallel %lld, batch tokens %lld, kv memory %.0f "
                 "MiB, queue %d)\n",
                 so.model_name.c_str(), url_host(so.host).c_str(), port, static_cast<long long>(server.n_ctx()),
                 static_cast<long long>(eo.max_running), static_cast<long long>(eo.batch_tokens),
                 double(eo.state_bytes) / double(1 << 20), so.queue);
    server.serve();
    done = true;
    pthread_kill(sig.native_handle(), SIGTERM);  // wake sigwait if no signal came
    sig.join();
    std::fprintf(stderr, "dsv4 serve: stopped\n");
    return 0;
  };
}

}  // namespace

DSV4_COMMAND(serve, "OpenAI- and Anthropic-compatible HTTP server", setup_serve);
