// Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens) on top of the chat path.
//
// Request -> the OpenAI-style chat body of server/openai_request.h (same rendering, validation and constraints):
//   model (string, not checked), max_tokens (required int >= 1; not for count_tokens), messages (required, roles
//   user | assistant; content a string or blocks), system (string or text blocks), stop_sequences (<= 16 non-empty
//   strings), temperature [0, 1], top_p, top_k, stream, tools [{name, description?, input_schema}] (input_schema a
//   JSON Schema object), tool_choice {type: auto | any | tool | none, name (tool), disable_parallel_tool_use?},
//   thinking {type: "enabled", budget_tokens >= 1} | {type: "adaptive"} (thinking without a budget) | {type:
//   "disabled"} (default disabled, as Anthropic), metadata
//   and service_tier (ignored). Other top-level fields are ignored; unknown fields inside thinking / tool_choice
//   and unknown block types are 400s.
//   Blocks: text {text}; user: tool_result {tool_use_id, content: string | text blocks, is_error?} (becomes a tool
//   message); assistant: tool_use {id, name, input: object} (a tool call), thinking {thinking, signature} (becomes
//   reasoning_content), redacted_thinking (dropped). cache_control / citations on a block are ignored.
//   tool_choice any -> required, tool -> named, disable_parallel_tool_use -> parallel_tool_calls false.
// Response: {id "msg_…", type "message", role "assistant", model, content: [thinking {thinking, signature}]
//   [text {text}] [tool_use {id, name, input}...] (blocks with something in them; one empty text block when there is
//   nothing at all, streamed or not), stop_reason end_turn | max_tokens | stop_sequence | tool_use,
//   stop_sequence, usage {input_tokens (not cached), cache_read_input_tokens, cache_creation_input_tokens 0,
//   output_tokens, draft_n, draft_n_accepted (speculative decoding: drafts verified / accepted, as the OpenAI path's
//   timings)}}. Thinking blocks carry an empty signature (there is nothing to sign).
// Stream: SSE `event: <type>` + `data: {…}`: message_start (content [], usage), then per block content_block_start
//   / content_block_delta (thinking_delta + a final signature_delta, text_delta, input_json_delta with the whole
//   arguments) / content_block_stop, then message_delta {stop_reason, stop_sequence} + usage (the whole message's,
//   draft counts included), then message_stop.
//   Errors after the start: `event: error` with {"type": "error", "error": {…}}.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "server/generation_output.h"
#include "server/openai_format.h"
#include "server/openai_request.h"

namespace dsv4 {

ApiRequest parse_anthropic_request(std::string_view body, const Tokenizer& tok, int64_t n_ctx, bool count_only);

// stop_reason of a finished generation.
std::string anthropic_stop_reason(const GenerationOutput& out, const GenerationResult& r);
ojson anthropic_usage_json(const GenerationResult& r);
ojson anthropic_message_json(const std::string& id, const std::string& model, const GenerationOutput& out,
                             const GenerationResult& r);

// The streamed event sequence; `emit(type, data)` writes one SSE event.
class AnthropicStream {
 public:
  using Emit = std::function<void(const std::string& type, const ojson& data)>;
  AnthropicStream(Emit emit, std::string id, std::string model)
      : emit_(std::move(emit)), id_(std::move(id)), model_(std::move(model)) {}
  void start(int64_t input_tokens);
  void delta(const ChatDelta& d);
  void finish(const GenerationOutput& out, const GenerationResult& r);

 private:
  void open(const std::string& type, ojson block);
  void close();
  Emit emit_;
  std::string id_, model_;
  int index_ = -1;
  std::string open_;  // type of the open block ("" none)
};

}  // namespace dsv4
