#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "engine/constraint_vocab.h"
#include "engine/loop_generation.h"
#include "engine/output_constraint.h"
#include "server/anthropic_api.h"
#include "server/api_error.h"
#include "server/auth.h"
#include "server/connection_monitor.h"
#include "server/generation_output.h"
#include "server/loop_host.h"
#include "server/metrics.h"
#include "server/http_transport.h"
#include "server/openai_format.h"
#include "server/openai_request.h"
#include "server/sse_writer.h"
#include "server/stream_pump.h"
#include "server/streamed_choices.h"

namespace dsv4 {

namespace {

using json = nlohmann::ordered_json;

enum class Api { kChat, kCompletion, kMessages };

constexpr size_t kMaxCachedAutomata = 8;
constexpr int kStreamThreads = 2;  // StreamPump threads: the text layer of all streamed responses

std::string random_hex(int n) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lk(mu);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < n; ++i) s += hex[rng() & 15];
  return s;
}

bool anthropic_path(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

ApiError shutting_down() { return ApiError(503, "the server is shutting down", "server_error", "", "shutting_down"); }

}  // namespace

struct Server::Impl {
  ServerOptions opts;
  std::shared_ptr<const Tokenizer> tok;
  LoopHost host;
  HttpServer http;                   // cpp-httplib over a reactor (server/http_transport.h)
  // path -> the methods its routes take (the Allow header of a 405), filled by setup_routes
  std::map<std::string, std::string> allowed_methods;
  std::atomic<bool> stopping{false};
  std::atomic<int> open_streams{0};  // SSE responses not yet completely written (see stop())
  std::atomic<bool> bound{false};
  int port = -1;

  // Admission: sequences admitted at once (running + waiting in the loop + being answered) <= capacity.
  std::mutex admit_mu;
  int64_t in_flight = 0;
  const int64_t capacity;
  std::atomic<int64_t> rejected{0}, http_requests{0};
  Metrics metrics;

  std::once_flag vocab_once;
  std::shared_ptr<const ConstraintVocab> vocab;
  std::mutex automata_mu;
  std::list<std::pair<std::string, std::shared_ptr<GrammarAutomaton>>> automata;  // most recently used first
  // The threads of every streamed response's generation (server/stream_pump.h); last: its tasks (which hold leases
  // of `host` and admissions) are released before the rest.
  StreamPump pump{kStreamThreads};

  static EngineLoopOptions loop_options(const ServerOptions& o) {
    EngineLoopOptions e = o.engine;
    e.n_ctx = o.n_ctx;
    return e;
  }

  Impl(ServerOptions o, std::shared_ptr<const BatchModel> m, std::shared_ptr<const Tokenizer> t)
      : opts(std::move(o)),
        tok(std::move(t)),
        host(std::move(m), opts.reload, loop_options(opts)),
        capacity(opts.engine.max_running + opts.queue) {}

  // A place for n sequences, released when the last copy is destroyed; null when the server is full.
  class Admission {
   public:
    Admission(Impl& i, int64_t n) : impl_(i), n_(n) {}
    ~Admission() {
      std::lock_guard lk(impl_.admit_mu);
      impl_.in_flight -= n_;
    }

   private:
    Impl& impl_;
    int64_t n_;
  };
  std::shared_ptr<Admission> admit(int64_t n) {
    std::lock_guard lk(admit_mu);
    if (in_flight + n > capacity) return nullptr;
    in_flight += n;
    return std::make_shared<Admission>(*this, n);
  }
  int64_t admitted() {
    std::lock_guard lk(admit_mu);
    return in_flight;
  }

  void send_error(httplib::Response& res, const ApiError& e, bool anthropic) const {
    if (e.status() == 503)
      res.set_header("Retry-After", std::to_string(e.code() == "model_parked" ? opts.park_retry_after_s : 1));
    if (e.status() == 401) res.set_header("WWW-Authenticate", "Bearer");
    send_json(res, e.status(), anthropic ? json(e.to_anthropic_json()) : json(e.to_json()));
  }

  json chunk_base(const std::string& id, int64_t created, bool chat) const {
    return {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", opts.model_name},
            {"system_fingerprint", "dsv4"}};
  }

