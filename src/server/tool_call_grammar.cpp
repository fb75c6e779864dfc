#include "server/tool_call_grammar.h"

#include <set>

#include "chat/dsv4_format.h"
#include "core/error.h"
#include "server/api_error.h"
#include "server/json_schema_grammar.h"

namespace dsv4 {

namespace {

using J = nlohmann::ordered_json;
using Seq = GrammarBuilder::Seq;
namespace f = chatfmt;

// A string parameter written raw (string="true"): type string and no bounds.
bool raw_string_param(const J& s) {
  if (!s.is_object()) return false;
  if (!s.contains("type") || s["type"] != "string") return false;
  return !s.contains("minLength") && !s.contains("maxLength") && !s.contains("enum") && !s.contains("const");
}

// A string enum written raw: every value a string.
bool raw_enum_param(const J& s) {
  if (!s.is_object() || !s.contains("enum") || !s["enum"].is_array() || s["enum"].empty()) return false;
  for (const auto& v : s["enum"])
    if (!v.is_string() || v.get<std::string>().find(f::kParamClose) != std::string::npos) return false;
  return true;
}

int32_t invoke_rule(GrammarBuilder& b, const ToolSpec& t, int32_t raw_text) {
  const J& params = t.parameters;
  JsonSchemaGrammar js(b, params, t.path + ".parameters", /*lenient=*/true);
  auto param_open = [&](const std::string& name, bool is_string) {
    return GrammarBuilder::cat(b.lit(f::kParamOpen), b.lit(name),
                               b.lit(is_string ? "\" string=\"true\">" : "\" string=\"false\">"));
  };
  const int32_t inv = b.rule("invoke");
  const Seq head = GrammarBuilder::cat(b.lit(f::kInvokeOpen), b.lit(t.name), b.lit("\">\n"));
  const Seq tail = GrammarBuilder::cat(b.lit("\n"), b.lit(f::kInvokeClose));

  std::vector<std::pair<std::string, const J*>> props;
  std::set<std::string> required;
  if (params.is_object()) {
    if (params.contains("properties") && params["properties"].is_object())
      for (auto it = params["properties"].begin(); it != params["properties"].end(); ++it)
        props.emplace_back(it.key(), &it.value());
    if (params.contains("required") && params["required"].is_array())
      for (const auto& r : params["required"])
        if (r.is_string()) required.insert(r.get<std::string>());
  }
  static const J kAny = J::object();
  for (const auto& name : required)
    if (std::none_of(props.begin(), props.end(), [&](const auto& p) { return p.first == name; }))
      props.emplace_back(name, &kAny);

  if (props.empty()) {
    // Free-form parameters: any names, raw or JSON values.
    ByteSet name_ascii;
    name_ascii.add_range(0x20, 0x7F);
    name_ascii.remove('"');
    const auto name = b.repeat({b.utf8_char(name_ascii)}, 1, 64);
    const Seq raw = GrammarBuilder::cat(b.lit(f::kParamOpen), name, b.lit("\" string=\"true\">"),
                                        GrammarBuilder::ref(raw_text), b.lit(f::kParamClose));
    const Seq jsn = GrammarBuilder::cat(b.lit(f::kParamOpen), name, b.lit("\" string=\"false\">"),
                                        GrammarBuilder::ref(js.any_value()), b.lit(f::kParamClose));
    const auto param = b.choice({raw, jsn}, "param");
    // No schema: a function without parameters; a schema without properties: any unless additionalProperties false.
    const bool forbid_params = !params.is_object() || (params.contains("additionalProperties") &&
                                                       params["additionalProperties"].is_boolean() &&
                                                       !params["additionalProperties"].get<bool>());
    if (forbid_params) {
      b.add(inv, GrammarBuilder::cat(head, tail));
    } else {
      const auto more = b.star({b.byte('\n'), param});
      b.add(inv, GrammarBuilder::cat(head, b.opt({param, more}), tail));
    }
    return inv;
  }
  // Same member structure as JSON objects (json_schema_grammar.cpp): R_i rest after one, F_i first at i or later.
  const size_t n = props.size();
  std::vector<Seq> kv(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& k = props[i].first;
    const J& s = *props[i].second;
    const std::string where = t.path + ".parameters.properties." + k;
    if (k.find('"') != std::string::npos || k.find('\n') != std::string::npos)
      bad_request(where, fmt::format("{}: parameter names with '\"' or newlines cannot be written as DSML", where));
    if (raw_string_param(s)) {
      kv[i] = GrammarBuilder::cat(param_open(k, true), GrammarBuilder::ref(raw_text), b.lit(f::kParamClose));
    } else if (raw_enum_param(s)) {
      std::vector<Seq> vals;
      for (const auto& v : s["enum"]) vals.push_back(b.lit(v.get<std::string>()));
      kv[i] = GrammarBuilder::cat(param_open(k, true), b.choice(std::move(vals), "enum"), b.lit(f::kParamClose));
    } else {
      kv[i] = GrammarBuilder::cat(param_open(k, false), GrammarBuilder::ref(js.value(s, where)), b.lit(f::kParamClose));
    }
  }
  std::vector<int32_t> R(n + 1), F(n + 1, -1);
  R[n] = b.rule("params_rest");
  b.add(R[n], {});
  for (size_t i = n; i-- > 0;) {
    const bool req = required.count(props[i].first) > 0;
    R[i] = b.rule("params_rest");
    b.add(R[i], GrammarBuilder::cat(b.byte('\n'), kv[i], GrammarBuilder::ref(R[i + 1])));
    if (!req) b.add(R[i], {GrammarBuilder::ref(R[i + 1])});
    F[i] = b.rule("params");
    b.add(F[i], GrammarBuilder::cat(kv[i], GrammarBuilder::ref(R[i + 1])));
    if (!req) {
      if (F[i + 1] >= 0)
        b.add(F[i], {GrammarBuilder::ref(F[i + 1])});
      else
        b.add(F[i], {});
    }
  }
  b.add(inv, GrammarBuilder::cat(head, GrammarBuilder::ref(F[0]), tail));
  return inv;
}

}  // namespace

Grammar tool_call_grammar(const std::vector<ToolSpec>& tools, const ToolGrammarOptions& opts) {
  GrammarBuilder b;
  const int32_t raw_text = b.utf8_text_without(f::kParamClose).id;
  const int32_t any_invoke = b.rule("invokes");
  int n = 0;
  for (const auto& t : tools) {
    if (opts.mode == ToolMode::kNamed && t.name != opts.name) continue;
    b.add(any_invoke, {GrammarBuilder::ref(invoke_rule(b, t, raw_text))});
    ++n;
  }
  if (n == 0) fail("tool_call_grammar: no tool to call");
  const auto I = GrammarBuilder::ref(any_invoke);
  Seq calls{I};
  if (opts.parallel) calls.push_back(b.star({b.byte('\n'), I}));
  const int32_t block = b.rule("tool_calls");
  b.add(block, GrammarBuilder::cat(b.opt(b.lit("\n\n")), b.lit(f::kToolCallsOpen), b.byte('\n'), calls, b.byte('\n'),
                                   b.lit(f::kToolCallsClose)));
  int32_t root = block;
  if (opts.mode == ToolMode::kAuto) {
    root = b.rule("answer");
    if (opts.json_answer) {
      JsonSchemaGrammar js(b, *opts.json_answer, opts.json_answer_path, /*lenient=*/false);
      const auto W = GrammarBuilder::ref(js.ws());
      b.add(root, {W, GrammarBuilder::ref(js.root_value()), W});
      b.add(root, {GrammarBuilder::ref(block)});
    } else {
      const auto text = b.utf8_text_without(f::kDsml);
      b.add(root, {text, b.opt({GrammarBuilder::ref(block)})});
    }
  }
  try {
    return b.build(root);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    bad_request("tools", fmt::format("tools: the tool schemas cannot be turned into a grammar ({})", e.what()));
  }
}

}  // namespace dsv4
