// OpenAI- and Anthropic-compatible HTTP server (cpp-httplib) in front of one generation engine.
//
// Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions, POST /v1/messages,
// POST /v1/messages/count_tokens (server/anthropic_api.h), POST /admin/park, POST /admin/unpark.
//   - Requests are validated (server/openai_request.h, server/anthropic_api.h), then wait in a bounded FIFO queue and
//     run one at a time (server/request_queue.h); a full queue answers 503 with Retry-After.
//   - Structured output / constrained tool calls / reasoning budgets: the request's grammar and budget become an
//     OutputConstraint (engine/output_constraint.h) over the tokenizer's vocabulary (built on first use); grammar
//     automata are cached by grammar key (the 8 most recent, each bounded to about 20 MiB), so a repeated schema reuses
//     its computed token masks.
//   - Log-probabilities: server/openai_format.h.
//   - api_key (non-empty): every route but /health needs `Authorization: Bearer KEY` or `x-api-key: KEY`
//     (server/auth.h), else 401 (Anthropic error shape on /v1/messages*, OpenAI shape elsewhere).
//   - /admin/park waits for the requests before it, then releases the engine and the model (server/model_host.h);
//     while parked, generation requests get 503 code model_parked with Retry-After, or with auto_unpark load the
//     model again first; /admin/unpark loads it. /health reports model_state loaded | parked | loading.
//   - Streaming: SSE `data: {chunk}` frames ending with `data: [DONE]`; `: keepalive` comment lines every
//     keepalive_s while the stream waits (queue, long prefill); first chunk delta {role, content:""}, then
//     content / reasoning_content / tool_calls deltas, then a delta {} with finish_reason, then (with
//     stream_options.include_usage) a chunk with choices [] and usage (all other chunks carry usage: null).
//   - usage: prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details.cached_tokens, DeepSeek's
//     prompt_cache_hit_tokens / prompt_cache_miss_tokens, completion_tokens_details.reasoning_tokens.
//   - A client that disconnects cancels its queued or running request within one token.
//   - Errors: {"error": {"message", "type", "param", "code"}} with a 4xx/5xx status; after the headers of a stream
//     have been sent, an error is a `data: {"error": …}` frame followed by `data: [DONE]`.
// The server never touches tensors: text <-> ids through Tokenizer / chat rendering, generation through Engine.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "model/language_model.h"
#include "server/http_options.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: pick a free port (see Server::port())
  int64_t n_ctx = 32768;            // positions per request (prompt + output); clamped to the model's maximum
  int queue = 16;                   // requests that may wait behind the running one
  std::string model_name = "dsv4";  // id reported by /v1/models and in responses
  double keepalive_s = 5.0;         // SSE keepalive comment interval
  int64_t prefill_chunk = 512;      // engine prefill chunk grid
  size_t max_body_bytes = 32u << 20;
  std::string api_key;            // non-empty: required on every route but /health
  int64_t reasoning_budget = -1;  // default cap on reasoning tokens for thinking requests without their own (> 0)
  bool auto_unpark = false;       // a request to a parked server reloads the model instead of getting 503
  int park_retry_after_s = 5;     // Retry-After of model_parked answers
  // Loads the model again after /admin/park (same folder and options); empty: parking is refused (409).
  std::function<std::shared_ptr<const LanguageModel>()> reload;
  // Connections (server/http_transport.h): timeouts, connection limit, request threads (0: queue + 16).
  HttpTransportOptions http;
};

class Server {
 public:
  // The model and tokenizer must describe the same vocabulary. Throws dsv4::Error on bad options.
  Server(ServerOptions opts, std::shared_ptr<const LanguageModel> model, std::shared_ptr<const Tokenizer> tok);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns the port. Throws dsv4::Error if it cannot bind.
  int bind();
  // Serves until stop() (binds first if needed). Returns after in-flight requests were cancelled and answered.
  void serve();
  // Thread-safe: cancels running / queued requests and makes serve() return.
  void stop();
  int port() const;
  int64_t n_ctx() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4
