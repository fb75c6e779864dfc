#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "engine/constraint_vocab.h"
#include "engine/engine.h"
#include "engine/output_constraint.h"
#include "server/anthropic_api.h"
#include "server/api_error.h"
#include "server/auth.h"
#include "server/connection_monitor.h"
#include "server/generation_output.h"
#include "server/http_transport.h"
#include "server/model_host.h"
#include "server/openai_format.h"
#include "server/openai_request.h"
#include "server/request_queue.h"
#include "server/sse_writer.h"

namespace dsv4 {

namespace {

using json = nlohmann::ordered_json;

enum class Api { kChat, kCompletion, kMessages };

constexpr size_t kMaxCachedAutomata = 8;

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
  ModelHost host;
  RequestQueue queue;
  HttpServer http;                   // cpp-httplib over a reactor (server/http_transport.h)
  std::atomic<bool> stopping{false};
  std::atomic<int> open_streams{0};  // SSE responses not yet completely written (see stop())
  std::atomic<bool> bound{false};
  int port = -1;

  std::once_flag vocab_once;
  std::shared_ptr<const ConstraintVocab> vocab;
  std::mutex automata_mu;
  std::list<std::pair<std::string, std::shared_ptr<GrammarAutomaton>>> automata;  // most recently used first

  Impl(ServerOptions o, std::shared_ptr<const LanguageModel> m, std::shared_ptr<const Tokenizer> t)
      : opts(std::move(o)),
        tok(std::move(t)),
        host(std::move(m), opts.reload, opts.n_ctx, opts.prefill_chunk),
        queue(opts.queue) {}

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

  // Server defaults and the token constraint of a parsed request.
  void prepare(ApiRequest& ar) {
    if (ar.chat && ar.thinking && ar.reasoning_budget < 0 && opts.reasoning_budget > 0)
      ar.reasoning_budget = opts.reasoning_budget;
    const bool budget = ar.chat && ar.thinking && ar.reasoning_budget >= 0;
    if (!ar.grammar && !budget) return;
    OutputConstraintOptions o;
    o.thinking = ar.thinking;
    o.reasoning_budget = budget ? ar.reasoning_budget : -1;
    o.max_tokens = ar.gen.max_tokens;
    if (ar.grammar) o.grammar = automaton(ar);
    try {
      ar.gen.constraint = std::make_shared<OutputConstraint>(constraint_vocab(), std::move(o));
    } catch (const Error& e) {
      throw ApiError(500, fmt::format("constrained decoding is not available: {}", e.what()), "server_error");
    }
  }

  // A structured answer that the constraint closed early to fit max_tokens ended because of the length limit.
  static void note_forced_close(const ApiRequest& ar, GenerationResult& r) {
    auto c = std::dynamic_pointer_cast<OutputConstraint>(ar.gen.constraint);
    if (c && c->forced_close() && r.finish == FinishReason::stop) r.finish = FinishReason::length;
  }

  // Under a running ticket: the engine, loading the model again first when parked with auto_unpark.
  Engine& engine_for_request() {
    if (host.state() != ModelHost::State::kLoaded) {
      if (!opts.auto_unpark)
        throw ApiError(503, "the model is parked; POST /admin/unpark loads it", "server_error", "", "model_parked");
      try {
        host.unpark();
      } catch (const Error& e) {
        throw ApiError(500, fmt::format("loading the model failed: {}", e.what()), "server_error");
      }
    }
    return host.engine();
  }

