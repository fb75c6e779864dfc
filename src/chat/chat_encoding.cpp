// Port of the semantics of the official encoding_dsv4.py encode_messages() (see chat_encoding.h).
#include "chat/chat_encoding.h"

#include <algorithm>
#include <optional>

#include "chat/dsv4_format.h"
#include "chat/py_json.h"
#include "chat/tool_name.h"
#include "core/error.h"
#include "core/json_depth.h"

namespace dsv4 {

namespace fmtc = chatfmt;

namespace {

struct ToolCallIn {
  std::string id, name;
  std::optional<OrderedJson> args_object;  // arguments given (or parsed) as a JSON object
  std::string args_raw;                     // arguments string as given (used when not an object)
};

struct Block {  // user content block after tool merging
  bool tool_result = false;
  std::string text;         // text block, or tool result content
  std::string tool_use_id;  // tool_result only
};

struct Msg {
  std::string role;
  std::optional<std::string> content;  // nullopt: null/absent
  bool has_blocks = false;
  std::vector<Block> blocks;
  OrderedJson tools = OrderedJson::array();  // list of function definitions (already unwrapped)
  OrderedJson response_format;               // null when none
  std::vector<ToolCallIn> tool_calls;
  std::optional<std::string> reasoning;
  std::optional<std::string> task;
  std::string tool_call_id;  // tool messages
  bool wo_eos = false;
};

const OrderedJson* field(const OrderedJson& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// content: string | null | array of text parts.
std::optional<std::string> read_content(const OrderedJson* c, const std::string& where, const char* joiner) {
  if (!c || c->is_null()) return std::nullopt;
  if (c->is_string()) return c->get<std::string>();
  if (c->is_array()) {
    std::string out;
    for (size_t i = 0; i < c->size(); ++i) {
      const auto& part = (*c)[i];
      if (part.is_string()) {
        if (i) out += joiner;
        out += part.get<std::string>();
        continue;
      }
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
        fail("{}[{}]: only {{\"type\": \"text\", \"text\": ...}} content parts are supported", where, i);
      if (i) out += joiner;
      out += part["text"].get<std::string>();
    }
    return out;
  }
  fail("{}: expected a string, null or an array of text parts", where);
}

std::string opt_string(const OrderedJson& obj, const char* key, const std::string& where) {
  const OrderedJson* v = field(obj, key);
  if (!v || v->is_null()) return {};
  if (!v->is_string()) {
    if (where.empty()) fail("{}: expected a string", key);
    fail("{}.{}: expected a string", where, key);
  }
  return v->get<std::string>();
}

// OpenAI tools -> function definitions (tool["function"]); also accepts bare function definitions.
void append_tools(OrderedJson& dst, const OrderedJson& tools, const std::string& where) {
  if (tools.is_null()) return;
  if (!tools.is_array()) fail("{}: expected an array of tools", where);
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& t = tools[i];
    if (!t.is_object()) fail("{}[{}]: expected an object", where, i);
    const OrderedJson* f = field(t, "function");
    if (f && !f->is_object()) fail("{}[{}].function: expected an object", where, i);
    if (!f && !t.contains("name")) fail("{}[{}].function: required", where, i);
    const OrderedJson& fn = f ? *f : t;
    const OrderedJson* name = field(fn, "name");
    if (!name || !name->is_string() || !valid_tool_name(name->get<std::string>()))
      fail("{}[{}]{}.name: required, {}", where, i, f ? ".function" : "", kToolNameRule);
    dst.push_back(fn);
  }
}

Msg read_message(const OrderedJson& m, size_t idx) {
  const std::string where = fmt::format("messages[{}]", idx);
  if (!m.is_object()) fail("{}: expected an object", where);
  Msg out;
  const OrderedJson* role = field(m, "role");
  if (!role || !role->is_string()) fail("{}.role: required string", where);
  out.role = role->get<std::string>();
  static const char* kRoles[] = {"system", "user", "assistant", "tool", "developer", "latest_reminder"};
  if (std::find(std::begin(kRoles), std::end(kRoles), out.role) == std::end(kRoles))
    fail("{}.role: unknown role '{}' (expected system, user, assistant, tool, developer or latest_reminder)", where,
         out.role);
  out.content = read_content(field(m, "content"), where + ".content", out.role == "tool" ? "\n\n" : "");
  if (const OrderedJson* t = field(m, "tools")) append_tools(out.tools, *t, where + ".tools");
  if (const OrderedJson* rf = field(m, "response_format"); rf && !rf->is_null()) out.response_format = *rf;
  if (out.role == "tool") out.tool_call_id = opt_string(m, "tool_call_id", where);
  if (const OrderedJson* rc = field(m, "reasoning_content"); rc && !rc->is_null()) {
    if (!rc->is_string()) fail("{}.reasoning_content: expected a string", where);
    out.reasoning = rc->get<std::string>();
  }
  if (const OrderedJson* task = field(m, "task"); task && !task->is_null()) {
    if (!task->is_string()) fail("{}.task: expected a string", where);
    const std::string t = task->get<std::string>();
    const bool known = std::any_of(std::begin(fmtc::kTaskTokens), std::end(fmtc::kTaskTokens),
                                   [&](const auto& x) { return x.task == t; });
    if (!known) fail("{}.task: unknown task '{}' (expected action, query, authority, domain, title or read_url)", where, t);
    out.task = t;
  }
  if (const OrderedJson* w = field(m, "wo_eos"); w && !w->is_null()) {
    if (!w->is_boolean()) fail("{}.wo_eos: expected a boolean", where);
    out.wo_eos = w->get<bool>();
  }
  if (const OrderedJson* tcs = field(m, "tool_calls"); tcs && !tcs->is_null()) {
    if (!tcs->is_array()) fail("{}.tool_calls: expected an array", where);
    if (out.role != "assistant" && !tcs->empty()) fail("{}.tool_calls: only assistant messages carry tool calls", where);
    for (size_t j = 0; j < tcs->size(); ++j) {
      const std::string w = fmt::format("{}.tool_calls[{}]", where, j);
      const auto& tc = (*tcs)[j];
      if (!tc.is_object()) fail("{}: expected an object", w);
      const OrderedJson* f = field(tc, "function");
      if (!f || !f->is_object()) fail("{}.function: required object", w);
      ToolCallIn call;
      call.id = opt_string(tc, "id", w);
      if (call.id.empty()) call.id = opt_string(*f, "id", w + ".function");
      const OrderedJson* name = field(*f, "name");
      if (!name || !name->is_string() || name->get<std::string>().empty())
        fail("{}.function.name: required non-empty string", w);  // (as the server: openai_request.cpp)
      call.name = name->get<std::string>();
      const OrderedJson* args = field(*f, "arguments");
      if (!args || args->is_null()) {
        call.args_raw = "";
      } else if (args->is_object()) {
        call.args_object = *args;
      } else if (args->is_string()) {
        call.args_raw = args->get<std::string>();
        if (json_nesting_exceeds(call.args_raw, kMaxJsonRequestDepth))
          fail("{}.function.arguments: nested deeper than {} levels", w, kMaxJsonRequestDepth);
        try {
          OrderedJson parsed = OrderedJson::parse(call.args_raw);
          if (parsed.is_object()) call.args_object = std::move(parsed);
        } catch (const nlohmann::json::exception&) {
        }
      } else {
        fail("{}.function.arguments: expected a JSON string or object", w);
      }
      out.tool_calls.push_back(std::move(call));
    }
  }
  if (out.role == "developer" && (!out.content || out.content->empty()))
    fail("{}.content: a developer message needs non-empty content", where);
  return out;
}

// merge_tool_messages(): tool results (and following user text) become content blocks of one user message.
std::vector<Msg> merge_tool_messages(std::vector<Msg> in) {
  std::vector<Msg> merged;
  for (auto& m : in) {
    if (m.role == "tool") {
      Block b{true, m.content.value_or(""), m.tool_call_id};
      if (!merged.empty() && merged.back().role == "user" && merged.back().has_blocks) {
        merged.back().blocks.push_back(std::move(b));
      } else {
        Msg u;
        u.role = "user";
        u.has_blocks = true;
        u.blocks.push_back(std::move(b));
        merged.push_back(std::move(u));
      }
    } else if (m.role == "user") {
      Block b{false, m.content.value_or(""), {}};
      if (!merged.empty() && merged.back().role == "user" && merged.back().has_blocks && !merged.back().task) {
        merged.back().blocks.push_back(std::move(b));
      } else {
        Msg u;
        u.role = "user";
        u.content = m.content;
        u.has_blocks = true;
        u.blocks.push_back(std::move(b));
        u.task = m.task;
        u.wo_eos = m.wo_eos;
        merged.push_back(std::move(u));
      }
    } else {
      merged.push_back(std::move(m));
    }
  }
  return merged;
}

// sort_tool_results_by_call_order(): tool results in the order of the preceding assistant's tool calls.
void sort_tool_results(std::vector<Msg>& msgs) {
  std::vector<std::pair<std::string, int>> order;  // id -> index in the last assistant's tool calls
  for (auto& m : msgs) {
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      order.clear();
      for (size_t i = 0; i < m.tool_calls.size(); ++i) {
        const std::string& id = m.tool_calls[i].id;
        if (id.empty()) continue;
        auto it = std::find_if(order.begin(), order.end(), [&](const auto& p) { return p.first == id; });
        if (it != order.end())
          it->second = static_cast<int>(i);  // Python dict: last assignment wins
        else
          order.emplace_back(id, static_cast<int>(i));
      }
    } else if (m.role == "user" && m.has_blocks) {
      std::vector<Block> tools;
      for (const auto& b : m.blocks)
        if (b.tool_result) tools.push_back(b);
      if (tools.size() <= 1 || order.empty()) continue;
      const auto rank = [&](const Block& b) {
        for (const auto& [id, i] : order)
          if (id == b.tool_use_id) return i;
        return 0;
      };
      std::stable_sort(tools.begin(), tools.end(), [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      size_t k = 0;
      for (auto& b : m.blocks)
        if (b.tool_result) b = tools[k++];
    }
  }
}

int find_last_user_index(const std::vector<Msg>& msgs) {
  for (int i = static_cast<int>(msgs.size()) - 1; i >= 0; --i)
    if (msgs[i].role == "user" || msgs[i].role == "developer") return i;
  return -1;
}

// _drop_thinking_messages(): before the last user turn, assistants lose reasoning and developers are dropped.
std::vector<Msg> drop_thinking_messages(std::vector<Msg> msgs) {
  const int last_user = find_last_user_index(msgs);
  std::vector<Msg> out;
  for (int i = 0; i < static_cast<int>(msgs.size()); ++i) {
    Msg& m = msgs[i];
    const bool keep = m.role == "user" || m.role == "system" || m.role == "tool" || m.role == "latest_reminder";
    if (keep || i >= last_user) {
      out.push_back(std::move(m));
    } else if (m.role == "assistant") {
      m.reasoning.reset();
      out.push_back(std::move(m));
    }
  }
  return out;
}

class Builder {
 public:
  void control(std::string_view token) { pieces_.push_back(PromptPiece{std::string(token), true}); }
  void text(std::string_view s) {
    if (s.empty()) return;
    if (!pieces_.empty() && !pieces_.back().control)
      pieces_.back().text += s;
    else
      pieces_.push_back(PromptPiece{std::string(s), false});
  }
  // Renderer-owned template text: its ｜DSML｜ / <think> / </think> occurrences are control tokens (the reference
  // tokenizes the whole prompt with special-token matching, so these are single special tokens there too).
  void templ(std::string_view s) {
    static constexpr std::string_view kMarks[] = {fmtc::kDsml, fmtc::kThinkStart, fmtc::kThinkEnd};
    while (!s.empty()) {
      size_t best = std::string_view::npos, len = 0;
      for (auto mk : kMarks) {
        const size_t p = s.find(mk);
        if (p < best) best = p, len = mk.size();
      }
      if (best == std::string_view::npos) {
        text(s);
        return;
      }
      text(s.substr(0, best));
      control(s.substr(best, len));
      s.remove_prefix(best + len);
    }
  }
  std::vector<PromptPiece> take() { return std::move(pieces_); }

 private:
  std::vector<PromptPiece> pieces_;
};

void render_tools(Builder& b, const OrderedJson& tools) {
  b.templ("\n\n");
  b.templ(fmtc::kToolsHead);
  std::string schemas;
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i) schemas += '\n';
    py_json_dump_to(tools[i], schemas);
  }
  b.text(schemas);
  b.templ(fmtc::kToolsTail);
}

void render_response_format(Builder& b, const OrderedJson& rf) {
  b.text("\n\n");
  b.text(fmtc::kResponseFormatPrefix);
  b.text(py_json_dumps(rf));
}

// encode_arguments_to_dsml() + tool_call_template + tool_calls_template.
void render_tool_calls(Builder& b, const std::vector<ToolCallIn>& calls) {
  b.text("\n\n");
  b.templ(fmtc::kToolCallsOpen);
  b.text("\n");
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto& c = calls[i];
    if (i) b.text("\n");
    b.templ(fmtc::kInvokeOpen);
    b.text(c.name);
    b.text("\">\n");
    OrderedJson args;
    if (c.args_object) {
      args = *c.args_object;
    } else {
      args = OrderedJson::object();
      args["arguments"] = c.args_raw;
    }
    bool first = true;
    for (auto it = args.begin(); it != args.end(); ++it) {
      if (!first) b.text("\n");
      first = false;
      const bool is_str = it.value().is_string();
      b.templ(fmtc::kParamOpen);
      b.text(it.key());
      b.text(is_str ? "\" string=\"true\">" : "\" string=\"false\">");
      b.text(is_str ? it.value().get_ref<const std::string&>() : py_json_dumps(it.value()));
      b.templ(fmtc::kParamClose);
    }
    b.text("\n");
    b.templ(fmtc::kInvokeClose);
  }
  b.text("\n");
  b.templ(fmtc::kToolCallsClose);
}

