// Generation requests, results and timings of the engine (src/engine/engine.h). Plain data, no tensors.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/logprobs.h"
#include "sampling/sampling_params.h"
#include "sampling/token_constraint.h"

namespace dsv4 {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, non-empty, each in [0, n_vocab); BOS already included if wanted
  SamplingParams sampling;
  int64_t max_tokens = -1;        // generated tokens at most; -1: until the context is full
  std::vector<std::string> stop;  // text-level stop strings (need a tokenizer), excluded from the output
  bool ignore_eos = false;        // keep generating after the model's EOS token (benchmarks)
  // Log-probabilities of each generated token (GenerationCallbacks::on_logprobs): -1 off, else the number of most
  // likely alternatives to report with it (0..20 through the API; any n >= 0 here).
  int top_logprobs = -1;
  // Consulted before and after sampling each token (structured output, reasoning budget); null: none. Stateful:
  // one constraint object serves one generation.
  std::shared_ptr<TokenConstraint> constraint;
};

enum class FinishReason {
  stop,       // EOS or a stop string
  length,     // max_tokens reached or the context is full
  cancelled,  // the cancel callback fired (client went away, Ctrl-C)
};
const char* to_string(FinishReason r);

struct GenerationTimings {
  int64_t prompt_tokens = 0;   // length of the request's prompt
  int64_t cached_tokens = 0;   // prompt tokens reused from the previous sequence (prefix reuse), not recomputed
  int64_t prefill_tokens = 0;  // prompt tokens actually computed (prompt_tokens - cached_tokens)
  double prefill_ms = 0.0;
  int64_t decode_tokens = 0;  // positions decoded after the prefill (one per generated token but the last; with
                              // speculation the kept positions of the verify steps)
  double decode_ms = 0.0;     // forward steps + sampling after the prefill
  int64_t drafted_tokens = 0;   // speculative decoding (--spec-draft): draft tokens verified
  int64_t accepted_tokens = 0;  // ... and accepted
  double prefill_tokens_per_s() const { return prefill_ms > 0 ? prefill_tokens * 1e3 / prefill_ms : 0.0; }
  double decode_tokens_per_s() const { return decode_ms > 0 ? decode_tokens * 1e3 / decode_ms : 0.0; }
};

struct GenerationResult {
  std::vector<int32_t> ids;  // generated tokens (EOS excluded; the token that completed a stop string included)
  std::string text;          // decoded text of `ids`, cut before the stop string (empty without a tokenizer)
  FinishReason finish = FinishReason::length;
  std::string stop_matched;  // the stop string that ended generation, if any
  GenerationTimings timings;
};

struct GenerationCallbacks {
  // Called once per generated token (EOS excluded) with the text it completes (may be empty: partial UTF-8, or text
  // held back because it may start a stop string). Return false to cancel. At the end, text still held back is
  // delivered with id -1 (its return value is then ignored).
  std::function<bool(int32_t id, std::string_view text)> on_token;
  // With GenerationRequest::top_logprobs >= 0: called for each generated token (EOS excluded) in order, with the
  // model's log-probabilities at that position (sampling/logprobs.h: before penalties, the constraint's mask,
  // temperature and top-k/p), once the token's text is settled: right before the on_token call whose text completes
  // it (several may come before one on_token: text held back as partial UTF-8 or a possible stop string), or before
  // the final id -1 call. Tokens whose text a stop string removed get none (engine/text_output.h states the rule).
  std::function<void(const TokenLogprobs&)> on_logprobs;
  // Polled between prefill chunks and before each decode step; true cancels (finish = cancelled).
  std::function<bool()> should_cancel;
};

}  // namespace dsv4
