// `dsv4 bench serve`: aggregate generation throughput of the HTTP server (continuous batching) at several numbers of
// concurrent clients. Starts `dsv4 serve`'s Server in-process on a free port (same model and engine options as
// serve: --device, --parallel, --batch-tokens, --kv-memory, --threads) — or measures a running server (--url) — and
// for each --clients C runs C client threads, each sending --requests non-streamed /v1/completions requests one
// after the other: a distinct prompt of --prompt tokens (ids, so no two clients share a prefix block), greedy,
// max_tokens --tokens with ignore_eos. Reports per C: requests, completion tokens, wall time, aggregate tokens/s,
// mean request latency, and the ratio of each level's tokens/s to the first level's, with the host's load average
// (wall-clock figures are comparable only on an idle machine), and the tokens per CPU-second of this process (the
// in-process server's efficiency, which a loaded machine disturbs less; not meaningful with --url). --json prints one JSON object.
// Failed requests are explained on stderr once per distinct error (could not connect, HTTP status and a body excerpt,
// ...) with their count, and make the exit code 1; a failed warm-up request is an error before any level runs.
//
//   dsv4 bench serve -m models/dsv4-demo --clients 1,8 [--tokens 32] [--prompt 64] [--requests 2] [--json]
//   dsv4 bench serve -m DIR --device cuda --clients 1,8,64,256 --parallel 256 --json
#include <httplib.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/int_option.h"
#include "cli/numerics_option.h"
#include "cli/byte_size.h"
#include "cli/command.h"
#include "cli/config_checks.h"
#include "cli/device_option.h"
#include "cli/int_list_option.h"
#include "cli/kv_memory_check.h"
#include "cli/placement_option.h"
#include "core/error.h"
#include "engine/batch_model.h"
#include "engine/model_loader.h"
#include "model/model.h"
#include "server/server.h"