std::string_view task_token(const std::string& task) {
  for (const auto& t : fmtc::kTaskTokens)
    if (t.task == task) return t.token;
  return {};
}

// render_message() for msgs[idx].
void render_message(Builder& b, size_t idx, const std::vector<Msg>& msgs, bool thinking, bool drop_thinking,
                    bool effort_max) {
  const Msg& m = msgs[idx];
  const int last_user = find_last_user_index(msgs);
  if (idx == 0 && thinking && effort_max) b.text(fmtc::kReasoningEffortMax);

  if (m.role == "system") {
    b.text(m.content.value_or(""));
    if (!m.tools.empty()) render_tools(b, m.tools);
    if (!m.response_format.is_null()) render_response_format(b, m.response_format);
  } else if (m.role == "developer") {
    b.control(fmtc::kUser);
    b.text(m.content.value_or(""));
    if (!m.tools.empty()) render_tools(b, m.tools);
    if (!m.response_format.is_null()) render_response_format(b, m.response_format);
  } else if (m.role == "user") {
    b.control(fmtc::kUser);
    if (m.has_blocks && !m.blocks.empty()) {
      for (size_t i = 0; i < m.blocks.size(); ++i) {
        if (i) b.text("\n\n");
        const Block& blk = m.blocks[i];
        if (blk.tool_result) {
          b.text("<tool_result>");
          b.text(blk.text);
          b.text("</tool_result>");
        } else {
          b.text(blk.text);
        }
      }
    } else {
      b.text(m.content.value_or(""));
    }
  } else if (m.role == "latest_reminder") {
    b.control(fmtc::kLatestReminder);
    b.text(m.content.value_or(""));
  } else if (m.role == "assistant") {
    const bool prev_has_task = idx > 0 && msgs[idx - 1].task.has_value();
    if (thinking && !prev_has_task && (!drop_thinking || static_cast<int>(idx) > last_user)) {
      b.text(m.reasoning.value_or(""));
      b.control(fmtc::kThinkEnd);
    }
    b.text(m.content.value_or(""));
    if (!m.tool_calls.empty()) render_tool_calls(b, m.tool_calls);
    if (!m.wo_eos) b.control(fmtc::kEos);
  }

  // Transition tokens: only when the next message is an assistant / latest_reminder turn, or at the end.
  if (idx + 1 < msgs.size() && msgs[idx + 1].role != "assistant" && msgs[idx + 1].role != "latest_reminder") return;
  if (m.task) {
    if (*m.task != "action") {
      b.control(task_token(*m.task));
    } else {
      b.control(fmtc::kAssistant);
      b.control(thinking ? fmtc::kThinkStart : fmtc::kThinkEnd);
      b.control(task_token(*m.task));
    }
  } else if (m.role == "user" || m.role == "developer") {
    b.control(fmtc::kAssistant);
    if (thinking && (!drop_thinking || static_cast<int>(idx) >= last_user))
      b.control(fmtc::kThinkStart);
    else
      b.control(fmtc::kThinkEnd);
  }
}