  std::shared_ptr<const ConstraintVocab> constraint_vocab() {
    std::call_once(vocab_once, [&] {
      const auto t0 = std::chrono::steady_clock::now();
      vocab = std::make_shared<ConstraintVocab>(*tok, host.n_vocab(), host.eos_id());
      log::info("constrained decoding: vocabulary trie of {} nodes built in {:.0f} ms", vocab->trie->n_nodes(),
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    });
    return vocab;
  }

  std::shared_ptr<GrammarAutomaton> automaton(const ApiRequest& ar) {
    std::lock_guard lk(automata_mu);
    for (auto it = automata.begin(); it != automata.end(); ++it)
      if (it->first == ar.grammar_key) {
        automata.splice(automata.begin(), automata, it);
        return automata.front().second;
      }
    auto a = std::make_shared<GrammarAutomaton>(*ar.grammar, constraint_vocab()->trie);
    automata.emplace_front(ar.grammar_key, a);
    if (automata.size() > kMaxCachedAutomata) automata.pop_back();
    return a;
  }

  // The token constraint of one generation of a parsed request (null: none). Stateful: one per choice.
  std::shared_ptr<TokenConstraint> make_constraint(const ApiRequest& ar) {
    const bool budget = ar.chat && ar.thinking && ar.reasoning_budget >= 0;
    if (!ar.grammar && !budget) return nullptr;
    OutputConstraintOptions o;
    o.thinking = ar.thinking;
    o.reasoning_budget = budget ? ar.reasoning_budget : -1;
    o.max_tokens = ar.gen.max_tokens;
    if (ar.grammar) o.grammar = automaton(ar);
    try {
      return std::make_shared<OutputConstraint>(constraint_vocab(), std::move(o));
    } catch (const Error& e) {
      throw ApiError(500, fmt::format("constrained decoding is not available: {}", e.what()), "server_error");
    }
  }

  // Server defaults and the token constraint of a parsed request (choice 0's).
  void prepare(ApiRequest& ar) {
    if (ar.chat && ar.thinking && ar.reasoning_budget < 0 && opts.reasoning_budget > 0)
      ar.reasoning_budget = opts.reasoning_budget;
    ar.gen.constraint = make_constraint(ar);
  }

  // A structured answer that the constraint closed early to fit max_tokens ended because of the length limit.
  static void note_forced_close(const std::shared_ptr<TokenConstraint>& constraint, GenerationResult& r) {
    auto c = std::dynamic_pointer_cast<OutputConstraint>(constraint);
    if (c && c->forced_close() && r.finish == FinishReason::stop) r.finish = FinishReason::length;
  }

  // The loop for one request, loading the model again first when parked with auto_unpark.
  LoopHost::Lease lease_for_request() {
    std::string err;
    std::optional<LoopHost::Lease> l = [&]() -> std::optional<LoopHost::Lease> {
      try {
        return host.acquire(opts.auto_unpark);
      } catch (const Error& e) {
        err = e.what();
        return std::nullopt;
      }
    }();
    if (!err.empty()) throw ApiError(500, fmt::format("loading the model failed: {}", err), "server_error");
    if (!l) throw ApiError(503, "the model is parked; POST /admin/unpark loads it", "server_error", "", "model_parked");
    return std::move(*l);
  }

  // The n choices of a request: choice i gets seed + i and its own constraint; choice 0 runs on this thread, the
  // others on their own threads once choice 0's prompt has been computed (its first token or its end), so that they
  // reuse its cached blocks. cb(i) gives choice i's callbacks (called from choice i's thread); done(i, r) runs on
  // choice i's thread when it ended without an error. Throws the first choice's dsv4::Error (the others are
  // cancelled).
  struct Choices {
    std::vector<GenerationResult> results;
    double wall_ms = 0;  // from the submission of choice 0 to the end of the last choice
    std::vector<std::shared_ptr<TokenConstraint>> constraints;
  };
  // The GenerationRequest of each choice: seed + i, its own constraint (into `constraints`).
  std::vector<GenerationRequest> choice_requests(const ApiRequest& ar,
                                                 std::vector<std::shared_ptr<TokenConstraint>>& constraints) {
    const int n = ar.n;
    constraints.resize(size_t(n));
    std::vector<GenerationRequest> reqs(size_t(n), ar.gen);
    for (int i = 0; i < n; ++i) {
      reqs[size_t(i)].sampling.seed = ar.gen.sampling.seed + uint64_t(i);
      constraints[size_t(i)] = i == 0 ? ar.gen.constraint : make_constraint(ar);
      reqs[size_t(i)].constraint = constraints[size_t(i)];
    }
    return reqs;
  }

  Choices run_choices(EngineLoop& loop, const ApiRequest& ar, const std::function<GenerationCallbacks(int)>& cb,
                      const std::function<void(int, GenerationResult&)>& done) {
    const int n = ar.n;
    const auto t_start = std::chrono::steady_clock::now();
    Choices c;
    c.results.resize(size_t(n));
    c.constraints.resize(size_t(n));
    std::vector<GenerationRequest> reqs = choice_requests(ar, c.constraints);
    std::mutex mu;
    std::condition_variable cv;
    bool prefilled = false;
    std::atomic<bool> failed{false}, first_cancelled{false};
    auto mark = [&] {
      std::lock_guard lk(mu);
      prefilled = true;
      cv.notify_all();
    };
    std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
    auto run = [&](int i) {
      try {
        GenerationCallbacks g = cb(i);
        if (i == 0 && n > 1) {
          auto inner = g.on_token;
          g.on_token = [&, inner](int32_t id, std::string_view text) {
            mark();
            return inner ? inner(id, text) : true;
          };
        }
        auto outer_cancel = g.should_cancel;
        g.should_cancel = [&, outer_cancel] { return failed.load() || (outer_cancel && outer_cancel()); };
        GenerationResult r =
            generate_on_loop(loop, reqs[size_t(i)], tok.get(), g, std::chrono::milliseconds(20), /*per_token=*/ar.stream);
        note_forced_close(c.constraints[size_t(i)], r);
        if (i == 0 && r.finish == FinishReason::cancelled) first_cancelled = true;
        if (done) done(i, r);
        c.results[size_t(i)] = std::move(r);
      } catch (...) {
        errors[size_t(i)] = std::current_exception();
        failed = true;
      }
      if (i == 0) mark();
    };
    std::vector<std::thread> others;
    for (int i = 1; i < n; ++i)
      others.emplace_back([&, i] {
        {
          std::unique_lock lk(mu);
          cv.wait(lk, [&] { return prefilled; });
        }
        if (failed || first_cancelled) {
          c.results[size_t(i)].finish = FinishReason::cancelled;
          return;
        }
        run(i);
      });
    run(0);
    for (auto& t : others) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    c.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();
    return c;
  }

  // `timings` of n choices: the prompt's processing is choice 0's (the others start on its cached blocks once it has
  // its first token), the generation runs from choice 0's first token to the end of the last choice; predicted_n
  // counts the tokens of all (= usage.completion_tokens).
  // wall_ms: from the submission of choice 0 to the end of the last choice.
  static ojson timings_of(const std::vector<GenerationResult>& results, double wall_ms) {
    GenerationTimings t = results.front().timings;
    int64_t generated = 0;
    for (const auto& r : results) generated += static_cast<int64_t>(r.ids.size());
    if (results.size() > 1) {
      t.decode_ms = std::max(t.decode_ms, wall_ms - t.prefill_ms);
      for (size_t i = 1; i < results.size(); ++i) {
        t.drafted_tokens += results[i].timings.drafted_tokens;
        t.accepted_tokens += results[i].timings.accepted_tokens;
      }
    }
    return timings_json(t, generated);
  }
  static ojson timings_of(const Choices& c) { return timings_of(c.results, c.wall_ms); }

  // usage of n choices: the prompt once (choice 0's cached tokens), completion tokens of all.
  static GenerationResult usage_of(const std::vector<GenerationResult>& rs) {
    GenerationResult u = rs.front();
    for (size_t i = 1; i < rs.size(); ++i) u.ids.insert(u.ids.end(), rs[i].ids.begin(), rs[i].ids.end());
    return u;
  }
  static bool any_cancelled(const std::vector<GenerationResult>& rs) {
    for (const auto& r : rs)
      if (r.finish == FinishReason::cancelled) return true;
    return false;
  }

  void setup_routes();
  void handle_generate(const httplib::Request& req, httplib::Response& res, Api api);
  void handle_admin(const httplib::Request& req, httplib::Response& res, bool park);
  void respond_whole(ApiRequest& ar, ConnectionMonitor& mon, httplib::Response& res);
  // Streamed responses (the connection detached from the request thread: server/http_transport.h): the first
  // frames are written on the request thread, the generation runs on the stream pump. A stream whose lease has to
  // wait (the model loads or parks) waits on the pump's waiting thread, its connection already the reactor's (which
  // writes keepalives meanwhile): it holds no request thread.
  void start_stream(std::shared_ptr<ApiRequest> ar, std::shared_ptr<Admission> admission,
                    std::shared_ptr<ChunkedStream> out);
  // The lease of a stream, or why it has none (its error event).
  struct StreamLease {
    std::optional<LoopHost::Lease> lease;
    std::optional<ApiError> error;
    LoopHost::Lease take() {
      if (error) throw *error;
      return std::move(*lease);
    }
  };
  void stream_with_lease(std::shared_ptr<ApiRequest> ar, std::shared_ptr<Admission> admission, SseWriter w,
                         StreamLease lease);
  void stream_openai(std::shared_ptr<ApiRequest> ar, std::shared_ptr<Admission> admission, SseWriter w,
                     StreamLease lease);
  void stream_anthropic(std::shared_ptr<ApiRequest> ar, std::shared_ptr<Admission> admission, SseWriter w,
                        StreamLease lease);
};

void Server::Impl::setup_routes() {
  // Request threads of the transport: a streamed response holds one only until its first frames are written (its
  // generation runs on the stream pump, its bytes are written by the reactor); a whole response holds one while it
  // generates. So: one per running sequence plus some for the first frames of streams, /health, /metrics and
  // refusals — not one per queued request (non-streamed requests beyond these wait for a thread in the transport).
  HttpTransportOptions transport = opts.http;
  if (transport.workers <= 0) transport.workers = int(opts.engine.max_running + 32);
  transport.json_bodies = true;  // every POST route takes JSON, also when sent as curl -d's form-urlencoded
  http.set_transport(transport);
  http.set_payload_max_length(opts.max_body_bytes);
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string key = presented_api_key(req.get_header_value("Authorization"), req.get_header_value("x-api-key"));
    if (constant_time_equal(key, opts.api_key)) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res,
               ApiError(401,
                        key.empty() ? "an API key is required (Authorization: Bearer KEY or x-api-key: KEY)"
                                    : "the API key is not valid",
                        "invalid_request_error", "", "invalid_api_key"),
               anthropic_path(req.path));
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    // A known path with a method none of its routes takes: 405 with an Allow header (the transport leaves 404).
    std::string code;
    if (res.status == 404) {
      if (const auto it = allowed_methods.find(req.path); it != allowed_methods.end()) {
        res.status = 405;
        res.set_header("Allow", it->second);
        code = "method_not_allowed";
      }
    }
    std::string msg =
        res.status == 404   ? fmt::format("no route for {} {}", req.method, req.path)
        : res.status == 405 ? fmt::format("method {} is not allowed on {} (allowed: {})", req.method, req.path,
                                          allowed_methods.at(req.path))
        : res.status == 413 ? fmt::format("request body too large (the limit is {} bytes)", opts.max_body_bytes)
                            : fmt::format("HTTP error {}", res.status);
    ApiError e(res.status, msg, res.status >= 500 ? "server_error" : "invalid_request_error", "", code);
    const json j = anthropic_path(req.path) ? json(e.to_anthropic_json()) : json(e.to_json());
    res.set_content(j.dump(), "application/json");
  });
  http.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, msg, "server_error"), anthropic_path(req.path));
  });

  auto get = [this](const std::string& path, httplib::Server::Handler h) {
    allowed_methods[path] = "GET, HEAD";  // cpp-httplib answers HEAD with the GET route
    http.Get(path, std::move(h));
  };
  auto post = [this](const std::string& path, httplib::Server::Handler h) {
    allowed_methods[path] = "POST";
    http.Post(path, std::move(h));
  };
  get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const auto st = host.stats();
    const int64_t admitted = this->admitted();
    json j = {{"status", stopping ? "shutting_down" : "ok"},
              {"model", opts.model_name},
              {"model_state", host.state_name()},
              {"n_ctx", host.n_ctx()},
              {"busy", admitted > 0},
              {"running", st ? st->running : 0},
              {"waiting", st ? st->waiting : 0},
              {"in_flight", admitted},
              {"parallel", opts.engine.max_running},
              {"queue", opts.queue}};
    send_json(res, stopping ? 503 : 200, j);
  });
  get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    ServerCounters sc;
    sc.in_flight = admitted();
    sc.capacity = capacity;
    sc.rejected = rejected.load();
    sc.http_requests = http_requests.load();
    sc.loaded = host.state() == LoopHost::State::kLoaded;
    res.set_content(metrics.render(host.stats(), host.state_layout(), sc), "text/plain; version=0.0.4");
  });
  get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", opts.model_name},
              {"object", "model"},
              {"created", 0},
              {"owned_by", "dsv4"},
              {"max_model_len", host.n_ctx()}};
    send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
  });
  post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { handle_generate(req, res, Api::kChat); });
  post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, res, Api::kCompletion);
  });
  post("/v1/messages",
            [this](const httplib::Request& req, httplib::Response& res) { handle_generate(req, res, Api::kMessages); });
  post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      const ApiRequest ar = parse_anthropic_request(req.body, *tok, host.n_ctx(), /*count_only=*/true);
      send_json(res, 200, {{"input_tokens", static_cast<int64_t>(ar.gen.prompt.size())}});
    } catch (const ApiError& e) {
      send_error(res, e, true);
    }
  });
  post("/admin/park",
            [this](const httplib::Request& req, httplib::Response& res) { handle_admin(req, res, true); });
  post("/admin/unpark",
            [this](const httplib::Request& req, httplib::Response& res) { handle_admin(req, res, false); });
}