  void setup_routes();
  void handle_generate(const httplib::Request& req, httplib::Response& res, Api api);
  void handle_admin(const httplib::Request& req, httplib::Response& res, bool park);
  void respond_whole(ApiRequest& ar, RequestQueue::Ticket& ticket, ConnectionMonitor& mon, httplib::Response& res);
  bool stream_openai(ApiRequest& ar, RequestQueue::Ticket& ticket, ConnectionMonitor& mon, httplib::DataSink& sink);
  bool stream_anthropic(ApiRequest& ar, RequestQueue::Ticket& ticket, ConnectionMonitor& mon, httplib::DataSink& sink);
};

void Server::Impl::setup_routes() {
  HttpTransportOptions transport = opts.http;
  if (transport.workers <= 0) transport.workers = opts.queue + 16;  // every queued request streams keepalives
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
    std::string msg = res.status == 404   ? fmt::format("no route for {} {}", req.method, req.path)
                      : res.status == 413 ? std::string("request body too large")
                                          : fmt::format("HTTP error {}", res.status);
    ApiError e(res.status, msg, res.status >= 500 ? "server_error" : "invalid_request_error");
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

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    json j = {{"status", stopping ? "shutting_down" : "ok"},
              {"model", opts.model_name},
              {"model_state", host.state_name()},
              {"n_ctx", host.n_ctx()},
              {"busy", queue.busy()},
              {"waiting", queue.waiting()},
              {"queue", queue.max_waiting()}};
    send_json(res, stopping ? 503 : 200, j);
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", opts.model_name},
              {"object", "model"},
              {"created", 0},
              {"owned_by", "dsv4"},
              {"max_model_len", host.n_ctx()}};
    send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
  });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { handle_generate(req, res, Api::kChat); });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, res, Api::kCompletion);
  });
  http.Post("/v1/messages",
            [this](const httplib::Request& req, httplib::Response& res) { handle_generate(req, res, Api::kMessages); });
  http.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      const ApiRequest ar = parse_anthropic_request(req.body, *tok, host.n_ctx(), /*count_only=*/true);
      send_json(res, 200, {{"input_tokens", static_cast<int64_t>(ar.gen.prompt.size())}});
    } catch (const ApiError& e) {
      send_error(res, e, true);
    }
  });
  http.Post("/admin/park",
            [this](const httplib::Request& req, httplib::Response& res) { handle_admin(req, res, true); });
  http.Post("/admin/unpark",
            [this](const httplib::Request& req, httplib::Response& res) { handle_admin(req, res, false); });
}

