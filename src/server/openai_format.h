// JSON shapes of OpenAI responses built from a generation (server/generation_output.h): usage, llama.cpp-style
// timings, the assistant message, tool calls and log-probabilities.
//
// Log-probabilities (values: sampling/logprobs.h, the model's log_softmax before any sampling filter or mask):
//   chat:        {"content": [ENTRY...] | null, "refusal": null} with ENTRY = {"token", "logprob", "bytes",
//                "top_logprobs": [{"token", "logprob", "bytes"}...]}; "token" is the token's bytes as text (invalid
//                UTF-8 shown as U+FFFD), "bytes" the exact bytes. Answer tokens (content and tool-call markup) go to
//                "content"; in thinking mode the reasoning tokens go to an extra "reasoning_content" list (absent
//                when empty).
//   completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}...], "text_offset"}; text_offset in
//                characters (code points) of the completion text, as clients slice it (TextOffsets below).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "chat/output_parser.h"
#include "engine/generation.h"
#include "server/generation_output.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

using ojson = nlohmann::ordered_json;

ojson usage_json(const GenerationResult& r, int64_t reasoning_tokens);
// llama.cpp's `timings`: prompt_n / cache_n / prompt_ms the prompt processing (prompt_n + cache_n = usage.prompt_tokens),
// predicted_n the generated tokens (= usage.completion_tokens) and predicted_ms the time from the first generated token
// to the end (t.decode_ms).
ojson timings_json(const GenerationTimings& t, int64_t predicted_n);
ojson tool_call_delta_json(const ToolCallDelta& d);
// The non-streamed assistant message: role, content (null when only tool calls), reasoning_content (thinking
// mode), tool_calls, refusal.
ojson chat_message_json(const GenerationOutput& out);
// finish_reason: "length", "tool_calls" (chat with tool calls), else "stop".
const char* openai_finish_reason(const GenerationOutput& out, FinishReason f);

ojson chat_logprobs_json(const std::vector<TokenLogprobs>& answer, const std::vector<TokenLogprobs>& reasoning,
                         const Tokenizer& tok);
// The text_offset of completion tokens: where each token's text starts in the completion text, counted in
// characters (code points: what OpenAI / vLLM clients index the text string by), not bytes. The completion text is the
// UTF-8 decoding of the tokens' bytes (tokenizer/stream_decoder.h), so a token's offset is the number of characters
// decoded from the tokens before it: a character split over several tokens belongs to the token that completes it
// (the tokens holding its first bytes have the same offset as that one), and invalid bytes count as the U+FFFD the
// text shows for them.
class TextOffsets {
 public:
  explicit TextOffsets(const Tokenizer& tok) : decoder_(tok) {}
  // The offset of token `id`, then advances past it (the tokens of a choice in order).
  int64_t next(int32_t id);

 private:
  StreamDecoder decoder_;
  int64_t chars_ = 0;
};

// offsets: those of this choice's tokens so far; advanced past `tokens`.
ojson completion_logprobs_json(const std::vector<TokenLogprobs>& tokens, const Tokenizer& tok, TextOffsets& offsets);

}  // namespace dsv4