void Server::Impl::handle_admin(const httplib::Request& req, httplib::Response& res, bool park) {
  try {
    if (stopping) throw shutting_down();
    if (park && !host.can_park())
      throw ApiError(409, "this server cannot park its model (no loader)", "invalid_request_error", "",
                     "park_unsupported");
    json j;
    if (park) {
      host.park();  // after the requests in flight
      j = {{"status", "parked"}, {"model_state", host.state_name()}};
    } else {
      const bool was_loaded = host.state() == LoopHost::State::kLoaded;
      try {
        host.unpark();
      } catch (const Error& e) {
        throw ApiError(500, fmt::format("loading the model failed: {}", e.what()), "server_error");
      }
      j = {{"status", "loaded"},
           {"model_state", host.state_name()},
           {"load_ms", was_loaded ? 0.0 : host.last_load_ms()}};
    }
    log::info("{} {}: {}", req.method, req.path, host.state_name());
    send_json(res, 200, j);
  } catch (const ApiError& e) {
    send_error(res, e, false);
  }
}

void Server::Impl::handle_generate(const httplib::Request& req, httplib::Response& res, Api api) {
  const bool anthropic = api == Api::kMessages;
  ++http_requests;
  try {
    if (stopping) throw shutting_down();
    auto ar = std::make_shared<ApiRequest>(
        api == Api::kChat         ? parse_chat_completion_request(req.body, *tok, host.n_ctx())
        : api == Api::kCompletion ? parse_completion_request(req.body, *tok, host.n_ctx(), host.bos_id())
                                  : parse_anthropic_request(req.body, *tok, host.n_ctx(), false));
    if (host.state() != LoopHost::State::kLoaded && !opts.auto_unpark)
      throw ApiError(503, "the model is parked; POST /admin/unpark loads it", "server_error", "", "model_parked");
    prepare(*ar);
    if (ar->n > capacity)  // could never be admitted: not a 503 to retry
      throw ApiError(400,
                     fmt::format("'n' = {} is more than this server admits at once ({} sequences: --parallel {} + "
                                 "--queue {})",
                                 ar->n, capacity, opts.engine.max_running, opts.queue),
                     "invalid_request_error", "n");
    std::shared_ptr<Admission> admission = admit(ar->n);
    if (!admission) {
      ++rejected;
      throw ApiError(503,
                     fmt::format("the server is busy ({} sequences running or waiting, the most it admits); retry later",
                                 capacity),
                     "server_error", "", "queue_full");
    }
    log::info("{} {}: {} prompt tokens, max_tokens {}, n {}, stream {}{}", req.method, req.path,
              ar->gen.prompt.size(), ar->gen.max_tokens, ar->n, ar->stream, ar->gen.constraint ? ", constrained" : "");
    if (!ar->stream) {
      ConnectionMonitor mon(req.remote_addr, req.remote_port, req.local_port);
      respond_whole(*ar, mon, res);
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    ++open_streams;  // until the response is written out (ChunkedStream::on_closed), or never started
    auto started = std::make_shared<bool>(false);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, ar, admission, started](size_t, httplib::DataSink&) mutable {
          // called once, the header written: the rest of the response leaves this thread
          std::shared_ptr<ChunkedStream> out = HttpServer::detach_current();
          if (!out || *started) return false;
          *started = true;
          start_stream(std::move(ar), std::move(admission), std::move(out));
          return false;  // httplib lets go of the connection; the transport writes the stream
        },
        [this, started](bool) {
          if (!*started) --open_streams;
        });
  } catch (const ApiError& e) {
    log::info("{} {}: {} {}", req.method, req.path, e.status(), e.what());
    send_error(res, e, anthropic);
  }
}

