// Validation of OpenAI-style request bodies (/v1/chat/completions, /v1/completions) into a GenerationRequest.
// Unknown fields are ignored; known fields with a wrong type or range, malformed JSON, empty messages, prompts or
// max_tokens beyond the context, and unsupported features (n > 1, logprobs, logit_bias, echo, best_of > 1,
// suffix, json response_format, tool_choice other than auto / none) throw ApiError 400.
//
// Sampling fields: temperature [0, 2] (default 1), top_p (0, 1], top_k (int, <= 0 off), min_p [0, 1], seed (int),
// stop (string or array of up to 16 non-empty strings), presence_penalty / frequency_penalty [-2, 2],
// repetition_penalty (0, 10], max_tokens / max_completion_tokens (int >= 1; default: the rest of the context).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/generation.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

struct ApiRequest {
  bool chat = true;  // /v1/chat/completions (false: /v1/completions)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool thinking = false;       // chat: the output starts inside reasoning (prompt ended with <think>)
  GenerationRequest gen;       // prompt ids, sampling, max_tokens, stop
};

// Throws ApiError (400) as described above. `bos_id` is prepended to a text completion prompt that does not
// already start with it.
ApiRequest parse_chat_completion_request(std::string_view body, const Tokenizer& tok, int64_t n_ctx);
ApiRequest parse_completion_request(std::string_view body, const Tokenizer& tok, int64_t n_ctx, int32_t bos_id);

}  // namespace dsv4
