#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "chat/output_parser.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"
#include "server/api_error.h"
#include "server/connection_monitor.h"
#include "server/openai_request.h"
#include "server/request_queue.h"

namespace dsv4 {

namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

std::string random_hex(int n) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lk(mu);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < n; ++i) s += hex[rng() & 15];
  return s;
}

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status() == 503) res.set_header("Retry-After", "1");
  send_json(res, e.status(), e.to_json());
}

json usage_json(const GenerationResult& r, int64_t reasoning_tokens) {
  const auto& t = r.timings;
  int64_t completion = static_cast<int64_t>(r.ids.size());
  return {{"prompt_tokens", t.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", t.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", t.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
          {"prompt_cache_hit_tokens", t.cached_tokens},
          {"prompt_cache_miss_tokens", t.prompt_tokens - t.cached_tokens}};
}

json timings_json(const GenerationTimings& t) {
  return {{"prompt_n", t.prefill_tokens},
          {"cache_n", t.cached_tokens},
          {"prompt_ms", t.prefill_ms},
          {"prompt_per_second", t.prefill_tokens_per_s()},
          {"predicted_n", t.decode_tokens},
          {"predicted_ms", t.decode_ms},
          {"predicted_per_second", t.decode_tokens_per_s()}};
}

json tool_call_json(const ToolCallDelta& d) {
  return {{"index", d.index},
          {"id", d.id},
          {"type", "function"},
          {"function", {{"name", d.name}, {"arguments", d.arguments}}}};
}

// Thread-safe SSE writer; remembers a failed write (client gone).
class SseWriter {
 public:
  explicit SseWriter(httplib::DataSink& sink) : sink_(sink) {}
  bool send_raw(const std::string& s) {
    std::lock_guard lk(mu_);
    if (!ok_) return false;
    ok_ = sink_.write(s.data(), s.size());
    last_ = Clock::now();
    return ok_;
  }
  bool data(const json& j) {
    return send_raw("data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n");
  }
  bool ok() {
    std::lock_guard lk(mu_);
    return ok_;
  }
  // A keepalive comment if nothing was written for `interval`.
  void keepalive_if_idle(std::chrono::duration<double> interval) {
    std::lock_guard lk(mu_);
    if (!ok_ || Clock::now() - last_ < interval) return;
    static const std::string ka = ": keepalive\n\n";
    ok_ = sink_.write(ka.data(), ka.size());
    last_ = Clock::now();
  }

 private:
  httplib::DataSink& sink_;
  std::mutex mu_;
  bool ok_ = true;
  Clock::time_point last_ = Clock::now();
};

// Runs keepalive_if_idle on a background thread for its lifetime.
class Keepalive {
 public:
  Keepalive(SseWriter& w, double interval_s) : w_(w), interval_(interval_s) {
    th_ = std::thread([this] {
      std::unique_lock lk(mu_);
      auto step = std::chrono::duration<double>(std::max(0.01, interval_.count() / 4));
      while (!stop_) {
        cv_.wait_for(lk, step);
        if (stop_) break;
        lk.unlock();
        w_.keepalive_if_idle(interval_);
        lk.lock();
      }
    });
  }
  ~Keepalive() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    th_.join();
  }

 private:
  SseWriter& w_;
  std::chrono::duration<double> interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread th_;
};

// Turns engine output into OpenAI choice fields (chat: reasoning / content / tool calls; completion: text).
struct OutputState {
  OutputState(bool chat, bool thinking) : chat(chat), thinking(thinking), parser(thinking) {}
  bool chat, thinking;
  OutputParser parser;
  std::string text;  // completions
  int64_t reasoning_tokens = 0;

  // Deltas produced by one piece of text (chat) or the text itself (completion).
  ChatDelta push(std::string_view piece, bool is_token) {
    ChatDelta d;
    if (!chat) {
      d.content = std::string(piece);
      text += piece;
      return d;
    }
    d = parser.push(piece);
    if (is_token && thinking && parser.content().empty() && parser.tool_calls().empty()) ++reasoning_tokens;
    return d;
  }
  ChatDelta finish() { return chat ? parser.finish() : ChatDelta{}; }

  const char* finish_reason(FinishReason f) const {
    if (f == FinishReason::length) return "length";
    if (chat && !parser.tool_calls().empty()) return "tool_calls";
    return "stop";
  }
};

}  // namespace

struct Server::Impl {
  ServerOptions opts;
  std::shared_ptr<const LanguageModel> model;
  std::shared_ptr<const Tokenizer> tok;
  Engine engine;
  RequestQueue queue;
  httplib::Server http;
  std::atomic<bool> stopping{false};
  std::atomic<int> open_streams{0};  // SSE responses not yet completely written (see stop())
  std::atomic<bool> bound{false};
  int port = -1;