void Server::Impl::respond_whole(ApiRequest& ar, ConnectionMonitor& mon, httplib::Response& res) {
  auto gone = [&] { return stopping.load() || mon.closed(); };
  LoopHost::Lease lease = lease_for_request();
  std::vector<GenerationOutput> outs;
  for (int i = 0; i < ar.n; ++i)
    outs.emplace_back(ar.chat, ar.thinking, ar.anthropic ? random_tool_id_prefix(ToolIdStyle::anthropic) : "");
  Choices c;
  try {
    c = run_choices(
        lease.loop(), ar,
        [&](int i) {
          GenerationOutput& out = outs[size_t(i)];
          GenerationCallbacks cb;
          cb.on_logprobs = [&out](const TokenLogprobs& lp) { out.push_logprobs(lp); };
          cb.on_token = [&out](int32_t id, std::string_view text) {
            out.push(id, text);
            return true;
          };
          cb.should_cancel = gone;
          return cb;
        },
        nullptr);
  } catch (const Error& e) {
    throw ApiError(500, fmt::format("generation failed: {}", e.what()), "server_error");
  }
  if (any_cancelled(c.results)) {
    if (stopping) send_error(res, shutting_down(), ar.anthropic);
    else log::info("request cancelled after {} tokens: the client went away", c.results[0].ids.size());
    return;  // client gone: nobody to answer
  }
  for (size_t i = 0; i < outs.size(); ++i) outs[i].finish(c.results[i].finish == FinishReason::length);
  if (ar.anthropic) {
    send_json(res, 200, anthropic_message_json("msg_" + random_hex(24), opts.model_name, outs[0], c.results[0]));
    return;
  }
  const int64_t created = std::time(nullptr);
  json choices = json::array();
  int64_t reasoning = 0;
  for (int i = 0; i < ar.n; ++i) {
    const GenerationOutput& out = outs[size_t(i)];
    const GenerationResult& r = c.results[size_t(i)];
    reasoning += out.reasoning_tokens();
    if (ar.chat) {
      choices.push_back(
          {{"index", i},
           {"message", chat_message_json(out)},
           {"logprobs",
            ar.logprobs ? chat_logprobs_json(out.answer_logprobs(), out.reasoning_logprobs(), *tok) : json(nullptr)},
           {"finish_reason", openai_finish_reason(out, r.finish)}});
    } else {
      TextOffsets offsets(*tok);
      choices.push_back(
          {{"index", i},
           {"text", out.text()},
           {"logprobs", ar.logprobs ? completion_logprobs_json(out.answer_logprobs(), *tok, offsets) : json(nullptr)},
           {"finish_reason", openai_finish_reason(out, r.finish)}});
    }
  }
  json body = {{"id", (ar.chat ? "chatcmpl-" : "cmpl-") + random_hex(24)},
               {"object", ar.chat ? "chat.completion" : "text_completion"},
               {"created", created},
               {"model", opts.model_name},
               {"system_fingerprint", "dsv4"},
               {"choices", std::move(choices)},
               {"usage", usage_json(usage_of(c.results), reasoning)},
               {"timings", timings_of(c)}};
  send_json(res, 200, body);
}