namespace dsv4::cli {

namespace {

struct ServeBenchOpts {
  std::string model, url, device, numerics = "reference", kv_memory;
  std::vector<int> clients{1, 8};
  int tokens = 32, prompt = 64, requests = 2, threads = 0;
  int64_t parallel = 0, batch_tokens = 0;
  bool json = false;
  PlacementOptions placement;
};

struct Level {
  int clients = 0;
  int64_t requests = 0, failed = 0, completion_tokens = 0;
  double wall_s = 0, mean_latency_ms = 0;
  double cpu_s = 0;  // CPU time of this process (in-process server + clients) during the level
  // The server's engine loop during the level (/metrics differences; -1: not available): forward steps, their time
  // (batched forward + sampling) and the tokens they computed (prefill + decode).
  double steps = -1, step_seconds = -1, step_tokens = -1;
  std::map<std::string, int64_t> errors;  // why requests failed (failure_reason) -> how many
  double tokens_per_s() const { return wall_s > 0 ? double(completion_tokens) / wall_s : 0; }
  double tokens_per_cpu_s() const { return cpu_s > 0 ? double(completion_tokens) / cpu_s : 0; }
};

double process_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// The engine loop's counters from the server's /metrics: steps, their seconds, their tokens (-1 each when missing).
struct LoopCounters {
  double steps = -1, seconds = -1, tokens = -1;
};

// Why a /v1/completions answer does not count: "" when it is a success with usage.completion_tokens.
std::string failure_reason(const httplib::Result& res, const std::string& host, int port) {
  if (!res) {
    switch (res.error()) {
      case httplib::Error::Connection:
        return fmt::format("could not connect to {}:{} (connection refused or unreachable)", host, port);
      case httplib::Error::ConnectionTimeout: return fmt::format("connecting to {}:{} timed out", host, port);
      case httplib::Error::Read: return "no answer (the connection closed or the read timed out)";
      case httplib::Error::Write: return "could not send the request (the connection closed)";
      default: return "request failed: " + httplib::to_string(res.error());
    }
  }
  std::string excerpt = res->body.substr(0, 200);
  std::replace(excerpt.begin(), excerpt.end(), '\n', ' ');
  if (res->status != 200) return fmt::format("HTTP {}: {}", res->status, excerpt);
  const auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded()) return "HTTP 200 but the body is not JSON: " + excerpt;
  if (!j.contains("usage") || !j["usage"].contains("completion_tokens") ||
      !j["usage"]["completion_tokens"].is_number_integer())
    return "HTTP 200 without usage.completion_tokens: " + excerpt;
  return {};
}

LoopCounters loop_counters(const std::string& host, int port) {
  LoopCounters c;
  httplib::Client cl(host, port);
  auto res = cl.Get("/metrics");
  if (!res || res->status != 200) return c;
  auto value = [&](const std::string& name) {
    const std::string key = "\n" + name + " ";
    const auto at = res->body.find(key);
    return at == std::string::npos ? -1.0 : std::strtod(res->body.c_str() + at + key.size(), nullptr);
  };
  c.steps = value("dsv4_step_seconds_count");
  c.seconds = value("dsv4_step_seconds_sum");
  c.tokens = value("dsv4_step_tokens_total");
  return c;
}

Level run_level(const std::string& host, int port, int clients, const ServeBenchOpts& o, int32_t n_vocab, int salt) {
  Level lv;
  const LoopCounters loop0 = loop_counters(host, port);
  const double cpu0 = process_cpu_seconds();
  lv.clients = clients;
  std::atomic<int64_t> tokens{0}, done{0}, failed{0};
  std::atomic<int64_t> latency_us{0};
  std::mutex errors_mutex;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> th;
  for (int c = 0; c < clients; ++c)
    th.emplace_back([&, c] {
      httplib::Client cl(host, port);
      cl.set_read_timeout(3600, 0);
      for (int r = 0; r < o.requests; ++r) {
        std::vector<int32_t> ids{0};  // BOS, then ids unique to (level, client, request)
        for (int i = 1; i < o.prompt; ++i)
          ids.push_back(int32_t(3 + (uint64_t(i) * 7919 + uint64_t(c) * 104729 + uint64_t(r) * 1299709 +
                                     uint64_t(salt) * 15485863) %
                                        uint64_t(std::max(1, n_vocab - 3))));
        nlohmann::json body = {{"prompt", ids},          {"max_tokens", o.tokens}, {"temperature", 0},
                               {"ignore_eos", true},     {"stream", false}};
        const auto q0 = std::chrono::steady_clock::now();
        auto res = cl.Post("/v1/completions", body.dump(), "application/json");
        latency_us += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - q0)
                          .count();
        if (const std::string why = failure_reason(res, host, port); !why.empty()) {
          ++failed;
          const std::lock_guard<std::mutex> lock(errors_mutex);
          ++lv.errors[why];
          continue;
        }
        tokens += nlohmann::json::parse(res->body)["usage"]["completion_tokens"].get<int64_t>();
        ++done;
      }
    });
  for (auto& t : th) t.join();
  lv.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  lv.cpu_s = process_cpu_seconds() - cpu0;
  const LoopCounters loop1 = loop_counters(host, port);
  if (loop0.steps >= 0 && loop1.steps >= 0) {
    lv.steps = loop1.steps - loop0.steps;
    lv.step_seconds = loop1.seconds - loop0.seconds;
    lv.step_tokens = loop1.tokens - loop0.tokens;
  }
  lv.requests = done;
  lv.failed = failed;
  lv.completion_tokens = tokens;
  lv.mean_latency_ms = done + failed > 0 ? double(latency_us) / 1e3 / double(done + failed) : 0;
  return lv;
}

// The host's 1-minute load average (/proc/loadavg), -1 when unknown: CPU numbers are only comparable at low load.
double load_average() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return -1;
  double l = -1;
  if (std::fscanf(f, "%lf", &l) != 1) l = -1;
  std::fclose(f);
  return l;
}

