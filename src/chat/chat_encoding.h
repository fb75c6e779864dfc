// DeepSeek V4 chat prompt rendering: OpenAI-style chat request -> prompt pieces -> token ids.
// Semantics and bytes follow the official `encoding/encoding_dsv4.py` (`encode_messages`, spec §7.2); the rendered
// text is byte-identical to it (tests/data/chat/). Layout, with no newlines between segments:
//   <｜begin▁of▁sentence｜>[max-effort prefix]{system}[\n\n## Tools…][\n\n## Response Format…]
//   [<｜latest_reminder｜>{reminder}]<｜User｜>{user}<｜Assistant｜>{<think>|</think>}[{reasoning}</think>]{content}
//   [\n\n<｜DSML｜tool_calls>…</｜DSML｜tool_calls>]<｜end▁of▁sentence｜><｜User｜>…
//
// Request fields read (everything else is ignored):
//   messages (required, non-empty array). Each message: role ∈ system|user|assistant|tool|developer|latest_reminder;
//     content: string, null, or an array of {"type":"text","text":…} parts (concatenated; other part types are an
//     error); assistant: reasoning_content (string|null), tool_calls [{id?, type?, function:{name, arguments}}]
//     where arguments is a JSON-object string (an object is also accepted); tool: tool_call_id, content;
//     system/developer: tools, response_format (per message, as in the official encoder); user: task
//     (action|query|authority|domain|title|read_url, internal quick-task tokens); assistant: wo_eos (bool, omit
//     the trailing EOS), mask (ignored).
//   tools: OpenAI function tools; attached to the first system message (one with empty content is inserted at the
//     front when there is none). If that message has its own `tools`, the top-level ones are appended after them.
//     Tool names follow the server's rule (chat/tool_name.h: 1 to 64 letters, digits, '_', '-' or '.').
//   response_format: attached like tools; {"type":"text"} (the OpenAI default) renders nothing.
//   thinking: {"type":"enabled"|"disabled"} — wins over chat_template_kwargs.thinking / .enable_thinking (bool).
//     Default: enabled (thinking mode).
//   reasoning_effort: top level, else chat_template_kwargs.reasoning_effort. "max" or "xhigh" adds the
//     REASONING_EFFORT_MAX prefix in thinking mode; any other string (low, medium, high, none, …) renders as none.
//   chat_template_kwargs.drop_thinking (bool, default true): drop reasoning of turns before the last user turn
//     (forced off when any message defines tools, as in the official encoder).
// Choices where the official encoder is undefined (it would crash or print "None") are listed in
// tests/data/chat/README.md; in short: null content renders as "", invalid argument JSON renders as one
// `arguments` string parameter, non-object argument JSON likewise.
//
// Errors: dsv4::Error whose message names the field, e.g. "messages[2].role: unknown role 'robot'".
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace dsv4 {

// Key order matters (tool schemas are rendered with Python's insertion-ordered json.dumps), so requests are
// handled as ordered_json. Parse request bodies with parse_chat_request() (or nlohmann::ordered_json::parse).
using OrderedJson = nlohmann::ordered_json;

// One run of prompt text. control = the renderer's own marker (BOS, EOS, <｜User｜>, <｜Assistant｜>, <think>,
// </think>, ｜DSML｜, <｜latest_reminder｜>, task tokens): exactly one special token. control = false: text that is
// BPE-encoded as plain bytes (user/tool/assistant content and template text; a special-token string inside it
// stays plain text).
struct PromptPiece {
  std::string text;
  bool control = false;
};

struct ChatPrompt {
  std::vector<PromptPiece> pieces;
  bool thinking = true;             // thinking mode: the generation starts inside reasoning (after <think>)
  bool reasoning_effort_max = false;  // the max-effort prefix was rendered
  // The rendered prompt string (pieces concatenated): byte-identical to encode_messages() of the official encoder.
  std::string text() const;
};

// Parses a JSON request body; throws dsv4::Error("request: invalid JSON: …") on malformed input.
OrderedJson parse_chat_request(std::string_view body);

// Renders a chat request (see above). Throws dsv4::Error naming the offending field.
ChatPrompt render_chat(const OrderedJson& request);

// Token ids of a rendered prompt: control pieces -> their special-token id (dsv4::Error if the tokenizer lacks
// one), consecutive non-control pieces are joined and encoded with parse_special=false.
std::vector<int32_t> tokenize_prompt(const Tokenizer& tok, const ChatPrompt& prompt);

}  // namespace dsv4