void Server::Impl::start_stream(std::shared_ptr<ApiRequest> ar, std::shared_ptr<Admission> admission,
                                std::shared_ptr<ChunkedStream> out) {
  out->on_closed([this] { --open_streams; });
  SseWriter w(std::move(out));
  w.keepalive(opts.keepalive_s);
  if (std::optional<LoopHost::Lease> l = host.try_acquire()) {  // the model is loaded: no wait
    stream_with_lease(std::move(ar), std::move(admission), std::move(w), StreamLease{std::move(l), std::nullopt});
    return;
  }
  // parked, loading or parking: take the lease where waiting holds up nothing else (FIFO)
  pump.wait([this, ar = std::move(ar), admission = std::move(admission), w = std::move(w)](bool pump_stopping) mutable {
    StreamLease l;
    if (pump_stopping || stopping) {
      l.error = shutting_down();
    } else {
      try {
        l.lease.emplace(lease_for_request());
      } catch (const ApiError& e) {
        l.error = e;
      }
    }
    stream_with_lease(std::move(ar), std::move(admission), std::move(w), std::move(l));
  });
}

void Server::Impl::stream_with_lease(std::shared_ptr<ApiRequest> ar, std::shared_ptr<Admission> admission, SseWriter w,
                                     StreamLease lease) {
  if (ar->anthropic) stream_anthropic(std::move(ar), std::move(admission), std::move(w), std::move(lease));
  else stream_openai(std::move(ar), std::move(admission), std::move(w), std::move(lease));
}

