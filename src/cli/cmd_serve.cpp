// `dsv4 serve`: OpenAI- and Anthropic-compatible HTTP server (src/server/server.h). SIGINT / SIGTERM cancel running
// requests and shut down cleanly (exit code 0). --api-key / --api-key-file require a key on every route but /health;
// --reasoning-budget caps thinking requests that set no budget of their own; /admin/park releases the model, which
// /admin/unpark (or, with --auto-unpark, the next request) loads again from the same folder with the same options.
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "cli/command.h"
#include "cli/device_option.h"
#include "core/error.h"
#include "engine/model_loader.h"
#include "server/auth.h"
#include "server/server.h"

namespace {

struct Opts {
  std::string model, host = "127.0.0.1", numerics = "reference", model_name;
  int port = 8080, queue = 16, threads = 0;
  int spec_draft = 0;
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
  app.add_option("--host", o->host, "address to listen on (default 127.0.0.1)");
  app.add_option("--port", o->port, "port (default 8080; 0 = any free port)")->check(CLI::Range(0, 65535));
  app.add_option("--ctx", o->ctx, "context size per request: prompt + output tokens (default 32768)")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 40));
  app.add_option("--queue", o->queue, "requests that may wait behind the running one (default 16)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--numerics", o->numerics, "reference | dense (default reference)");
  app.add_option("--threads", o->threads, "compute threads (default 0: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--spec-draft", o->spec_draft,
                 "speculative decoding: draft tokens per step with the model's MTP module (1-4; default 0: off)")
      ->check(CLI::Range(0, 4));
  dsv4::cli::add_device_option(app, o->device);
  app.add_option("--model-name", o->model_name, "model id reported by the API (default: the folder name)");
  app.add_option("--keepalive", o->keepalive, "seconds between SSE keepalive comments while waiting (default 5)")
      ->check(CLI::Range(0.01, 3600.0));
  auto* key =
      app.add_option("--api-key", o->api_key,
                     "require this key (Authorization: Bearer KEY or x-api-key: KEY) on every route but /health");
  app.add_option("--api-key-file", o->api_key_file, "read the required API key from the first line of this file")
      ->excludes(key);
  app.add_option("--reasoning-budget", o->reasoning_budget,
                 "default cap on reasoning tokens of thinking requests (then </think> is forced; default: none)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
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
    std::fprintf(stderr, "loading %s ...\n", o->model.c_str());
    const Device device = dsv4::cli::resolve_device(o->device);
    LoadedModel lm = load_model(o->model, o->numerics, o->threads, device, o->spec_draft);
    std::fprintf(stderr, "device: %s\n", lm.device.c_str());
    if (!lm.tokenizer) fail("{}: no tokenizer.json (the server needs one)", o->model);
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
    so.reload = [o, device] { return load_model(o->model, o->numerics, o->threads, device, o->spec_draft).model; };
    Server server(so, std::move(lm.model), lm.tokenizer);  // the only reference: /admin/park frees the model
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
    std::fprintf(stderr, "dsv4 serve: model '%s' on http://%s:%d (ctx %lld, queue %d)\n", so.model_name.c_str(),
                 so.host.c_str(), port, static_cast<long long>(server.n_ctx()), so.queue);
    server.serve();
    done = true;
    pthread_kill(sig.native_handle(), SIGTERM);  // wake sigwait if no signal came
    sig.join();
    std::fprintf(stderr, "dsv4 serve: stopped\n");
    return 0;
  };
}

}  // namespace

DSV4_COMMAND(serve, "OpenAI-compatible HTTP server", setup_serve);
