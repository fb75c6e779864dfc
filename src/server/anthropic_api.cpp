#include "server/anthropic_api.h"

#include <optional>

#include "core/json_depth.h"
#include "server/api_error.h"
#include "server/request_fields.h"

namespace dsv4 {

namespace {

using J = ojson;
using namespace reqf;

// Text of a string or an array of text blocks.
std::string text_of(const J& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad_request(where, where + ": must be a string or an array of text blocks");
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const J& b = c[i];
    const std::string w = fmt::format("{}[{}]", where, i);
    if (!b.is_object() || b.value("type", "") != "text" || !b.contains("text") || !b["text"].is_string())
      bad_request(w, w + ": only text blocks are supported here");
    if (!out.empty()) out += "\n\n";
    out += b["text"].get<std::string>();
  }
  return out;
}

// Anthropic messages -> OpenAI chat messages.
void convert_messages(const J& in, J& out) {
  for (size_t i = 0; i < in.size(); ++i) {
    const J& m = in[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_request(where, where + ": expected an object");
    const auto role = string(m, "role", where);
    if (role != "user" && role != "assistant")
      bad_request(where + ".role", fmt::format("{}.role: must be 'user' or 'assistant'", where));
    const J* c = field(m, "content");
    if (!c) bad_request(where + ".content", where + ".content: required");
    if (c->is_string()) {
      out.push_back({{"role", *role}, {"content", *c}});
      continue;
    }
    if (!c->is_array()) bad_request(where + ".content", where + ".content: must be a string or an array of blocks");
    std::string text, reasoning;
    bool has_reasoning = false;
    J calls = J::array();
    auto flush_user_text = [&] {
      if (!text.empty()) out.push_back({{"role", "user"}, {"content", text}});
      text.clear();
    };
    for (size_t j = 0; j < c->size(); ++j) {
      const J& b = (*c)[j];
      const std::string w = fmt::format("{}.content[{}]", where, j);
      if (!b.is_object()) bad_request(w, w + ": expected a content block object");
      const auto type = string(b, "type", w);
      if (!type) bad_request(w + ".type", w + ".type: required");
      if (*type == "text") {
        const auto t = string(b, "text", w);
        if (!t) bad_request(w + ".text", w + ".text: required");
        if (!text.empty()) text += "\n\n";
        text += *t;
      } else if (*type == "tool_result" && role == "user") {
        flush_user_text();
        const auto id = string(b, "tool_use_id", w);
        if (!id || id->empty()) bad_request(w + ".tool_use_id", w + ".tool_use_id: required non-empty string");
        std::string content;
        if (const J* rc = field(b, "content")) content = text_of(*rc, w + ".content");
        if (boolean(b, "is_error", w).value_or(false)) content = "Error: " + content;
        out.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", content}});
      } else if (*type == "tool_use" && role == "assistant") {
        const auto id = string(b, "id", w);
        const auto name = string(b, "name", w);
        if (!id || id->empty()) bad_request(w + ".id", w + ".id: required non-empty string");
        if (!name || name->empty()) bad_request(w + ".name", w + ".name: required non-empty string");
        const J* input = field(b, "input");
        if (input && !input->is_object()) bad_request(w + ".input", w + ".input: must be an object");
        calls.push_back({{"id", *id},
                         {"type", "function"},
                         {"function", {{"name", *name}, {"arguments", (input ? *input : J::object()).dump()}}}});
      } else if (*type == "thinking" && role == "assistant") {
        const auto t = string(b, "thinking", w);
        reasoning += t.value_or("");
        has_reasoning = true;
      } else if (*type == "redacted_thinking" && role == "assistant") {
        continue;
      } else {
        bad_request(w + ".type", fmt::format("{}.type: '{}' blocks are not supported in {} messages", w, *type, *role));
      }
    }
    if (*role == "user") {
      flush_user_text();
    } else {
      J msg = {{"role", "assistant"}, {"content", text}};
      if (has_reasoning) msg["reasoning_content"] = reasoning;
      if (!calls.empty()) msg["tool_calls"] = calls;
      out.push_back(std::move(msg));
    }
  }
}

}  // namespace

ApiRequest parse_anthropic_request(std::string_view body_text, const Tokenizer& tok, int64_t n_ctx, bool count_only) {
  const J body = parse_object_body(body_text);
  J chat = J::object();
  if (const J* m = field(body, "model")) {
    if (!m->is_string()) bad_request("model", "'model' must be a string");
    chat["model"] = *m;
  }
  const J* msgs = field(body, "messages");
  if (!msgs) bad_request("messages", "'messages' is required");
  if (!msgs->is_array() || msgs->empty()) bad_request("messages", "'messages' must be a non-empty array");
  J messages = J::array();
  if (const J* sys = field(body, "system"))
    messages.push_back({{"role", "system"}, {"content", text_of(*sys, "system")}});
  convert_messages(*msgs, messages);
  chat["messages"] = std::move(messages);

  const std::optional<int64_t> max_tokens = integer(body, "max_tokens");
  if (auto mt = max_tokens) {
    if (*mt < 1) bad_request("max_tokens", fmt::format("'max_tokens' must be at least 1, got {}", *mt));
    chat["max_tokens"] = *mt;
  } else if (!count_only) {
    bad_request("max_tokens", "'max_tokens' is required");
  }
  if (const J* st = field(body, "stop_sequences")) {
    if (!st->is_array()) bad_request("stop_sequences", "'stop_sequences' must be an array of strings");
    if (st->size() > 16) bad_request("stop_sequences", "'stop_sequences' may hold at most 16 strings");
    for (const auto& s : *st)
      if (!s.is_string() || s.get<std::string>().empty())
        bad_request("stop_sequences", "'stop_sequences' must hold non-empty strings");
    if (!st->empty()) chat["stop"] = *st;
  }
  if (auto t = number(body, "temperature", 0, 1)) chat["temperature"] = *t;
  if (auto p = number(body, "top_p", 0, 1, true)) chat["top_p"] = *p;
  if (auto k = integer(body, "top_k")) {
    if (*k < 0) bad_request("top_k", "'top_k' must be >= 0");
    chat["top_k"] = *k;
  }
  if (auto s = boolean(body, "stream")) chat["stream"] = *s;

  // Thinking: disabled unless asked for.
  J thinking = {{"type", "disabled"}};
  if (const J* th = object(body, "thinking", {"type", "budget_tokens"})) {
    const auto type = string(*th, "type", "thinking");
    if (type == "enabled") {
      const auto b = integer(*th, "budget_tokens", "thinking");
      if (!b) bad_request("thinking.budget_tokens", "'thinking.budget_tokens' is required when thinking is enabled");
      if (*b < 1)
        bad_request("thinking.budget_tokens", fmt::format("'thinking.budget_tokens' must be >= 1, got {}", *b));
      if (max_tokens && *b >= *max_tokens)  // as Anthropic's API: the thinking is part of max_tokens
        bad_request("thinking.budget_tokens",
                    fmt::format("'thinking.budget_tokens' must be less than 'max_tokens', got {} (max_tokens {})", *b,
                                *max_tokens));
      thinking = {{"type", "enabled"}, {"budget_tokens", *b}};
    } else if (type == "adaptive") {
      thinking = {{"type", "enabled"}};
    } else if (type != "disabled") {
      bad_request("thinking.type", "'thinking.type' must be 'enabled' or 'disabled'");
    }
  }
  chat["thinking"] = thinking;

  if (const J* tools = field(body, "tools")) {
    if (!tools->is_array()) bad_request("tools", "'tools' must be an array");
    J out = J::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const J& t = (*tools)[i];
      const std::string w = fmt::format("tools[{}]", i);
      if (!t.is_object()) bad_request(w, w + ": expected an object");
      if (const J* ty = field(t, "type"); ty && *ty != "custom")
        bad_request(w + ".type", fmt::format("{}.type: only custom (client) tools are supported", w));
      const auto name = string(t, "name", w);
      if (!name) bad_request(w + ".name", w + ".name: required");
      const J* schema = field(t, "input_schema");
      if (!schema || !schema->is_object())
        bad_request(w + ".input_schema", w + ".input_schema: required JSON Schema object");
      J fn = {{"name", *name}, {"parameters", *schema}};
      if (auto d = string(t, "description", w)) fn["description"] = *d;
      out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    try {
      parse_tools(out);
    } catch (const ApiError& e) {  // name the Anthropic field
      auto rename = [](std::string s) {
        for (auto [from, to] :
             {std::pair<std::string, std::string>{".function.parameters", ".input_schema"}, {".function", ""}})
          for (size_t k; (k = s.find(from)) != std::string::npos;) s.replace(k, from.size(), to);
        return s;
      };
      bad_request(rename(e.param()), rename(e.what()));
    }
    if (!out.empty()) chat["tools"] = std::move(out);
  }
  if (const J* tc = object(body, "tool_choice", {"type", "name", "disable_parallel_tool_use"})) {
    const auto type = string(*tc, "type", "tool_choice");
    if (type == "auto") {
      chat["tool_choice"] = "auto";
    } else if (type == "any") {
      chat["tool_choice"] = "required";
    } else if (type == "none") {
      chat["tool_choice"] = "none";
    } else if (type == "tool") {
      const auto name = string(*tc, "name", "tool_choice");
      if (!name) bad_request("tool_choice.name", "'tool_choice.name' is required for type 'tool'");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    } else {
      bad_request("tool_choice.type", "'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'");
    }
    if (boolean(*tc, "disable_parallel_tool_use", "tool_choice").value_or(false)) chat["parallel_tool_calls"] = false;
  }
  ApiRequest r;
  try {
    // count_tokens counts any prompt (as Anthropic's): the context size limits generation, not counting
    r = chat_request_from_json(std::move(chat), tok, count_only ? int64_t(1) << 62 : n_ctx);
  } catch (const ApiError& e) {
    if (e.param() == "tool_choice.function.name") {  // Anthropic's errors have no param: the message names the field
      std::string msg = e.what();
      for (size_t k; (k = msg.find("tool_choice.function.name")) != std::string::npos;)
        msg.replace(k, std::string_view("tool_choice.function.name").size(), "tool_choice.name");
      bad_request("tool_choice.name", msg);
    }
    if (e.param() == "stop") bad_request("stop_sequences", e.what());
    throw;
  }
  r.anthropic = true;
  return r;
}

std::string anthropic_stop_reason(const GenerationOutput& out, const GenerationResult& r) {
  if (r.finish == FinishReason::length) return "max_tokens";
  if (out.has_tool_calls()) return "tool_use";
  if (!r.stop_matched.empty()) return "stop_sequence";
  return "end_turn";
}

ojson anthropic_usage_json(const GenerationResult& r) {
  const auto& t = r.timings;
  return {{"input_tokens", t.prompt_tokens - t.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", t.cached_tokens},
          {"output_tokens", static_cast<int64_t>(r.ids.size())},
          {"draft_n", t.drafted_tokens},             // speculative decoding (--spec-draft): drafts verified
          {"draft_n_accepted", t.accepted_tokens}};  // ... and accepted (the names of the OpenAI path's timings)
}

namespace {
J tool_use_block(const ToolCall& c) {
  J input = json_nesting_exceeds(c.arguments, kMaxJsonRequestDepth) ? J() : J::parse(c.arguments, nullptr, false);
  if (input.is_discarded() || !input.is_object()) input = J::object();
  return {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", std::move(input)}};
}
}  // namespace

ojson anthropic_message_json(const std::string& id, const std::string& model, const GenerationOutput& out,
                             const GenerationResult& r) {
  const auto& p = out.parser();
  J content = J::array();
  if (!p.reasoning().empty()) content.push_back({{"type", "thinking"}, {"thinking", p.reasoning()}, {"signature", ""}});
  if (!p.content().empty()) content.push_back({{"type", "text"}, {"text", p.content()}});
  for (const auto& c : p.tool_calls()) content.push_back(tool_use_block(c));
  if (content.empty()) content.push_back({{"type", "text"}, {"text", ""}});  // never an empty content list
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model},
          {"content", std::move(content)},
          {"stop_reason", anthropic_stop_reason(out, r)},
          {"stop_sequence", r.stop_matched.empty() ? J(nullptr) : J(r.stop_matched)},
          {"usage", anthropic_usage_json(r)}};
}

void AnthropicStream::start(int64_t input_tokens) {
  emit_("message_start", {{"type", "message_start"},
                          {"message",
                           {{"id", id_},
                            {"type", "message"},
                            {"role", "assistant"},
                            {"model", model_},
                            {"content", J::array()},
                            {"stop_reason", nullptr},
                            {"stop_sequence", nullptr},
                            {"usage",
                             {{"input_tokens", input_tokens},
                              {"cache_creation_input_tokens", 0},
                              {"cache_read_input_tokens", 0},
                              {"output_tokens", 0}}}}}});
}

void AnthropicStream::open(const std::string& type, ojson block) {
  close();
  ++index_;
  open_ = type;
  emit_("content_block_start",
        {{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
}

void AnthropicStream::close() {
  if (open_.empty()) return;
  if (open_ == "thinking")
    emit_("content_block_delta", {{"type", "content_block_delta"},
                                  {"index", index_},
                                  {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
  emit_("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
  open_.clear();
}

void AnthropicStream::delta(const ChatDelta& d) {
  if (!d.reasoning.empty()) {
    if (open_ != "thinking") open("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    emit_("content_block_delta", {{"type", "content_block_delta"},
                                  {"index", index_},
                                  {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
  }
  if (!d.content.empty()) {
    if (open_ != "text") open("text", {{"type", "text"}, {"text", ""}});
    emit_(
        "content_block_delta",
        {{"type", "content_block_delta"}, {"index", index_}, {"delta", {{"type", "text_delta"}, {"text", d.content}}}});
  }
  for (const auto& t : d.tool_calls) {
    open("tool_use", {{"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", J::object()}});
    emit_("content_block_delta", {{"type", "content_block_delta"},
                                  {"index", index_},
                                  {"delta", {{"type", "input_json_delta"}, {"partial_json", t.arguments}}}});
    close();
  }
}

void AnthropicStream::finish(const GenerationOutput& out, const GenerationResult& r) {
  if (index_ < 0) open("text", {{"type", "text"}, {"text", ""}});  // as the whole message: one empty text block
  close();
  const std::string reason = anthropic_stop_reason(out, r);
  J usage = anthropic_usage_json(r);
  emit_(
      "message_delta",
      {{"type", "message_delta"},
       {"delta", {{"stop_reason", reason}, {"stop_sequence", r.stop_matched.empty() ? J(nullptr) : J(r.stop_matched)}}},
       {"usage", std::move(usage)}});
  emit_("message_stop", {{"type", "message_stop"}});
}

}  // namespace dsv4