namespace {

// The end of a streamed response: the lease and the admission go, then the last chunk (or a closed connection).
template <class State>
void end_stream(State& st, bool ok) {
  st.lease.reset();
  st.admission.reset();
  if (ok) st.w.out().done();
  else st.w.out().abort();
}

std::string error_text(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
  }
  return "unknown error";
}

}  // namespace

void Server::Impl::stream_openai(std::shared_ptr<ApiRequest> arp, std::shared_ptr<Admission> admission, SseWriter w,
                                 StreamLease lease) {
  // Per choice: its parsed output and the completion text offsets of its log-probabilities.
  struct Choice {
    GenerationOutput out;
    TextOffsets offsets;
  };
  struct State {
    std::shared_ptr<ApiRequest> ar;
    std::shared_ptr<Admission> admission;
    SseWriter w;
    std::optional<LoopHost::Lease> lease;
    std::string id;
    int64_t created;
    std::vector<Choice> cs;
    std::vector<std::shared_ptr<TokenConstraint>> constraints;
    std::chrono::steady_clock::time_point t_start;  // choice 0's submission (timings' wall time of n choices)
  };
  auto st = std::make_shared<State>(State{arp, std::move(admission), std::move(w), std::nullopt,
                                          (arp->chat ? "chatcmpl-" : "cmpl-") + random_hex(24), std::time(nullptr), {}, {},
                                          std::chrono::steady_clock::now()});
  const ApiRequest& ar = *st->ar;
  State* S = st.get();
  auto gone = [this, S] { return stopping.load() || !S->w.ok(); };
  auto chunk = [this, S](json choice) {
    json c = chunk_base(S->id, S->created, S->ar->chat);
    c["choices"] = json::array({std::move(choice)});
    if (S->ar->include_usage) c["usage"] = nullptr;
    return c;
  };
  auto send_error_event = [S](const ApiError& e) {
    S->w.data(e.to_json());
    S->w.send_raw("data: [DONE]\n\n");
  };

  std::vector<GenerationRequest> reqs;
  try {
    st->lease.emplace(lease.take());
    reqs = choice_requests(ar, st->constraints);
  } catch (const ApiError& e) {
    send_error_event(e);
    end_stream(*st, st->w.ok());
    return;
  }
  if (ar.chat)
    for (int i = 0; i < ar.n; ++i)
      st->w.data(chunk({{"index", i},
                        {"delta", {{"role", "assistant"}, {"content", ""}}},
                        {"logprobs", nullptr},
                        {"finish_reason", nullptr}}));
  for (int i = 0; i < ar.n; ++i) st->cs.push_back({GenerationOutput(ar.chat, ar.thinking), TextOffsets(*tok)});
  // Log-probabilities waiting for a chunk (those of tokens whose text was held back included).
  auto take_logprobs = [this, S](Choice& c) -> json {
    const ApiRequest& ar = *S->ar;
    if (!ar.logprobs || !c.out.has_pending_logprobs()) return nullptr;
    if (ar.chat) return chat_logprobs_json(c.out.take_answer_logprobs(), c.out.take_reasoning_logprobs(), *tok);
    return completion_logprobs_json(c.out.take_answer_logprobs(), *tok, c.offsets);
  };
  auto send_delta = [S, chunk, take_logprobs](int i, const ChatDelta& d) {
    Choice& c = S->cs[size_t(i)];
    if (!S->ar->chat) {
      if (!d.content.empty())
        S->w.data(
            chunk({{"index", i}, {"text", d.content}, {"logprobs", take_logprobs(c)}, {"finish_reason", nullptr}}));
      return;
    }
    auto one = [&](json delta) {
      S->w.data(chunk(
          {{"index", i}, {"delta", std::move(delta)}, {"logprobs", take_logprobs(c)}, {"finish_reason", nullptr}}));
    };
    if (!d.reasoning.empty()) one({{"reasoning_content", d.reasoning}});
    if (!d.content.empty()) one({{"content", d.content}});
    if (!d.tool_calls.empty()) {
      json tc = json::array();
      for (const auto& t : d.tool_calls) tc.push_back(tool_call_delta_json(t));
      one({{"tool_calls", tc}});
    }
  };

  StreamedChoices::Setup setup;
  setup.loop = &st->lease->loop();
  setup.tok = tok.get();
  setup.reqs = std::move(reqs);
  setup.callbacks = [S, gone, send_delta](int i) {  // called on the pump thread just before choice i is submitted
    if (i == 0) S->t_start = std::chrono::steady_clock::now();
    GenerationCallbacks cb;
    cb.on_logprobs = [S, i](const TokenLogprobs& lp) { S->cs[size_t(i)].out.push_logprobs(lp); };
    cb.on_token = [S, i, gone, send_delta](int32_t tid, std::string_view text) {
      send_delta(i, S->cs[size_t(i)].out.push(tid, text));
      return !gone();
    };
    cb.should_cancel = gone;
    return cb;
  };
  setup.done = [S, chunk, take_logprobs, send_delta](int i, GenerationResult& r) {
    note_forced_close(S->constraints[size_t(i)], r);
    if (r.finish == FinishReason::cancelled) return;
    Choice& c = S->cs[size_t(i)];
    send_delta(i, c.out.finish(r.finish == FinishReason::length));
    if (S->ar->chat)
      S->w.data(chunk({{"index", i},
                       {"delta", json::object()},
                       {"logprobs", take_logprobs(c)},
                       {"finish_reason", openai_finish_reason(c.out, r.finish)}}));
    else
      S->w.data(chunk({{"index", i},
                       {"text", ""},
                       {"logprobs", take_logprobs(c)},
                       {"finish_reason", openai_finish_reason(c.out, r.finish)}}));
  };
  // st is held by this callback, which the task holds: the state lives as long as the generation
  setup.finished = [this, st, send_error_event](std::vector<GenerationResult>& results, std::exception_ptr err) {
    const ApiRequest& ar = *st->ar;
    if (err) {
      const std::string what = error_text(err);
      log::error("generation failed: {}", what);
      send_error_event(ApiError(500, fmt::format("generation failed: {}", what), "server_error"));
      end_stream(*st, st->w.ok());
      return;
    }
    if (any_cancelled(results)) {
      log::info("stream cancelled after {} tokens", results[0].ids.size());
      if (!stopping) {  // the client went away: nothing more to write
        end_stream(*st, false);
        return;
      }
      send_error_event(shutting_down());
      end_stream(*st, st->w.ok());  // end the chunked body properly after [DONE]
      return;
    }
    if (ar.include_usage) {
      int64_t reasoning = 0;
      for (const auto& c : st->cs) reasoning += c.out.reasoning_tokens();
      json u = chunk_base(st->id, st->created, ar.chat);
      u["choices"] = json::array();
      u["usage"] = usage_json(usage_of(results), reasoning);
      const double wall_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - st->t_start).count();
      u["timings"] = timings_of(results, wall_ms);
      st->w.data(u);
    }
    st->w.send_raw("data: [DONE]\n\n");
    end_stream(*st, st->w.ok());
  };
  auto task = std::make_shared<StreamedChoices>(pump, std::move(setup));
  StreamPump::Task* t = task.get();
  st->w.out().on_gone([this, t] { pump.notify(t); });  // the client went away: cancel without waiting for a token
  pump.start(std::move(task));
}

