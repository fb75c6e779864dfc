// Generation engine: one LanguageModel and one LmSequence, used by one request at a time (the server queues
// requests in front of it). Prompt ids in, sampled tokens and text out through callbacks.
//
// Prefix reuse: a new prompt that shares a prefix with the tokens the sequence already holds (previous prompt +
// generated tokens) rewinds the sequence to the longest common prefix and prefills only the rest; the output equals
// a cold run (LmSequence::rewind guarantees a state identical to a cold prefill). At least one prompt token is always
// recomputed, to get the next-token logits.
//
// Prefill runs in chunks that end at absolute multiples of `prefill_chunk` positions (except the last one), so a
// resumed prefill sees the same chunk boundaries as a cold one.
//
// Prompt + generated tokens never exceed n_ctx (finish = length when the context is full).
//
// Per decode step, on the host logits of the last position: log-probabilities (if asked) from the raw logits, then
// the request's TokenConstraint masks them, then the sampler picks a token, which the constraint is told about.
//
// Speculative decoding: a dsv4::Model loaded with ModelOptions::spec_draft > 0 drafts that many tokens per step
// with its drafter and verifies them in one step (engine/spec_decode.h; same tokens for greedy requests, the
// same distribution for sampled ones; log-probabilities and constraints as without it). The speculative path
// keeps no sequence between requests (no prefix reuse).
//
// Not thread-safe: one generate() at a time.
#pragma once
#include <functional>
#include <memory>
#include <string_view>

#include "engine/generation.h"
#include "model/language_model.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

class TextOutput;

class Engine {
 public:
  // n_ctx: positions a sequence may hold (<= model.max_context(); 0 = model.max_context()).
  // prefill_chunk: prefill chunk grid in positions (> 0). Throws dsv4::Error on bad values.
  Engine(std::shared_ptr<const LanguageModel> model, int64_t n_ctx = 0, int64_t prefill_chunk = 512);

  // Runs one generation. `tok` (may be null) decodes text and is required when req.stop is non-empty.
  // Throws dsv4::Error for an empty prompt, a token outside the vocabulary, a prompt of n_ctx tokens or more, invalid
  // sampling parameters, or a model failure (the cached sequence is then dropped).
  GenerationResult generate(const GenerationRequest& req, const Tokenizer* tok, const GenerationCallbacks& cb = {});

  // Forget the cached sequence (the next prompt is prefilled from position 0).
  void reset();

  const LanguageModel& model() const { return *model_; }
  int64_t n_ctx() const { return n_ctx_; }
  // Tokens held by the cached sequence (empty after reset()).
  std::vector<int32_t> cached_tokens() const;
  // Draft tokens per step of speculative decoding (0: off).
  int spec_draft() const { return spec_k_; }

 private:
  // the speculative path of generate() (engine_spec.cpp), on a request generate() has checked
  GenerationResult generate_spec(const GenerationRequest& req, TextOutput& text, const GenerationCallbacks& cb);
  std::shared_ptr<const LanguageModel> model_;
  int64_t n_ctx_;
  int64_t prefill_chunk_;
  std::unique_ptr<LmSequence> seq_;
  const class Model* spec_model_ = nullptr;  // the model, when it speculates
  int spec_k_ = 0;
};

}  // namespace dsv4
