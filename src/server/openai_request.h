// Validation of OpenAI-style request bodies (/v1/chat/completions, /v1/completions) into an ApiRequest: the
// GenerationRequest plus what the responders need. Unknown top-level fields are ignored; known fields with a wrong
// type or range, malformed JSON, empty messages, prompts or max_tokens beyond the context, unknown fields inside the
// objects this server defines (response_format, response_format.json_schema, thinking, tool_choice), and unsupported
// features (logit_bias, echo, best_of > 1, suffix) throw ApiError 400 naming the field.
//
// ignore_eos (bool, vLLM's extension): generate max_tokens tokens whatever the model's EOS (benchmarks).
// n: choices, 1..kMaxChoices (each its own sequence, sharing the prompt's cached blocks; see server.h for seeds).
// Sampling fields: temperature [0, 2] (default 1), top_p (0, 1], top_k (int, <= 0 off), min_p [0, 1], seed (int),
// stop (string or array of up to 16 non-empty strings), presence_penalty / frequency_penalty [-2, 2],
// repetition_penalty (0, 10], max_tokens / max_completion_tokens (int >= 1; default: the rest of the context).
//
// Chat only:
//   logprobs (bool), top_logprobs (0..20, needs logprobs: true);
//   response_format: {"type": "text"} | {"type": "json_object"} | {"type": "json_schema", "json_schema": {"name"
//     ([A-Za-z0-9_-]{1,64}), "description"?, "schema"?, "strict"?}} -> a grammar (server/json_schema_grammar.h;
//     unsupported schema keywords are 400s); llama.cpp's {"type": "json_object", "schema": …} is accepted too;
//   tools: [{"type": "function", "function": {"name" ([A-Za-z0-9_.-]{1,64}, unique), "description"?, "parameters"?
//     (a JSON Schema object: type "object", properties, required), "strict"?}}];
//   tool_choice: "none" (tools dropped from the prompt) | "auto" | "required" | {"type": "function", "function":
//     {"name"}}; required / named -> the answer is constrained to a DSML call (of that function; the grammar wins over
//     a response_format);
//   parallel_tool_calls (bool, default true): false -> at most one call (constrained); tools in auto mode with
//     parallel calls and no JSON response_format leave the answer unconstrained (the tool grammar is still built, to
//     validate the tool schemas); auto mode with a JSON response_format: the answer is that JSON or a call;
//   thinking: {"type": "enabled" | "disabled", "budget_tokens"?: int >= 1} (a budget caps the reasoning tokens);
//   reasoning_effort: "max" / "xhigh" add the maximum-effort prefix (thinking mode); "none", "minimal", "low",
//     "medium", "high" are accepted and change nothing (the model has one thinking mode); other values are 400s;
//   messages: render errors name the message field; tool messages need a non-empty tool_call_id; an assistant
//     tool call's function.arguments must be a string holding a JSON object.
// Completions only: logprobs (int 0..20: the sampled token plus that many alternatives).
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/generation.h"
#include "sampling/grammar.h"
#include "server/tool_call_grammar.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

inline constexpr int kMaxChoices = 16;

struct ApiRequest {
  int n = 1;               // choices (OpenAI n)
  bool chat = true;        // a chat message is generated (chat completions, Anthropic messages)
  bool anthropic = false;  // /v1/messages
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool thinking = false;          // chat: the output starts inside reasoning (prompt ended with <think>)
  bool logprobs = false;          // report log-probabilities (gen.top_logprobs >= 0)
  int64_t reasoning_budget = -1;  // thinking.budget_tokens; -1: none given (the server default applies)
  // The answer's grammar (response_format, tool_choice, parallel_tool_calls = false), or null. Requests with equal
  // grammar_key have equal grammars (the server caches their automata).
  std::shared_ptr<const Grammar> grammar;
  std::string grammar_key;
  GenerationRequest gen;  // prompt ids, sampling, max_tokens, stop, top_logprobs
};

// Throws ApiError (400) as described above. `bos_id` is prepended to a text completion prompt that does not
// already start with it.
ApiRequest parse_chat_completion_request(std::string_view body, const Tokenizer& tok, int64_t n_ctx);
ApiRequest parse_completion_request(std::string_view body, const Tokenizer& tok, int64_t n_ctx, int32_t bos_id);
// The chat path on an already parsed OpenAI-style body (the Anthropic parser converts into this form).
ApiRequest chat_request_from_json(nlohmann::ordered_json body, const Tokenizer& tok, int64_t n_ctx);

// Validates OpenAI `tools` (located at `path`) and returns their specs; ApiError 400 naming the field otherwise.
std::vector<ToolSpec> parse_tools(const nlohmann::ordered_json& tools, const std::string& path = "tools");

}  // namespace dsv4