void Server::Impl::stream_anthropic(std::shared_ptr<ApiRequest> arp, std::shared_ptr<Admission> admission,
                                    SseWriter w, StreamLease lease) {
  struct State {
    std::shared_ptr<ApiRequest> ar;
    std::shared_ptr<Admission> admission;
    SseWriter w;
    std::optional<LoopHost::Lease> lease;
    std::optional<AnthropicStream> as;
    GenerationOutput out;
  };
  auto st = std::make_shared<State>(
      State{arp, std::move(admission), std::move(w), std::nullopt, std::nullopt,
            GenerationOutput(true, arp->thinking, random_tool_id_prefix(ToolIdStyle::anthropic))});
  State* S = st.get();
  auto gone = [this, S] { return stopping.load() || !S->w.ok(); };
  auto send_error_event = [S](const ApiError& e) { S->w.event("error", e.to_anthropic_json()); };
  try {
    st->lease.emplace(lease.take());
  } catch (const ApiError& e) {
    send_error_event(e);
    end_stream(*st, st->w.ok());
    return;
  }
  st->as.emplace([S](const std::string& type, const json& data) { S->w.event(type, data); }, "msg_" + random_hex(24),
                 opts.model_name);
  st->as->start(static_cast<int64_t>(st->ar->gen.prompt.size()));

  StreamedChoices::Setup setup;
  setup.loop = &st->lease->loop();
  setup.tok = tok.get();
  setup.reqs = {st->ar->gen};
  setup.callbacks = [S, gone](int) {
    GenerationCallbacks cb;
    cb.on_token = [S, gone](int32_t tid, std::string_view text) {
      S->as->delta(S->out.push(tid, text));
      return !gone();
    };
    cb.should_cancel = gone;
    return cb;
  };
  setup.finished = [this, st, send_error_event](std::vector<GenerationResult>& results, std::exception_ptr err) {
    if (err) {
      const std::string what = error_text(err);
      log::error("generation failed: {}", what);
      send_error_event(ApiError(500, fmt::format("generation failed: {}", what), "server_error"));
      end_stream(*st, st->w.ok());
      return;
    }
    GenerationResult& r = results[0];
    if (r.finish == FinishReason::cancelled) {
      if (!stopping) {
        end_stream(*st, false);
        return;
      }
      send_error_event(shutting_down());
      end_stream(*st, st->w.ok());
      return;
    }
    note_forced_close(st->ar->gen.constraint, r);
    st->as->delta(st->out.finish(r.finish == FinishReason::length));
    st->as->finish(st->out, r);
    end_stream(*st, st->w.ok());
  };
  auto task = std::make_shared<StreamedChoices>(pump, std::move(setup));
  StreamPump::Task* t = task.get();
  st->w.out().on_gone([this, t] { pump.notify(t); });
  pump.start(std::move(task));
}

