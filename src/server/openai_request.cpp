#include "server/openai_request.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <random>
#include <set>

#include "chat/chat_encoding.h"
#include "chat/tool_name.h"
#include "core/json_depth.h"
#include "server/api_error.h"
#include "server/json_schema_grammar.h"
#include "server/request_fields.h"

namespace dsv4 {

namespace {

using J = OrderedJson;
using namespace reqf;

constexpr int kMaxTopLogprobs = 20;

// response_format.json_schema.name: a tool name without dots (chat/tool_name.h).
bool schema_name_ok(const std::string& s) { return valid_tool_name(s) && s.find('.') == std::string::npos; }

// Fields shared by both endpoints: stream, sampling, stop, max_tokens, n.
void parse_common(const J& body, ApiRequest& r, int64_t n_ctx, const char* prompt_param) {
  if (const J* m = field(body, "model"); m && !m->is_string()) bad_request("model", "'model' must be a string");
  r.stream = boolean(body, "stream").value_or(false);
  if (const J* so = field(body, "stream_options")) {
    if (!so->is_object()) bad_request("stream_options", "'stream_options' must be an object");
    r.include_usage = boolean(*so, "include_usage", "stream_options").value_or(false);
  }
  if (auto n = integer(body, "n")) {
    if (*n < 1 || *n > kMaxChoices) bad_request("n", fmt::format("'n' must be in [1, {}], got {}", kMaxChoices, *n));
    r.n = static_cast<int>(*n);
  }
  r.gen.ignore_eos = boolean(body, "ignore_eos").value_or(false);
  if (const J* lb = field(body, "logit_bias"); lb && !(lb->is_object() && lb->empty()))
    unsupported("logit_bias", "logit_bias");

  auto& s = r.gen.sampling;
  s.temperature = static_cast<float>(number(body, "temperature", 0, 2).value_or(1.0));
  s.top_p = static_cast<float>(number(body, "top_p", 0, 1, true).value_or(1.0));
  s.min_p = static_cast<float>(number(body, "min_p", 0, 1).value_or(0.0));
  s.presence_penalty = static_cast<float>(number(body, "presence_penalty", -2, 2).value_or(0.0));
  s.frequency_penalty = static_cast<float>(number(body, "frequency_penalty", -2, 2).value_or(0.0));
  s.repetition_penalty = static_cast<float>(number(body, "repetition_penalty", 0, 10, true).value_or(1.0));
  if (auto k = integer(body, "top_k")) {
    if (*k < -1) bad_request("top_k", fmt::format("'top_k' must be >= -1 (0 or -1: off), got {}", *k));
    s.top_k = static_cast<int32_t>(std::min<int64_t>(*k, 1 << 30));
  }
  if (const J* sd = field(body, "seed"); sd && sd->is_number_unsigned()) {
    s.seed = sd->get<uint64_t>();  // the whole of [0, 2^64), like the CLI's --seed
  } else if (auto seed = integer(body, "seed")) {
    if (*seed < 0) bad_request("seed", fmt::format("'seed' must be >= 0, got {}", *seed));
    s.seed = static_cast<uint64_t>(*seed);
  } else {
    s.seed = std::random_device{}();
  }

  if (const J* st = field(body, "stop")) {
    std::vector<std::string> stops;
    if (st->is_string()) {
      stops.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (st->size() > 16) bad_request("stop", "'stop' may hold at most 16 strings");
      for (const auto& x : *st) {
        if (!x.is_string()) bad_request("stop", "'stop' must be a string or an array of strings");
        stops.push_back(x.get<std::string>());
      }
    } else {
      bad_request("stop", "'stop' must be a string or an array of strings");
    }
    for (const auto& x : stops)
      if (x.empty()) bad_request("stop", "stop strings must not be empty");
    r.gen.stop = std::move(stops);
  }

  const int64_t n_prompt = static_cast<int64_t>(r.gen.prompt.size());
  if (n_prompt >= n_ctx)
    bad_request(prompt_param,
                fmt::format("the prompt has {} tokens, the context size is {} (it must leave room for at least one "
                            "generated token)",
                            n_prompt, n_ctx),
                "context_length_exceeded");
  const char* mt_key = field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (auto mt = integer(body, mt_key)) {
    if (*mt < 1) bad_request(mt_key, fmt::format("'{}' must be at least 1, got {}", mt_key, *mt));
    if (n_prompt + *mt > n_ctx)
      bad_request(
          mt_key,
          fmt::format("the prompt ({} tokens) plus {} = {} exceeds the context size {}", n_prompt, mt_key, *mt, n_ctx),
          "context_length_exceeded");
    r.gen.max_tokens = *mt;
  } else {
    r.gen.max_tokens = n_ctx - n_prompt;
  }
}

// Message fields the renderer is lenient about but an API client must get right.
void validate_messages(const J& msgs) {
  for (size_t i = 0; i < msgs.size(); ++i) {
    const J& m = msgs[i];
    if (!m.is_object()) continue;  // the renderer reports it
    const std::string where = fmt::format("messages[{}]", i);
    const J* role = field(m, "role");
    if (!role || !role->is_string()) continue;
    const J* tcs = field(m, "tool_calls");
    // content (absent or null): required for user, system and tool messages; an assistant message may leave it out
    // only when it carries tool calls (the OpenAI rules).
    if (!field(m, "content") && (*role == "user" || *role == "system" || *role == "tool" || *role == "assistant")) {
      const bool has_calls = *role == "assistant" && tcs && tcs->is_array() && !tcs->empty();
      if (!has_calls) {
        const bool is_null = m.contains("content");
        const std::string r = role->get<std::string>();
        bad_request(where + ".content",
                    *role == "assistant"
                        ? fmt::format("{}.content: {} for an assistant message without tool_calls", where,
                                      is_null ? "must not be null" : "is required")
                        : fmt::format("{}.content: {} for a {} message (a string or an array of text parts)", where,
                                      is_null ? "must not be null" : "is required", r));
      }
    }
    if (*role == "tool") {
      const J* id = field(m, "tool_call_id");
      if (!id || !id->is_string() || id->get<std::string>().empty())
        bad_request(where + ".tool_call_id", fmt::format("{}.tool_call_id: a tool message needs the id of the call it "
                                                         "answers (a non-empty string)",
                                                         where));
    }
    if (!tcs || !tcs->is_array()) continue;
    for (size_t j = 0; j < tcs->size(); ++j) {
      const J& tc = (*tcs)[j];
      const std::string w = fmt::format("{}.tool_calls[{}]", where, j);
      if (!tc.is_object()) bad_request(w, w + ": expected an object");
      const J* fn = field(tc, "function");
      if (!fn || !fn->is_object()) bad_request(w + ".function", w + ".function: required object");
      const J* name = field(*fn, "name");
      if (!name || !name->is_string() || name->get<std::string>().empty())
        bad_request(w + ".function.name", w + ".function.name: required non-empty string");
      const J* args = field(*fn, "arguments");
      const std::string ap = w + ".function.arguments";
      if (!args || !args->is_string()) bad_request(ap, ap + ": must be a string holding a JSON object");
      const std::string& text = args->get_ref<const std::string&>();
      if (json_nesting_exceeds(text, kMaxJsonRequestDepth))
        bad_request(ap, fmt::format("{}: nested deeper than {} levels", ap, kMaxJsonRequestDepth));
      J parsed = J::parse(text, nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object())
        bad_request(ap, ap + ": must be a string holding a JSON object");
    }
  }
}

struct ResponseFormat {
  enum Kind { kText, kJsonObject, kJsonSchema } kind = kText;
  J schema;  // the schema (json_schema / json_object with "schema")
  std::string schema_path;
};

ResponseFormat parse_response_format(const J& body) {
  ResponseFormat out;
  const J* rf = object(body, "response_format", {"type", "json_schema", "schema"});
  if (!rf) return out;
  const auto type = string(*rf, "type", "response_format");
  if (!type) bad_request("response_format.type", "'response_format.type' is required");
  if (*type == "text") {
    if (rf->contains("json_schema") || rf->contains("schema"))
      bad_request("response_format", "a 'text' response_format takes no schema");
    return out;
  }
  if (*type == "json_object") {
    if (rf->contains("json_schema"))
      bad_request("response_format.json_schema", "'json_schema' needs type 'json_schema'");
    out.kind = ResponseFormat::kJsonObject;
    out.schema = {{"type", "object"}};
    out.schema_path = "response_format";
    if (const J* s = field(*rf, "schema")) {  // llama.cpp's extension
      out.schema = *s;
      out.schema_path = "response_format.schema";
    }
    return out;
  }
  if (*type != "json_schema")
    bad_request("response_format.type",
                fmt::format("'response_format.type' must be 'text', 'json_object' or 'json_schema', got '{}'", *type));
  if (rf->contains("schema"))
    bad_request("response_format.schema", "put the schema in 'response_format.json_schema.schema'");
  const J* js = object(*rf, "json_schema", {"name", "description", "schema", "strict"}, "response_format");
  if (!js)
    bad_request("response_format.json_schema", "'response_format.json_schema' is required for type 'json_schema'");
  const auto name = string(*js, "name", "response_format.json_schema");
  if (!name || !schema_name_ok(*name))
    bad_request("response_format.json_schema.name",
                "'response_format.json_schema.name' is required: 1 to 64 letters, digits, '_' or '-'");
  string(*js, "description", "response_format.json_schema");
  boolean(*js, "strict", "response_format.json_schema");
  out.kind = ResponseFormat::kJsonSchema;
  out.schema = js->contains("schema") && !(*js)["schema"].is_null() ? (*js)["schema"] : J::object();
  out.schema_path = "response_format.json_schema.schema";
  return out;
}

}  // namespace

std::vector<ToolSpec> parse_tools(const J& tools, const std::string& path) {
  if (!tools.is_array()) bad_request(path, fmt::format("'{}' must be an array", path));
  std::vector<ToolSpec> out;
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string w = fmt::format("{}[{}]", path, i);
    const J& t = tools[i];
    if (!t.is_object()) bad_request(w, w + ": expected an object");
    if (const J* ty = field(t, "type"); ty && *ty != "function")
      bad_request(w + ".type", fmt::format("{}.type: only 'function' tools are supported", w));
    const J* fn = field(t, "function");
    if (!fn || !fn->is_object()) bad_request(w + ".function", w + ".function: required object");
    const std::string fw = w + ".function";
    const auto name = string(*fn, "name", fw);
    if (!name || !valid_tool_name(*name))
      bad_request(fw + ".name", fmt::format("{}.name: required, {}", fw, kToolNameRule));
    if (!names.insert(*name).second)
      bad_request(fw + ".name", fmt::format("{}.name: '{}' is defined twice", fw, *name));
    string(*fn, "description", fw);
    boolean(*fn, "strict", fw);
    ToolSpec spec{*name, nullptr, fw};
    if (const J* p = field(*fn, "parameters")) {
      const std::string pw = fw + ".parameters";
      if (!p->is_object()) bad_request(pw, pw + ": must be a JSON Schema object");
      if (const J* ty = field(*p, "type"); ty && *ty != "object")
        bad_request(pw + ".type", pw + ".type: the parameters schema must have type 'object'");
      if (const J* props = field(*p, "properties")) {
        if (!props->is_object()) bad_request(pw + ".properties", pw + ".properties: must be an object of schemas");
        for (auto it = props->begin(); it != props->end(); ++it)
          if (!it.value().is_object() && !it.value().is_boolean())
            bad_request(pw + ".properties." + it.key(), pw + ".properties." + it.key() + ": must be a schema");
      }
      if (const J* req = field(*p, "required")) {
        if (!req->is_array()) bad_request(pw + ".required", pw + ".required: must be an array of strings");
        for (const auto& x : *req)
          if (!x.is_string()) bad_request(pw + ".required", pw + ".required: must be an array of strings");
      }
      spec.parameters = *p;
    }
    out.push_back(std::move(spec));
  }
  return out;
}

