// Parsing of DeepSeek V4 model output (decoded text) into an OpenAI assistant message, whole or incrementally.
// Grammar (official `parse_message_from_completion_text`, spec §7.2):
//   [reasoning</think>]content[\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="N">\n
//     <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n…</｜DSML｜invoke>\n…
//   </｜DSML｜tool_calls>][<｜end▁of▁sentence｜>]
// thinking=true: output starts inside reasoning (the prompt ended with <think>) until </think>.
// Tool calls: string="true" -> V is a raw string (JSON-escaped into arguments); "false" -> V is JSON, copied as is
// (if V is not valid JSON it is treated as a string). arguments = "{\"K\": V, …}" (", " and ": " separators, as the
// official decoder), always a JSON object string.
//
// Streaming: push() accepts text split anywhere (even inside a marker or a UTF-8 character); text that could be
// the start of a marker is held back until it can be classified, and finish() flushes it. A tool call is emitted
// as one ToolCallDelta (id, name and the complete arguments) when its </｜DSML｜invoke> has been parsed; the
// concatenated deltas of push()…finish() always equal the whole-text result.
//
// Tolerance (the model's mistakes never lose text):
//   - a tool-call block inside reasoning (no </think>) ends the reasoning and is parsed as tool calls;
//   - the block marker is recognised without its leading "\n\n" (which is removed when present);
//   - malformed DSML (bad header, bad parameter, duplicate parameter name, unterminated block at finish) -> the raw
//     text from the first unparsed invoke (or from the block marker when no call was parsed) goes to content;
//   - non-whitespace text after </｜DSML｜tool_calls> goes to content (whitespace there is dropped);
//   - a leading "<think>" at the very start of reasoning is dropped; text after <｜end▁of▁sentence｜> is ignored.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

// A random prefix for the tool-call ids of one response (an id is the prefix + the call's index): OpenAI's form
// "call_<16 hex digits>_", or Anthropic's "toolu_<16 hex digits>" (its tool_use ids are "toolu_" + base62 characters).
enum class ToolIdStyle { openai, anthropic };
std::string random_tool_id_prefix(ToolIdStyle style);

struct ToolCall {
  std::string id;         // "call_<random hex>_<index>" (or id_prefix + index)
  std::string name;
  std::string arguments;  // JSON object as a string
};

// OpenAI streaming shape: one delta per tool call here (name and full arguments in the same delta).
struct ToolCallDelta {
  int index = 0;
  std::string id, name, arguments;
};

struct ChatDelta {
  std::string reasoning, content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class OutputParser {
 public:
  // thinking=true: output starts inside reasoning until </think>. id_prefix: tool-call ids are id_prefix + index;
  // empty -> random_tool_id_prefix(ToolIdStyle::openai).
  explicit OutputParser(bool thinking, std::string id_prefix = "");

  ChatDelta push(std::string_view text);  // feed decoded text as it streams
  // Flush held-back bytes (e.g. a trailing prefix of a marker); call once. truncated: the generation was cut off (the
  // token limit), so a tool-call block still open at the end is dropped (the calls completed before it are kept)
  // instead of going to content as raw markup, and so is a trailing beginning of a marker ("\n\n<｜DSML｜to", also
  // when the cut split one of its characters into U+FFFD).
  ChatDelta finish(bool truncated = false);

  // Accumulated so far (everything emitted by push/finish).
  std::string reasoning() const { return reasoning_; }
  std::string content() const { return content_; }
  const std::vector<ToolCall>& tool_calls() const { return tool_calls_; }
  bool finished() const { return finished_; }
  bool saw_eos() const { return state_ == State::kDone; }  // <｜end▁of▁sentence｜> text was seen
  bool in_reasoning() const { return state_ == State::kReasoning; }  // reasoning not closed yet

  // Whole-text convenience: push(text) + finish().
  static OutputParser parse(std::string_view text, bool thinking, std::string id_prefix = "call_");

 private:
  enum class State { kReasoning, kContent, kTools, kAfterTools, kDone };
  void step(ChatDelta& out, bool at_end);
  void emit_reasoning(ChatDelta& out, std::string_view s);
  void emit_content(ChatDelta& out, std::string_view s);
  // Tries to parse complete invokes from tool_buf_; returns false on malformed DSML.
  bool parse_tools(ChatDelta& out, bool at_end);

  State state_;
  bool at_start_ = true;
  bool finished_ = false;
  bool truncated_ = false;
  std::string id_prefix_;
  std::string buf_;       // unclassified text (reasoning/content/after-tools states)
  std::string tool_buf_;  // raw text of the current tool-call block after its marker
  std::string block_raw_prefix_;  // the marker text itself ("\n\n<｜DSML｜tool_calls>"), restored on failure
  size_t calls_in_block_ = 0;
  std::string reasoning_, content_;
  std::vector<ToolCall> tool_calls_;
};

}  // namespace dsv4
