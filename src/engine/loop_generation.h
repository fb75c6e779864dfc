// The text layer of one request on an EngineLoop (engine/engine_loop.h): what Engine::generate does for a single
// sequence (engine/engine.h), for a request that shares every forward step with the loop's other requests. Submits
// the GenerationRequest's tokens, sampling, constraint and log-probability settings, then on the calling thread
// decodes the streamed tokens to text, matches stop strings (the request is cancelled in the loop as soon as its text
// matched one: tokens the loop produced after it are dropped, never reported), and calls the callbacks.
//
// Results equal Engine::generate's for the same request (the loop is batch invariant); timings: prefill_ms is the
// time from submission to the first token (queueing included), cached_tokens the prompt tokens the prefix cache
// supplied (whole 128-token blocks).
//
// LoopGeneration is the same text layer without a waiting thread: advance() takes the tokens that have arrived (it
// never blocks) and a listener (RequestStream::set_listener, on the loop thread) says when to call it again. The
// server's streamed responses run on it (server/stream_pump.h). Same tokens, text, callbacks and results as
// generate_on_loop with per_token.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include "engine/engine_loop.h"
#include "engine/generation.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

// `tok` (may be null) decodes text and is required when req.stop is non-empty. should_cancel is polled at least
// every `poll`. per_token false (callers that do not stream): without stop strings, the tokens are taken every `poll`
// or at the end instead of one wake-up per token (the same results and callbacks, fewer thread switches). Throws dsv4::Error for a request the loop refuses (empty prompt, ids outside the vocabulary, too long
// for the context or the pool) or that failed in the loop.
GenerationResult generate_on_loop(EngineLoop& loop, const GenerationRequest& req, const Tokenizer* tok,
                                  const GenerationCallbacks& cb = {},
                                  std::chrono::milliseconds poll = std::chrono::milliseconds(20),
                                  bool per_token = true);

class TextOutput;

class LoopGeneration {
 public:
  // Submits the request (throws dsv4::Error for a request the loop refuses, as generate_on_loop). `wake` is called on
  // the loop thread (RequestStream lock held: it must only schedule a later advance()) when a token arrived or the
  // request ended. Call advance() once after constructing it: tokens may arrive before the listener is in place.
  LoopGeneration(EngineLoop& loop, const GenerationRequest& req, const Tokenizer* tok, GenerationCallbacks cb,
                 std::function<void()> wake);
  ~LoopGeneration();  // cancels the request in the loop if it has not ended
  LoopGeneration(const LoopGeneration&) = delete;
  LoopGeneration& operator=(const LoopGeneration&) = delete;

  // Polls should_cancel, hands the tokens that arrived to the callbacks; true once the generation has ended (then
  // result() is ready). Never blocks. Throws dsv4::Error when the request failed in the loop.
  bool advance();
  bool ended() const { return result_.has_value(); }
  GenerationResult& result() { return *result_; }

 private:
  EngineLoop& loop_;
  GenerationRequest req_;
  GenerationCallbacks cb_;
  std::unique_ptr<TextOutput> text_;
  std::shared_ptr<RequestStream> stream_;
  std::chrono::steady_clock::time_point t0_;
  std::optional<std::chrono::steady_clock::time_point> t_first_;
  std::optional<FinishReason> ours_;
  GenerationResult res_;
  size_t have_ = 0;
  bool cancel_sent_ = false;
  std::optional<GenerationResult> result_;
};

}  // namespace dsv4