  Impl(ServerOptions o, std::shared_ptr<const LanguageModel> m, std::shared_ptr<const Tokenizer> t)
      : opts(std::move(o)),
        model(std::move(m)),
        tok(std::move(t)),
        engine(model, std::min(opts.n_ctx, model->max_context()), opts.prefill_chunk),
        queue(opts.queue) {}

  json chunk_base(const std::string& id, int64_t created, bool chat) const {
    return {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", opts.model_name},
            {"system_fingerprint", "dsv4"}};
  }

  void setup_routes();
  void handle_generate(const httplib::Request& req, httplib::Response& res, bool chat);
  void respond_whole(ApiRequest& ar, RequestQueue::Ticket& ticket, ConnectionMonitor& mon, httplib::Response& res);
  bool stream(ApiRequest& ar, RequestQueue::Ticket& ticket, ConnectionMonitor& mon, httplib::DataSink& sink);
};

void Server::Impl::setup_routes() {
  const int threads = opts.queue + 16;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(opts.max_body_bytes);
  http.set_keep_alive_timeout(2);
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg = res.status == 404   ? fmt::format("no route for {} {}", req.method, req.path)
                      : res.status == 413 ? std::string("request body too large")
                                          : fmt::format("HTTP error {}", res.status);
    ApiError e(res.status, msg, res.status >= 500 ? "server_error" : "invalid_request_error");
    res.set_content(e.to_json().dump(), "application/json");
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, msg, "server_error"));
  });

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    json j = {{"status", stopping ? "shutting_down" : "ok"},
              {"model", opts.model_name},
              {"n_ctx", engine.n_ctx()},
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
              {"max_model_len", engine.n_ctx()}};
    send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
  });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { handle_generate(req, res, true); });
  http.Post("/v1/completions",
            [this](const httplib::Request& req, httplib::Response& res) { handle_generate(req, res, false); });
}

void Server::Impl::handle_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  try {
    if (stopping) throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
    auto ar =
        std::make_shared<ApiRequest>(chat ? parse_chat_completion_request(req.body, *tok, engine.n_ctx())
                                          : parse_completion_request(req.body, *tok, engine.n_ctx(), model->bos_id()));
    std::shared_ptr<RequestQueue::Ticket> ticket = queue.try_enter();
    if (!ticket)
      throw ApiError(503, fmt::format("the server is busy ({} requests waiting); retry later", queue.max_waiting()),
                     "server_error", "", "queue_full");
    auto mon = std::make_shared<ConnectionMonitor>(req.remote_addr, req.remote_port, req.local_port);
    log::info("{} {}: {} prompt tokens, max_tokens {}, stream {}", req.method, req.path, ar->gen.prompt.size(),
              ar->gen.max_tokens, ar->stream);
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
          bool ok = stream(*ar, *ticket, *mon, sink);
          if (ok) sink.done();
          return ok;
        },
        [this](bool) { --open_streams; });  // called once the response has been written out (or abandoned)
  } catch (const ApiError& e) {
    log::info("{} {}: {} {}", req.method, req.path, e.status(), e.what());
    send_error(res, e);
  }
}