int run_serve_bench(const ServeBenchOpts& o) {
  std::string host = "127.0.0.1";
  int port = 0;
  int32_t n_vocab = 1000;
  std::unique_ptr<Server> server;
  std::thread serving;
  std::string device_name = "remote";
  EngineLoopOptions eo;
  if (!o.url.empty() && !o.model.empty())
    usage_fail("bench serve: give one of -m MODEL (an in-process server) and --url (a running one)");
  if (o.url.empty() && o.model.empty()) usage_fail("bench serve: give -m MODEL (or --url of a running server)");
  if (!o.url.empty()) {
    std::string rest = o.url.rfind("http://", 0) == 0 ? o.url.substr(7) : "";
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    const auto colon = rest.rfind(':');
    const char* end = rest.data() + rest.size();
    if (colon == std::string::npos || colon == 0 ||
        std::from_chars(rest.data() + colon + 1, end, port).ptr != end || port < 1 || port > 65535)
      usage_fail("bench serve: --url must look like http://HOST:PORT (got '{}')", o.url);
    host = rest.substr(0, colon);
  } else {
    const Device device = resolve_device(o.device);
    const bool gpu = !device.is_cpu();
    const uint64_t cpu_default = uint64_t(1) << 30;
    const auto kv = o.kv_memory.empty() ? (gpu ? ByteSize(Fraction{0.9}) : ByteSize(cpu_default))
                                        : parse_byte_size(o.kv_memory, "--kv-memory", true);
    {  // what config.json alone refutes, before the model loads (as serve)
      const int64_t running = o.parallel > 0 ? o.parallel : gpu ? 256 : 16;
      if (const auto* b = std::get_if<uint64_t>(&kv))
        check_kv_memory_early(o.model, *b, running, false);
      else if (!gpu)
        check_kv_memory_early(o.model, uint64_t(std::get<Fraction>(kv).value * double(cpu_default)), running, false);
      if (const std::optional<ModelConfig> cfg = config_if_present(o.model)) check_placement(*cfg, o.placement);
    }
    LoadedModel lm = load_model(o.model, o.numerics, o.threads, device, 0, o.placement);
    if (!lm.tokenizer) fail("{}: no tokenizer.json", o.model);
    device_name = lm.device;
    auto model = std::dynamic_pointer_cast<const Model>(lm.model);
    if (!model) fail("internal: the loaded model is not a DeepSeek V4 model");
    n_vocab = model->n_vocab();
    eo.max_running = o.parallel > 0 ? o.parallel : gpu ? 256 : 16;
    eo.batch_tokens = o.batch_tokens > 0 ? o.batch_tokens : gpu ? 2048 : 512;
    eo.n_threads = o.threads;
    if (const auto* f = std::get_if<Fraction>(&kv))
      eo.state_bytes = uint64_t(f->value * double(gpu ? model->backend().memory().free : cpu_default));
    else
      eo.state_bytes = std::get<uint64_t>(kv);
    ServerOptions so;
    so.port = 0;
    so.n_ctx = o.prompt + o.tokens + 8;
    so.queue = *std::max_element(o.clients.begin(), o.clients.end());
    so.engine = eo;
    lm.model.reset();
    server = std::make_unique<Server>(so, batch_model_of(std::move(model)), lm.tokenizer);
    port = server->bind();
    serving = std::thread([&] { server->serve(); });
    for (int i = 0; i < 500; ++i) {
      httplib::Client c(host, port);
      if (c.Get("/health")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Warm-up: one short request (first-use costs out of the measurement).
  {
    ServeBenchOpts w = o;
    w.requests = 1;
    w.tokens = 2;
    const Level warm = run_level(host, port, 1, w, n_vocab, 9999);
    if (!warm.errors.empty()) {
      if (server) {
        server->stop();
        serving.join();
      }
      fail("bench serve: the warm-up request failed: {}", warm.errors.begin()->first);
    }
  }
  std::vector<Level> levels;
  const double load_before = load_average();
  for (size_t i = 0; i < o.clients.size(); ++i) {
    levels.push_back(run_level(host, port, o.clients[i], o, n_vocab, int(i)));
    const Level& l = levels.back();
    if (!o.json)
      std::printf("clients %4d: %5lld requests (%lld failed), %7lld tokens in %7.2f s: %8.1f tok/s aggregate, "
                  "mean latency %.0f ms, x%.2f of the first level; %.1f tok per CPU-second (x%.2f)\n",
                  l.clients, static_cast<long long>(l.requests), static_cast<long long>(l.failed),
                  static_cast<long long>(l.completion_tokens), l.wall_s, l.tokens_per_s(), l.mean_latency_ms,
                  levels.front().tokens_per_s() > 0 ? l.tokens_per_s() / levels.front().tokens_per_s() : 0.0,
                  l.tokens_per_cpu_s(),
                  levels.front().tokens_per_cpu_s() > 0 ? l.tokens_per_cpu_s() / levels.front().tokens_per_cpu_s()
                                                        : 0.0);
    for (const auto& [why, n] : l.errors)
      std::fprintf(stderr, "clients %4d: %lld request%s failed: %s\n", l.clients, static_cast<long long>(n),
                   n == 1 ? "" : "s", why.c_str());
    if (!o.json && l.steps > 0)
      std::printf("              engine loop: %.0f steps, %.1f tokens per step, %.2f ms per step, %.0f%% of the wall "
                  "time in steps\n",
                  l.steps, l.step_tokens / l.steps, 1e3 * l.step_seconds / l.steps, 100 * l.step_seconds / l.wall_s);
  }
  if (!o.json) std::printf("host load average (1 min) at the start: %.2f\n", load_before);
  if (server) {
    server->stop();
    serving.join();
  }
  if (o.json) {
    nlohmann::ordered_json j = {{"bench", "serve"},
                                {"model", o.model.empty() ? o.url : o.model},
                                {"device", device_name},
                                {"parallel", eo.max_running},
                                {"batch_tokens", eo.batch_tokens},
                                {"kv_memory_bytes", eo.state_bytes},
                                {"prompt_tokens", o.prompt},
                                {"max_tokens", o.tokens},
                                {"requests_per_client", o.requests},
                                {"load_average_1m", load_before}};
    nlohmann::ordered_json rs = nlohmann::ordered_json::array();
    for (const Level& l : levels)
      rs.push_back({{"clients", l.clients},
                    {"requests", l.requests},
                    {"failed", l.failed},
                    {"completion_tokens", l.completion_tokens},
                    {"wall_s", l.wall_s},
                    {"tokens_per_s", l.tokens_per_s()},
                    {"mean_latency_ms", l.mean_latency_ms},
                    {"cpu_s", l.cpu_s},
                    {"tokens_per_cpu_s", l.tokens_per_cpu_s()},
                    {"engine_steps", l.steps},
                    {"engine_step_seconds", l.step_seconds},
                    {"engine_step_tokens", l.step_tokens},
                    {"errors", l.errors},
                    {"ratio_to_first", levels.front().tokens_per_s() > 0
                                           ? l.tokens_per_s() / levels.front().tokens_per_s()
                                           : 0.0}});
    j["levels"] = rs;
    std::printf("%s\n", j.dump(2).c_str());
  }
  for (const Level& l : levels)
    if (l.failed > 0) return 1;
  return 0;
}

}  // namespace

void setup_bench_serve(CLI::App& app, Runner& run) {
  auto o = std::make_shared<ServeBenchOpts>();
  app.add_option("-m,--model", o->model, "model folder (an in-process server is started on it)");
  app.add_option("--url", o->url, "measure a running server instead (http://HOST:PORT)");
  add_int_list_option(app, "--clients", o->clients, "concurrent clients per level, comma-separated (default 1,8)", 1,
                      4096);
  app.add_option("--tokens", o->tokens, "generated tokens per request (default 32)")
      ->transform(dsv4::cli::integer_in<int64_t>(1, 1 << 20));
  app.add_option("--prompt", o->prompt, "prompt tokens per request (default 64)")
      ->transform(dsv4::cli::integer_in<int64_t>(1, 1 << 20));
  app.add_option("--requests", o->requests, "requests per client, one after the other (default 2)")
      ->transform(dsv4::cli::integer_in<int64_t>(1, 1 << 20));
  app.add_option("--threads", o->threads, "CPU compute threads (default 0: all cores)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, 4096));
  add_device_option(app, o->device);
  add_placement_options(app, o->placement);
  dsv4::cli::add_numerics_option(app, o->numerics, "reference | dense (default reference)");
  app.add_option("--parallel", o->parallel, "running sequences (default: cpu 16, cuda 256)")
      ->transform(dsv4::cli::integer_in<int64_t>(int64_t(1), int64_t(1) << 16));
  app.add_option("--batch-tokens", o->batch_tokens, "tokens per step (default: cpu 512, cuda 2048)")
      ->transform(dsv4::cli::integer_in<int64_t>(int64_t(1), int64_t(1) << 20));
  app.add_option("--kv-memory", o->kv_memory, "sequence-state memory (as serve; default cpu 1G, cuda 0.9)");
  app.add_flag("--json", o->json, "print one JSON object");
  run = [o] { return run_serve_bench(*o); };
}

}  // namespace dsv4::cli