ApiRequest chat_request_from_json(J body, const Tokenizer& tok, int64_t n_ctx) {
  ApiRequest r;
  r.chat = true;
  const J* msgs = field(body, "messages");
  if (!msgs) bad_request("messages", "'messages' is required");
  if (!msgs->is_array()) bad_request("messages", "'messages' must be an array");
  if (msgs->empty()) bad_request("messages", "'messages' must not be empty");
  validate_messages(*msgs);

  // Log-probabilities.
  const bool lp = boolean(body, "logprobs").value_or(false);
  if (auto tl = integer(body, "top_logprobs")) {
    if (*tl < 0 || *tl > kMaxTopLogprobs)
      bad_request("top_logprobs", fmt::format("'top_logprobs' must be in [0, {}], got {}", kMaxTopLogprobs, *tl));
    if (!lp) bad_request("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.gen.top_logprobs = static_cast<int>(*tl);
  } else if (lp) {
    r.gen.top_logprobs = 0;
  }
  r.logprobs = lp;

  // Thinking and its budget.
  if (const J* th = field(body, "thinking"); th && th->is_object()) {
    object(body, "thinking", {"type", "budget_tokens"});
    if (auto b = integer(*th, "budget_tokens", "thinking")) {
      if (*b < 1)
        bad_request("thinking.budget_tokens", fmt::format("'thinking.budget_tokens' must be >= 1, got {}", *b));
      r.reasoning_budget = *b;
    }
  }
  if (auto eff = string(body, "reasoning_effort")) {
    static const std::set<std::string> kEfforts = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};
    if (!kEfforts.count(*eff))
      bad_request("reasoning_effort", fmt::format("'reasoning_effort' must be one of none, minimal, low, medium, high, "
                                                  "xhigh, max; got '{}'",
                                                  *eff));
  }

  // Structured output and tools.
  const ResponseFormat rf = parse_response_format(body);
  std::vector<ToolSpec> tools;
  if (const J* t = field(body, "tools")) tools = parse_tools(*t);
  ToolGrammarOptions topt;
  bool tools_constrained = false;
  std::string choice = "auto";
  if (const J* tc = field(body, "tool_choice")) {
    if (tc->is_string()) {
      choice = tc->get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required")
        bad_request("tool_choice",
                    fmt::format("'tool_choice' must be 'none', 'auto', 'required' or a function, got '{}'", choice));
    } else if (tc->is_object()) {
      object(body, "tool_choice", {"type", "function"});
      const auto type = string(*tc, "type", "tool_choice");
      if (type != "function") bad_request("tool_choice.type", "'tool_choice.type' must be 'function'");
      const J* fn = object(*tc, "function", {"name"}, "tool_choice");
      const auto name = fn ? string(*fn, "name", "tool_choice.function") : std::nullopt;
      if (!name) bad_request("tool_choice.function.name", "'tool_choice.function.name' is required");
      if (std::none_of(tools.begin(), tools.end(), [&](const ToolSpec& s) { return s.name == *name; }))
        bad_request("tool_choice.function.name", fmt::format("'tool_choice.function.name': no tool named '{}'", *name));
      choice = "named";
      topt.name = *name;
    } else {
      bad_request("tool_choice", "'tool_choice' must be a string or an object");
    }
  }
  topt.parallel = boolean(body, "parallel_tool_calls").value_or(true);
  if ((choice == "required" || choice == "named") && tools.empty())
    bad_request("tool_choice", "'tool_choice' requires a function but no 'tools' are given");
  if (choice == "none") {
    body.erase("tools");
    tools.clear();
  }
  if (!tools.empty()) {
    topt.mode = choice == "required" ? ToolMode::kRequired : choice == "named" ? ToolMode::kNamed : ToolMode::kAuto;
    if (topt.mode == ToolMode::kAuto && rf.kind != ResponseFormat::kText) {
      topt.json_answer = &rf.schema;
      topt.json_answer_path = rf.schema_path;
    }
    // Always compiled: it validates every tool schema (a bad $ref is a 400 even when nothing is constrained).
    auto g = std::make_shared<Grammar>(tool_call_grammar(tools, topt));
    tools_constrained = topt.mode != ToolMode::kAuto || !topt.parallel || topt.json_answer;
    if (tools_constrained) r.grammar = std::move(g);
  }
  if (!tools_constrained && rf.kind != ResponseFormat::kText)
    r.grammar = std::make_shared<Grammar>(json_schema_grammar(rf.schema, rf.schema_path));
  if (r.grammar) {
    J key = {{"response_format", body.contains("response_format") ? body["response_format"] : J()},
             {"tools", tools_constrained ? body["tools"] : J()},
             {"tool_choice", choice},
             {"name", topt.name},
             {"parallel", topt.parallel}};
    r.grammar_key = key.dump();
  }

  ChatPrompt prompt;
  try {
    prompt = render_chat(body);
    r.gen.prompt = tokenize_prompt(tok, prompt);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    std::string msg = e.what();
    std::string param = "messages";
    if (auto colon = msg.find(':'); colon != std::string::npos && colon < 80 && msg.find(' ') > colon)
      param = msg.substr(0, colon);
    bad_request(param, msg);
  }
  r.thinking = prompt.thinking;
  parse_common(body, r, n_ctx, "messages");
  return r;
}

