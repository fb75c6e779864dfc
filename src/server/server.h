// OpenAI- and Anthropic-compatible HTTP server (cpp-httplib) in front of one engine loop (engine/engine_loop.h).
//
// Endpoints: GET /health, GET /metrics, GET /v1/models, POST /v1/chat/completions, POST /v1/completions,
// POST /v1/messages, POST /v1/messages/count_tokens (server/anthropic_api.h), POST /admin/park, POST /admin/unpark.
//   - Continuous batching: every request is a sequence of one EngineLoop, so the requests in flight share each
//     forward step (up to engine.max_running sequences, engine.batch_tokens tokens per step) and any prompt prefix
//     of whole 128-token blocks the loop has seen; a request's tokens are those of the same request run alone.
//     Requests are validated (server/openai_request.h, server/anthropic_api.h); the text layer (stop strings,
//     decoding) runs on the request's HTTP thread (engine/loop_generation.h) for a whole response, and for a streamed
//     one on a few StreamPump threads shared by every stream (server/stream_pump.h), its connection detached from
//     the request thread (server/http_transport.h): open streams take no thread each. At most engine.max_running + queue
//     sequences are admitted at once (a request of n choices counts n); beyond that the answer is 503 with
//     Retry-After and error code queue_full.
//   - Structured output / constrained tool calls / reasoning budgets: the request's grammar and budget become an
//     OutputConstraint (engine/output_constraint.h) over the tokenizer's vocabulary (built on first use), applied
//     to the request's logits on the loop thread; grammar automata are cached by grammar key (the 8 most recent, each
//     bounded to about 20 MiB), so a repeated schema reuses its computed token masks.
//   - n > 1 (OpenAI): n sequences of the same prompt; choice 0 is submitted first and the others once its prompt
//     has been computed, so they reuse its cached blocks. Seeds: choice i samples with seed + i (mod 2^64), where
//     seed is the request's seed or, without one, a random seed drawn for the request. usage counts the prompt once
//     (prompt_tokens, cached_tokens: those of choice 0) and completion_tokens over all choices.
//   - Log-probabilities: server/openai_format.h.
//   - api_key (non-empty): every route but /health needs `Authorization: Bearer KEY` or `x-api-key: KEY`
//     (server/auth.h), else 401 (Anthropic error shape on /v1/messages*, OpenAI shape elsewhere).
//   - /admin/park waits for the requests in flight, then releases the loop and the model (server/loop_host.h);
//     while parked, generation requests get 503 code model_parked with Retry-After, or with auto_unpark load the
//     model again first; /admin/unpark loads it. /health reports model_state loaded | parked | loading.
//   - /metrics: Prometheus text format (server/metrics.h): requests running / waiting, tokens, prefix-cache hits,
//     state-pool use, step time.
//   - Streaming: SSE `data: {chunk}` frames ending with `data: [DONE]`; `: keepalive` comment lines every
//     keepalive_s while the stream waits (queue, long prefill); first chunk delta {role, content:""}, then
//     content / reasoning_content / tool_calls deltas, then a delta {} with finish_reason, then (with
//     stream_options.include_usage) a chunk with choices [] and usage (all other chunks carry usage: null).
//   - usage: prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details.cached_tokens (prompt tokens the
//     prefix cache supplied: whole 128-token blocks), DeepSeek's prompt_cache_hit_tokens / prompt_cache_miss_tokens,
//     completion_tokens_details.reasoning_tokens; Anthropic: cache_read_input_tokens.
//   - A client that disconnects cancels its queued or running request within one step.
//   - Errors: {"error": {"message", "type", "param", "code"}} with a 4xx/5xx status; after the headers of a stream
//     have been sent, an error is a `data: {"error": …}` frame followed by `data: [DONE]`.
// The server never touches tensors: text <-> ids through Tokenizer / chat rendering, generation through EngineLoop.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/batch_model.h"
#include "engine/engine_loop.h"
#include "server/http_options.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: pick a free port (see Server::port())
  int64_t n_ctx = 32768;            // positions per request (prompt + output); clamped to the model's maximum
  int queue = 16;                   // sequences that may wait beyond the engine.max_running running ones
  // The engine loop: max_running (--parallel), batch_tokens, state_bytes (--kv-memory), cache_dir / cache_size,
  // n_threads. Its n_ctx is the server's n_ctx.
  EngineLoopOptions engine;
  std::string model_name = "dsv4";  // id reported by /v1/models and in responses
  double keepalive_s = 5.0;         // SSE keepalive comment interval
  size_t max_body_bytes = 32u << 20;
  std::string api_key;            // non-empty: required on every route but /health
  int64_t reasoning_budget = -1;  // default cap on reasoning tokens for thinking requests without their own (> 0)
  bool auto_unpark = false;       // a request to a parked server reloads the model instead of getting 503
  int park_retry_after_s = 5;     // Retry-After of model_parked answers
  // Loads the model again after /admin/park (same folder and options); empty: parking is refused (409).
  std::function<std::shared_ptr<const BatchModel>()> reload;
  // Connections (server/http_transport.h): timeouts, connection limit, request threads (0: parallel + 32,
  // not one per queued request: streamed responses detach from theirs, see server.cpp setup_routes).
  HttpTransportOptions http;
};

class Server {
 public:
  // The model and tokenizer must describe the same vocabulary. Throws dsv4::Error on bad options.
  Server(ServerOptions opts, std::shared_ptr<const BatchModel> model, std::shared_ptr<const Tokenizer> tok);
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

// The host part of a URL for the address the server listens on: IPv6 literals in brackets ("::1" -> "[::1]").
std::string url_host(const std::string& host);

}  // namespace dsv4