std::optional<bool> read_bool(const OrderedJson& obj, const char* key, const std::string& where) {
  const OrderedJson* v = field(obj, key);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_boolean()) fail("{}.{}: expected a boolean", where, key);
  return v->get<bool>();
}

}  // namespace

std::string ChatPrompt::text() const {
  std::string out;
  for (const auto& p : pieces) out += p.text;
  return out;
}

OrderedJson parse_chat_request(std::string_view body) {
  if (json_nesting_exceeds(body, kMaxJsonRequestDepth))
    fail("request: invalid JSON: nested deeper than {} levels", kMaxJsonRequestDepth);
  try {
    return OrderedJson::parse(body);
  } catch (const nlohmann::json::exception& e) {
    fail("request: invalid JSON: {}", e.what());
  }
}

ChatPrompt render_chat(const OrderedJson& request) {
  if (!request.is_object()) fail("request: expected a JSON object");
  const OrderedJson* msgs_json = field(request, "messages");
  if (!msgs_json || !msgs_json->is_array()) fail("messages: required array");
  if (msgs_json->empty()) fail("messages: must not be empty");

  // Thinking mode and effort.
  static const OrderedJson kEmpty = OrderedJson::object();
  const OrderedJson* kw = field(request, "chat_template_kwargs");
  if (kw && !kw->is_null() && !kw->is_object()) fail("chat_template_kwargs: expected an object");
  const OrderedJson& kwargs = kw && kw->is_object() ? *kw : kEmpty;
  bool thinking = true;
  if (const OrderedJson* th = field(request, "thinking"); th && !th->is_null()) {
    if (th->is_boolean()) {
      thinking = th->get<bool>();
    } else {
      if (!th->is_object()) fail("thinking: expected {{\"type\": \"enabled\"|\"disabled\"}}");
      const std::string type = opt_string(*th, "type", "thinking");
      if (type != "enabled" && type != "disabled")
        fail("thinking.type: expected \"enabled\" or \"disabled\", got \"{}\"", type);
      thinking = type == "enabled";
    }
  } else if (auto t = read_bool(kwargs, "thinking", "chat_template_kwargs")) {
    thinking = *t;
  } else if (auto e = read_bool(kwargs, "enable_thinking", "chat_template_kwargs")) {
    thinking = *e;
  }
  std::string effort = opt_string(request, "reasoning_effort", "");
  if (effort.empty()) effort = opt_string(kwargs, "reasoning_effort", "chat_template_kwargs");
  const bool effort_max = effort == "max" || effort == "xhigh";
  const bool drop_thinking = read_bool(kwargs, "drop_thinking", "chat_template_kwargs").value_or(true);

  std::vector<Msg> msgs;
  msgs.reserve(msgs_json->size() + 1);
  for (size_t i = 0; i < msgs_json->size(); ++i) msgs.push_back(read_message((*msgs_json)[i], i));

  // Top-level tools / response_format go to the first system message (inserted when there is none).
  OrderedJson top_tools = OrderedJson::array();
  if (const OrderedJson* t = field(request, "tools")) append_tools(top_tools, *t, "tools");
  OrderedJson top_rf;
  if (const OrderedJson* rf = field(request, "response_format"); rf && !rf->is_null()) {
    if (!rf->is_object()) fail("response_format: expected an object");
    if (rf->value("type", "") != "text") top_rf = *rf;
  }
  if (!top_tools.empty() || !top_rf.is_null()) {
    auto sys = std::find_if(msgs.begin(), msgs.end(), [](const Msg& m) { return m.role == "system"; });
    if (sys == msgs.end()) {
      Msg s;
      s.role = "system";
      s.content = "";
      sys = msgs.insert(msgs.begin(), std::move(s));
    }
    for (const auto& t : top_tools) sys->tools.push_back(t);
    if (!top_rf.is_null()) sys->response_format = top_rf;
  }

  msgs = merge_tool_messages(std::move(msgs));
  sort_tool_results(msgs);
  bool effective_drop = drop_thinking;
  if (std::any_of(msgs.begin(), msgs.end(), [](const Msg& m) { return !m.tools.empty(); })) effective_drop = false;
  if (thinking && effective_drop) msgs = drop_thinking_messages(std::move(msgs));

  Builder b;
  b.control(fmtc::kBos);
  for (size_t i = 0; i < msgs.size(); ++i) render_message(b, i, msgs, thinking, effective_drop, effort_max);
  ChatPrompt out;
  out.pieces = b.take();
  out.thinking = thinking;
  out.reasoning_effort_max = thinking && effort_max;
  return out;
}

std::vector<int32_t> tokenize_prompt(const Tokenizer& tok, const ChatPrompt& prompt) {
  std::vector<int32_t> ids;
  std::string pending;
  const auto flush = [&] {
    if (pending.empty()) return;
    const auto part = tok.encode(pending, /*parse_special=*/false);
    ids.insert(ids.end(), part.begin(), part.end());
    pending.clear();
  };
  for (const auto& p : prompt.pieces) {
    if (!p.control) {
      pending += p.text;
      continue;
    }
    flush();
    const auto id = tok.token_id(p.text);
    if (!id) fail("tokenizer has no special token '{}' required by the chat format", p.text);
    ids.push_back(*id);
  }
  flush();
  return ids;
}

}  // namespace dsv4