ApiRequest parse_chat_completion_request(std::string_view body_text, const Tokenizer& tok, int64_t n_ctx) {
  return chat_request_from_json(parse_object_body(body_text), tok, n_ctx);
}

ApiRequest parse_completion_request(std::string_view body_text, const Tokenizer& tok, int64_t n_ctx, int32_t bos_id) {
  J body = parse_object_body(body_text);
  ApiRequest r;
  r.chat = false;
  const J* p = field(body, "prompt");
  if (!p) bad_request("prompt", "'prompt' is required");
  // A one-element list of prompts is the same as the prompt itself.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    std::string text = p->get<std::string>();
    if (text.empty()) bad_request("prompt", "'prompt' must not be empty");
    r.gen.prompt = tok.encode(text, true);
    if (r.gen.prompt.empty() || r.gen.prompt.front() != bos_id) r.gen.prompt.insert(r.gen.prompt.begin(), bos_id);
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    for (const auto& x : *p) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok.n_vocab())
        bad_request("prompt", fmt::format("prompt token ids must be integers in [0, {})", tok.n_vocab()));
      r.gen.prompt.push_back(x.get<int32_t>());
    }
  } else if (p->is_array() && p->size() > 1) {
    unsupported("prompt", "more than one prompt per request");
  } else {
    bad_request("prompt", "'prompt' must be a non-empty string or an array of token ids");
  }
  if (auto echo = boolean(body, "echo"); echo && *echo) unsupported("echo", "echo");
  if (auto bo = integer(body, "best_of"); bo && *bo != 1) unsupported("best_of", "best_of > 1");
  if (auto lp = integer(body, "logprobs")) {
    if (*lp < 0 || *lp > kMaxTopLogprobs)
      bad_request("logprobs", fmt::format("'logprobs' must be in [0, {}], got {}", kMaxTopLogprobs, *lp));
    r.logprobs = true;
    r.gen.top_logprobs = static_cast<int>(*lp);
  }
  if (const J* sf = field(body, "suffix"); sf && !(sf->is_string() && sf->get<std::string>().empty()))
    unsupported("suffix", "suffix");
  parse_common(body, r, n_ctx, "prompt");
  return r;
}

}  // namespace dsv4
