// DSML tool-call grammar: every sentence parses (chat/output_parser.h) into calls of the allowed tools whose
// arguments validate against the tool's parameter schema; modes required / named / auto, parallel on and off.
#include <gtest/gtest.h>

#include <random>

#include "chat/output_parser.h"
#include "common/grammar_walk.h"
#include "common/json_validator.h"
#include "server/api_error.h"
#include "server/tool_call_grammar.h"

using namespace dsv4;
using J = nlohmann::ordered_json;

namespace {

std::shared_ptr<const VocabTrie> byte_vocab() {
  static auto v = [] {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
    return std::make_shared<const VocabTrie>(t);
  }();
  return v;
}

std::vector<ToolSpec> tools() {
  return {{"get_weather", J::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
             "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
             "detail": {"type": "object", "properties": {"hourly": {"type": "boolean"}}, "additionalProperties": false}},
             "required": ["city"]})"),
           "tools[0].function"},
          {"add", J::parse(R"({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
             "required": ["a", "b"]})"),
           "tools[1].function"},
          {"ping", nullptr, "tools[2].function"},
          {"free", J::parse(R"({"type": "object"})"), "tools[3].function"}};
}

const J* params_of(const std::vector<ToolSpec>& ts, const std::string& name) {
  for (const auto& t : ts)
    if (t.name == name) return &t.parameters;
  return nullptr;
}

}  // namespace

TEST(ToolCallGrammar, SentencesParseIntoValidCalls) {
  const auto ts = tools();
  for (ToolMode mode : {ToolMode::kRequired, ToolMode::kNamed, ToolMode::kAuto}) {
    for (bool parallel : {true, false}) {
      ToolGrammarOptions o;
      o.mode = mode;
      o.name = "get_weather";
      o.parallel = parallel;
      GrammarAutomaton a(tool_call_grammar(ts, o), byte_vocab());
      std::mt19937 rng(11 + static_cast<int>(mode) * 2 + parallel);
      int with_calls = 0, total = 0;
      for (int i = 0; i < 80; ++i) {
        const std::string prefix = mode == ToolMode::kAuto && i % 2 ? "Sure.\n\n<｜DSML｜tool_calls>\n" : "";
        auto s = test::random_sentence(a, rng, 6000, prefix);
        if (!s) continue;
        ++total;
        const OutputParser p = OutputParser::parse(*s, /*thinking=*/false, "call_");
        const auto& calls = p.tool_calls();
        if (mode != ToolMode::kAuto) {
          ASSERT_FALSE(calls.empty()) << *s;
        }
        if (!parallel) {
          ASSERT_LE(calls.size(), 1u) << *s;
        }
        if (mode == ToolMode::kAuto && calls.empty()) {
          EXPECT_EQ(s->find("｜DSML｜"), std::string::npos) << *s;
          EXPECT_EQ(p.content(), *s);
          continue;
        }
        ++with_calls;
        if (mode != ToolMode::kAuto) {
          EXPECT_EQ(p.content(), "") << *s;
        }
        for (const auto& c : calls) {
          if (mode == ToolMode::kNamed) {
            EXPECT_EQ(c.name, "get_weather");
          }
          const J* params = params_of(ts, c.name);
          ASSERT_NE(params, nullptr) << c.name;
          const J args = J::parse(c.arguments, nullptr, false);
          ASSERT_TRUE(args.is_object()) << c.arguments;
          if (!params->is_null()) {
            const std::string err = test::JsonValidator(*params).check(args);
            EXPECT_TRUE(err.empty()) << *s << "\n" << c.arguments << "\n" << err;
          } else {
            EXPECT_TRUE(args.empty()) << c.arguments;
          }
        }
      }
      EXPECT_GT(total, 60);
      EXPECT_GT(with_calls, mode == ToolMode::kAuto ? 25 : 60);
    }
  }
}

TEST(ToolCallGrammar, CanonicalCallIsAccepted) {
  const auto ts = tools();
  ToolGrammarOptions o;
  GrammarAutomaton a(tool_call_grammar(ts, o), byte_vocab());
  const std::string call =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
      "string=\"true\">Paris </ b></｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3"
      "</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke "
      "name=\"ping\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const int32_t s = a.step_bytes(a.start(), call);
  ASSERT_GE(s, 0);
  EXPECT_TRUE(a.accepting(s));
  EXPECT_FALSE(a.can_continue(s));
  // Wrong: unknown tool, days out of range, missing required city, raw value holding the closing tag.
  for (const std::string& bad :
       {std::string("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"nope\">"),
        std::string("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter "
                    "name=\"days\" string=\"false\">15"),
        std::string("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter "
                    "name=\"days\""),
        std::string("Hello <｜DSML｜tool_calls>")})
    EXPECT_LT(a.step_bytes(a.start(), bad), 0) << bad;
}

TEST(ToolCallGrammar, JsonAnswerOrCall) {
  const auto ts = tools();
  const J schema =
      J::parse(R"({"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]})");
  ToolGrammarOptions o;
  o.mode = ToolMode::kAuto;
  o.json_answer = &schema;
  o.json_answer_path = "response_format";
  GrammarAutomaton a(tool_call_grammar(ts, o), byte_vocab());
  auto ok = [&](const std::string& s) {
    const int32_t st = a.step_bytes(a.start(), s);
    return st >= 0 && a.accepting(st);
  };
  EXPECT_TRUE(ok(R"({"answer": 42})"));
  EXPECT_FALSE(ok("free text"));
  EXPECT_TRUE(ok("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"ping\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"));
}

TEST(ToolCallGrammar, BadParameterNamesAreRejected) {
  std::vector<ToolSpec> ts = {
      {"f", J::parse(R"({"type": "object", "properties": {"a\"b": {"type": "string"}}})"), "tools[0].function"}};
  try {
    tool_call_grammar(ts, ToolGrammarOptions{});
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "tools[0].function.parameters.properties.a\"b");
  }
}