void Server::Impl::handle_admin(const httplib::Request& req, httplib::Response& res, bool park) {
  try {
    if (stopping) throw shutting_down();
    if (park && !host.can_park())
      throw ApiError(409, "this server cannot park its model (no loader)", "invalid_request_error", "",
                     "park_unsupported");
    auto ticket = queue.enter();  // after the requests already waiting
    if (!ticket->wait([this] { return stopping.load(); })) throw shutting_down();
    json j;
    if (park) {
      host.park();
      j = {{"status", "parked"}, {"model_state", host.state_name()}};
    } else {
      const bool was_loaded = host.state() == ModelHost::State::kLoaded;
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
  try {
    if (stopping) throw shutting_down();
    auto ar = std::make_shared<ApiRequest>(
        api == Api::kChat         ? parse_chat_completion_request(req.body, *tok, host.n_ctx())
        : api == Api::kCompletion ? parse_completion_request(req.body, *tok, host.n_ctx(), host.bos_id())
                                  : parse_anthropic_request(req.body, *tok, host.n_ctx(), false));
    if (host.state() != ModelHost::State::kLoaded && !opts.auto_unpark)
      throw ApiError(503, "the model is parked; POST /admin/unpark loads it", "server_error", "", "model_parked");
    prepare(*ar);
    std::shared_ptr<RequestQueue::Ticket> ticket = queue.try_enter();
    if (!ticket)
      throw ApiError(503, fmt::format("the server is busy ({} requests waiting); retry later", queue.max_waiting()),
                     "server_error", "", "queue_full");
    auto mon = std::make_shared<ConnectionMonitor>(req.remote_addr, req.remote_port, req.local_port);
    log::info("{} {}: {} prompt tokens, max_tokens {}, stream {}{}", req.method, req.path, ar->gen.prompt.size(),
              ar->gen.max_tokens, ar->stream, ar->gen.constraint ? ", constrained" : "");
    if (!ar->stream) {
      respond_whole(*ar, *ticket, *mon, res);
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    ++open_streams;
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, ar, ticket, mon](size_t, httplib::DataSink& sink) {
          bool ok =
              ar->anthropic ? stream_anthropic(*ar, *ticket, *mon, sink) : stream_openai(*ar, *ticket, *mon, sink);
          if (ok) sink.done();
          return ok;
        },
        [this](bool) { --open_streams; });  // called once the response has been written out (or abandoned)
  } catch (const ApiError& e) {
    log::info("{} {}: {} {}", req.method, req.path, e.status(), e.what());
    send_error(res, e, anthropic);
  }
}

void Server::Impl::respond_whole(ApiRequest& ar, RequestQueue::Ticket& ticket, ConnectionMonitor& mon,
                                 httplib::Response& res) {
  auto gone = [&] { return stopping.load() || mon.closed(); };
  if (!ticket.wait(gone)) {
    if (stopping) send_error(res, shutting_down(), ar.anthropic);
    return;  // client gone: nobody to answer
  }
  Engine& engine = engine_for_request();
  GenerationOutput out(ar.chat, ar.thinking);
  GenerationCallbacks cb;
  cb.on_logprobs = [&](const TokenLogprobs& lp) { out.push_logprobs(lp); };
  cb.on_token = [&](int32_t id, std::string_view text) {
    out.push(id, text);
    return true;
  };
  cb.should_cancel = gone;
  GenerationResult r;
  try {
    r = engine.generate(ar.gen, tok.get(), cb);
  } catch (const Error& e) {
    throw ApiError(500, fmt::format("generation failed: {}", e.what()), "server_error");
  }
  if (r.finish == FinishReason::cancelled) {
    if (stopping) send_error(res, shutting_down(), ar.anthropic);
    return;
  }
  note_forced_close(ar, r);
  out.finish();
  if (ar.anthropic) {
    send_json(res, 200, anthropic_message_json("msg_" + random_hex(24), opts.model_name, out, r));
    return;
  }
  const int64_t created = std::time(nullptr);
  json choice;
  if (ar.chat) {
    choice = {{"index", 0},
              {"message", chat_message_json(out)},
              {"logprobs",
               ar.logprobs ? chat_logprobs_json(out.answer_logprobs(), out.reasoning_logprobs(), *tok) : json(nullptr)},
              {"finish_reason", openai_finish_reason(out, r.finish)}};
  } else {
    int64_t offset = 0;
    choice = {{"index", 0},
              {"text", out.text()},
              {"logprobs", ar.logprobs ? completion_logprobs_json(out.answer_logprobs(), *tok, offset) : json(nullptr)},
              {"finish_reason", openai_finish_reason(out, r.finish)}};
  }
  json body = {{"id", (ar.chat ? "chatcmpl-" : "cmpl-") + random_hex(24)},
               {"object", ar.chat ? "chat.completion" : "text_completion"},
               {"created", created},
               {"model", opts.model_name},
               {"system_fingerprint", "dsv4"},
               {"choices", json::array({choice})},
               {"usage", usage_json(r, out.reasoning_tokens())},
               {"timings", timings_json(r.timings)}};
  send_json(res, 200, body);
}

bool Server::Impl::stream_openai(ApiRequest& ar, RequestQueue::Ticket& ticket, ConnectionMonitor& mon,
                                 httplib::DataSink& sink) {
  SseWriter w(sink);
  Keepalive ka(w, opts.keepalive_s);
  const std::string id = (ar.chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
  const int64_t created = std::time(nullptr);
  auto gone = [&] { return stopping.load() || !w.ok() || mon.closed(); };
  auto chunk = [&](json choice) {
    json c = chunk_base(id, created, ar.chat);
    c["choices"] = json::array({std::move(choice)});
    if (ar.include_usage) c["usage"] = nullptr;
    return c;
  };
  auto send_error_event = [&](const ApiError& e) {
    w.data(e.to_json());
    w.send_raw("data: [DONE]\n\n");
  };

  if (!ticket.wait(gone)) {
    if (stopping) send_error_event(shutting_down());
    return w.ok() && stopping;
  }
  Engine* engine = nullptr;
  try {
    engine = &engine_for_request();
  } catch (const ApiError& e) {
    send_error_event(e);
    return w.ok();
  }
  if (ar.chat)
    w.data(chunk({{"index", 0},
                  {"delta", {{"role", "assistant"}, {"content", ""}}},
                  {"logprobs", nullptr},
                  {"finish_reason", nullptr}}));

  GenerationOutput out(ar.chat, ar.thinking);
  int64_t text_offset = 0;
  // Log-probabilities waiting for a chunk (those of tokens whose text was held back included).
  auto take_logprobs = [&]() -> json {
    if (!ar.logprobs || !out.has_pending_logprobs()) return nullptr;
    if (ar.chat) return chat_logprobs_json(out.take_answer_logprobs(), out.take_reasoning_logprobs(), *tok);
    return completion_logprobs_json(out.take_answer_logprobs(), *tok, text_offset);
  };
  auto send_delta = [&](const ChatDelta& d) {
    if (!ar.chat) {
      if (!d.content.empty())
        w.data(chunk({{"index", 0}, {"text", d.content}, {"logprobs", take_logprobs()}, {"finish_reason", nullptr}}));
      return;
    }
    auto one = [&](json delta) {
      w.data(chunk(
          {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", take_logprobs()}, {"finish_reason", nullptr}}));
    };
    if (!d.reasoning.empty()) one({{"reasoning_content", d.reasoning}});
    if (!d.content.empty()) one({{"content", d.content}});
    if (!d.tool_calls.empty()) {
      json tc = json::array();
      for (const auto& t : d.tool_calls) tc.push_back(tool_call_delta_json(t));
      one({{"tool_calls", tc}});
    }
  };
  GenerationCallbacks cb;
  cb.on_logprobs = [&](const TokenLogprobs& lp) { out.push_logprobs(lp); };
  cb.on_token = [&](int32_t tid, std::string_view text) {
    send_delta(out.push(tid, text));
    return !gone();
  };
  cb.should_cancel = gone;
  GenerationResult r;
  try {
    r = engine->generate(ar.gen, tok.get(), cb);
  } catch (const Error& e) {
    log::error("generation failed: {}", e.what());
    send_error_event(ApiError(500, fmt::format("generation failed: {}", e.what()), "server_error"));
    return w.ok();
  }
  if (r.finish == FinishReason::cancelled) {
    log::info("stream cancelled after {} tokens", r.ids.size());
    if (!stopping) return false;  // the client went away: nothing more to write
    send_error_event(shutting_down());
    return w.ok();  // end the chunked body properly after [DONE]
  }
  note_forced_close(ar, r);
  send_delta(out.finish());
  if (ar.chat)
    w.data(chunk({{"index", 0},
                  {"delta", json::object()},
                  {"logprobs", take_logprobs()},
                  {"finish_reason", openai_finish_reason(out, r.finish)}}));
  else
    w.data(chunk({{"index", 0},
                  {"text", ""},
                  {"logprobs", take_logprobs()},
                  {"finish_reason", openai_finish_reason(out, r.finish)}}));
  if (ar.include_usage) {
    json u = chunk_base(id, created, ar.chat);
    u["choices"] = json::array();
    u["usage"] = usage_json(r, out.reasoning_tokens());
    u["timings"] = timings_json(r.timings);
    w.data(u);
  }
  w.send_raw("data: [DONE]\n\n");
  return w.ok();
}

bool Server::Impl::stream_anthropic(ApiRequest& ar, RequestQueue::Ticket& ticket, ConnectionMonitor& mon,
                                    httplib::DataSink& sink) {
  SseWriter w(sink);
  Keepalive ka(w, opts.keepalive_s);
  auto gone = [&] { return stopping.load() || !w.ok() || mon.closed(); };
  auto send_error_event = [&](const ApiError& e) { w.event("error", e.to_anthropic_json()); };
  if (!ticket.wait(gone)) {
    if (stopping) send_error_event(shutting_down());
    return w.ok() && stopping;
  }
  Engine* engine = nullptr;
  try {
    engine = &engine_for_request();
  } catch (const ApiError& e) {
    send_error_event(e);
    return w.ok();
  }
  AnthropicStream as([&](const std::string& type, const json& data) { w.event(type, data); }, "msg_" + random_hex(24),
                     opts.model_name);
  as.start(static_cast<int64_t>(ar.gen.prompt.size()));
  GenerationOutput out(true, ar.thinking);
  GenerationCallbacks cb;
  cb.on_token = [&](int32_t tid, std::string_view text) {
    as.delta(out.push(tid, text));
    return !gone();
  };
  cb.should_cancel = gone;
  GenerationResult r;
  try {
    r = engine->generate(ar.gen, tok.get(), cb);
  } catch (const Error& e) {
    log::error("generation failed: {}", e.what());
    send_error_event(ApiError(500, fmt::format("generation failed: {}", e.what()), "server_error"));
    return w.ok();
  }
  if (r.finish == FinishReason::cancelled) {
    if (!stopping) return false;
    send_error_event(shutting_down());
    return w.ok();
  }
  note_forced_close(ar, r);
  as.delta(out.finish());
  as.finish(out, r);
  return w.ok();
}

Server::Server(ServerOptions opts, std::shared_ptr<const LanguageModel> model, std::shared_ptr<const Tokenizer> tok) {
  if (!model || !tok) fail("server: no model or tokenizer");
  if (opts.n_ctx < 2) fail("--ctx must be at least 2, got {}", opts.n_ctx);
  if (opts.queue < 0) fail("--queue must be >= 0, got {}", opts.queue);
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

void Server::serve() {
  bind();
  log::info("listening on http://{}:{} (model '{}', n_ctx {}, queue {}{})", impl_->opts.host, impl_->port,
            impl_->opts.model_name, impl_->host.n_ctx(), impl_->opts.queue,
            impl_->opts.api_key.empty() ? "" : ", API key required");
  if (!impl_->stopping) impl_->http.listen_after_bind();
}

void Server::stop() {
  if (!impl_) return;
  impl_->stopping = true;
  // Running streams see `stopping` within one token and end with an error event and [DONE]; give them a moment to
  // finish writing the chunked body before the sockets close, so clients see a complete response.
  for (int i = 0; i < 200 && impl_->open_streams.load() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  impl_->http.stop();
}

int Server::port() const { return impl_->port; }
int64_t Server::n_ctx() const { return impl_->host.n_ctx(); }

}  // namespace dsv4