void Server::Impl::respond_whole(ApiRequest& ar, RequestQueue::Ticket& ticket, ConnectionMonitor& mon,
                                 httplib::Response& res) {
  auto gone = [&] { return stopping.load() || mon.closed(); };
  if (!ticket.wait(gone)) {
    if (stopping) send_error(res, ApiError(503, "the server is shutting down", "server_error", "", "shutting_down"));
    return;  // client gone: nobody to answer
  }
  OutputState out(ar.chat, ar.thinking);
  GenerationCallbacks cb;
  cb.on_token = [&](int32_t id, std::string_view text) {
    out.push(text, id >= 0);
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
    if (stopping) send_error(res, ApiError(503, "the server is shutting down", "server_error", "", "shutting_down"));
    return;
  }
  out.finish();
  const int64_t created = std::time(nullptr);
  json choice;
  if (ar.chat) {
    json msg = {{"role", "assistant"}};
    const auto& calls = out.parser.tool_calls();
    std::string content = out.parser.content();
    msg["content"] = content.empty() && !calls.empty() ? json(nullptr) : json(content);
    if (ar.thinking) msg["reasoning_content"] = out.parser.reasoning();
    if (!calls.empty()) {
      json tc = json::array();
      for (const auto& c : calls)
        tc.push_back(
            {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      msg["tool_calls"] = tc;
    }
    msg["refusal"] = nullptr;
    choice = {{"index", 0}, {"message", msg}, {"logprobs", nullptr}, {"finish_reason", out.finish_reason(r.finish)}};
  } else {
    choice = {{"index", 0}, {"text", out.text}, {"logprobs", nullptr}, {"finish_reason", out.finish_reason(r.finish)}};
  }
  json body = {{"id", (ar.chat ? "chatcmpl-" : "cmpl-") + random_hex(24)},
               {"object", ar.chat ? "chat.completion" : "text_completion"},
               {"created", created},
               {"model", opts.model_name},
               {"system_fingerprint", "dsv4"},
               {"choices", json::array({choice})},
               {"usage", usage_json(r, out.reasoning_tokens)},
               {"timings", timings_json(r.timings)}};
  send_json(res, 200, body);
}

bool Server::Impl::stream(ApiRequest& ar, RequestQueue::Ticket& ticket, ConnectionMonitor& mon,
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
    if (stopping) send_error_event(ApiError(503, "the server is shutting down", "server_error", "", "shutting_down"));
    return w.ok() && stopping;
  }
  if (ar.chat)
    w.data(chunk({{"index", 0},
                  {"delta", {{"role", "assistant"}, {"content", ""}}},
                  {"logprobs", nullptr},
                  {"finish_reason", nullptr}}));

  OutputState out(ar.chat, ar.thinking);
  auto send_delta = [&](const ChatDelta& d) {
    if (!ar.chat) {
      if (!d.content.empty())
        w.data(chunk({{"index", 0}, {"text", d.content}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
      return;
    }
    auto one = [&](json delta) {
      w.data(chunk({{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
    };
    if (!d.reasoning.empty()) one({{"reasoning_content", d.reasoning}});
    if (!d.content.empty()) one({{"content", d.content}});
    if (!d.tool_calls.empty()) {
      json tc = json::array();
      for (const auto& t : d.tool_calls) tc.push_back(tool_call_json(t));
      one({{"tool_calls", tc}});
    }
  };
  GenerationCallbacks cb;
  cb.on_token = [&](int32_t tid, std::string_view text) {
    send_delta(out.push(text, tid >= 0));
    return !gone();
  };
  cb.should_cancel = gone;
  GenerationResult r;
  try {
    r = engine.generate(ar.gen, tok.get(), cb);
  } catch (const Error& e) {
    log::error("generation failed: {}", e.what());
    send_error_event(ApiError(500, fmt::format("generation failed: {}", e.what()), "server_error"));
    return w.ok();
  }
  if (r.finish == FinishReason::cancelled) {
    log::info("stream cancelled after {} tokens", r.ids.size());
    if (!stopping) return false;  // the client went away: nothing more to write
    send_error_event(ApiError(503, "the server is shutting down", "server_error", "", "shutting_down"));
    return w.ok();  // end the chunked body properly after [DONE]
  }
  send_delta(out.finish());
  if (ar.chat)
    w.data(chunk({{"index", 0},
                  {"delta", json::object()},
                  {"logprobs", nullptr},
                  {"finish_reason", out.finish_reason(r.finish)}}));
  else
    w.data(chunk({{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", out.finish_reason(r.finish)}}));
  if (ar.include_usage) {
    json u = chunk_base(id, created, ar.chat);
    u["choices"] = json::array();
    u["usage"] = usage_json(r, out.reasoning_tokens);
    u["timings"] = timings_json(r.timings);
    w.data(u);
  }
  w.send_raw("data: [DONE]\n\n");
  return w.ok();
}

Server::Server(ServerOptions opts, std::shared_ptr<const LanguageModel> model, std::shared_ptr<const Tokenizer> tok) {
  if (!model || !tok) fail("server: no model or tokenizer");
  if (opts.n_ctx < 2) fail("--ctx must be at least 2, got {}", opts.n_ctx);
  if (opts.queue < 0) fail("--queue must be >= 0, got {}", opts.queue);
  if (opts.port < 0 || opts.port > 65535) fail("--port must be in [0, 65535], got {}", opts.port);
  if (opts.model_name.empty()) fail("the model name must not be empty");
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
  int p = o.port == 0 ? impl_->http.bind_to_any_port(o.host) : (impl_->http.bind_to_port(o.host, o.port) ? o.port : -1);
  if (p <= 0) fail("cannot listen on {}:{} (address in use or not available)", o.host, o.port);
  impl_->port = p;
  impl_->bound = true;
  return p;
}

void Server::serve() {
  bind();
  log::info("listening on http://{}:{} (model '{}', n_ctx {}, queue {})", impl_->opts.host, impl_->port,
            impl_->opts.model_name, impl_->engine.n_ctx(), impl_->opts.queue);
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
int64_t Server::n_ctx() const { return impl_->engine.n_ctx(); }

}  // namespace dsv4
