// The text layer of one request on an EngineLoop (engine/engine_loop.h): what Engine::generate does for a single
// sequence (engine/engine.h), for a request that shares every forward step with the loop's other requests. Submits
// the GenerationRequest's tokens, sampling, constraint and log-probability settings, then on the calling thread
// decodes the streamed tokens to text, matches stop strings (the request is cancelled in the loop as soon as its text
// matched one: tokens the loop produced after it are dropped, never reported), and calls the callbacks.
//
// Results equal Engine::generate's for the same request (the loop is batch invariant); timings: prefill_ms is the
// time from submission to the first token (queueing included), cached_tokens the prompt tokens the prefix cache
// supplied (whole 128-token blocks).
#pragma once
#include <chrono>

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

}  // namespace dsv4