Server::Server(ServerOptions opts, std::shared_ptr<const BatchModel> model, std::shared_ptr<const Tokenizer> tok) {
  if (!model || !tok) fail("server: no model or tokenizer");
  if (opts.n_ctx < 2) fail("--ctx must be at least 2, got {}", opts.n_ctx);
  if (opts.queue < 0) fail("--queue must be >= 0, got {}", opts.queue);
  if (opts.engine.max_running < 1) fail("--parallel must be >= 1, got {}", opts.engine.max_running);
  if (opts.engine.batch_tokens < 1) fail("--batch-tokens must be >= 1, got {}", opts.engine.batch_tokens);
  if (opts.port < 0 || opts.port > 65535) fail("--port must be in [0, 65535], got {}", opts.port);
  if (opts.model_name.empty()) fail("the model name must not be empty");
  if (opts.reasoning_budget == 0 || opts.reasoning_budget < -1)
    fail("--reasoning-budget must be a positive number of tokens, got {}", opts.reasoning_budget);
  if (opts.n_ctx > model->max_context()) {
    log::warn("--ctx {} exceeds the model's maximum context {}; using {}", opts.n_ctx, model->max_context(),
              model->max_context());
  }
  if (tok->n_vocab() > model->n_vocab())
    fail("tokenizer vocabulary ({}) is larger than the model's ({})", tok->n_vocab(), model->n_vocab());
  impl_ = std::make_unique<Impl>(std::move(opts), std::move(model), std::move(tok));
  impl_->setup_routes();
}

Server::~Server() { stop(); }

int Server::bind() {
  if (impl_->bound) return impl_->port;
  auto& o = impl_->opts;
  std::string why;
  const int p = impl_->http.bind_port(o.host, o.port, why);
  if (p <= 0) fail("cannot listen on {}:{}: {}", o.host, o.port, why);
  impl_->port = p;
  impl_->bound = true;
  return p;
}

std::string url_host(const std::string& host) {
  return host.find(':') != std::string::npos && host.front() != '[' ? "[" + host + "]" : host;
}

void Server::serve() {
  bind();
  log::info("listening on http://{}:{} (model '{}', n_ctx {}, parallel {}, batch tokens {}, queue {}{})",
            url_host(impl_->opts.host), impl_->port, impl_->opts.model_name, impl_->host.n_ctx(),
            impl_->opts.engine.max_running, impl_->opts.engine.batch_tokens, impl_->opts.queue,
            impl_->opts.api_key.empty() ? "" : ", API key required");
  if (!impl_->stopping) impl_->http.listen_after_bind();
}

void Server::stop() {
  if (!impl_) return;
  impl_->stopping = true;
  impl_->pump.wake_all();  // streams waiting for a token see `stopping` now
  // Running streams see `stopping` within one token and end with an error event and [DONE]; give them a moment to
  // finish writing the chunked body before the sockets close, so clients see a complete response.
  for (int i = 0; i < 200 && impl_->open_streams.load() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  impl_->http.stop();
}

int Server::port() const { return impl_->port; }
int64_t Server::n_ctx() const { return impl_->host.n_ctx(); }

}  // namespace dsv4
