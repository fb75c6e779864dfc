// JSON Schema -> grammar: accepted / rejected documents per keyword, integer and number ranges, errors naming the
// keyword, and a property test: random sentences of the grammars of random schemas are JSON that validates.
#include <gtest/gtest.h>

#include <random>

#include "common/grammar_walk.h"
#include "common/json_validator.h"
#include "server/api_error.h"
#include "server/json_schema_grammar.h"

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

struct Doc {
  explicit Doc(const J& schema, bool lenient = false)
      : a(json_schema_grammar(schema, "schema", lenient), byte_vocab()) {}
  bool accepts(std::string_view s) {
    const int32_t st = a.step_bytes(a.start(), s);
    return st >= 0 && a.accepting(st);
  }
  GrammarAutomaton a;
};

std::string error_param(const J& schema, bool lenient = false) {
  try {
    json_schema_grammar(schema, "schema", lenient);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    return e.param();
  }
  return "(no error)";
}

}  // namespace

TEST(JsonSchemaGrammar, ObjectsRequiredOptionalAndOrder) {
  Doc d(J::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                     "c": {"type": "boolean"}}, "required": ["b"], "additionalProperties": false})"));
  for (const char* s : {R"({"b": "x"})", R"({"a": 1, "b": "x"})", R"({"b":"x","c":true})",
                        R"({"a":-3,"b":"","c":false})", R"( {"b" : "x" } )", "{\n  \"b\": \"x\"\n}"})
    EXPECT_TRUE(d.accepts(s)) << s;
  for (const char* s : {R"({})", R"({"a": 1})", R"({"b": 1})", R"({"c": true, "b": "x"})", R"({"b": "x", "d": 1})",
                        R"({"b": "x",})", R"({"b": "x"} x)", R"([])", R"(  {"b": "x"})"})
    EXPECT_FALSE(d.accepts(s)) << s;
}

TEST(JsonSchemaGrammar, StringsEscapesAndLengths) {
  Doc any(J::parse(R"({"type": "string"})"));
  for (const char* s : {R"("")", R"("a\"b\\c\/d\n\t\u00e9\uFFFF")", "\"中文 €\"", R"("\b\f\r")"})
    EXPECT_TRUE(any.accepts(s)) << s;
  for (const char* s : {"\"a\nb\"", R"("\x")", R"("\ud800")", R"("\uDFFF")", "\"\xC0\xAF\"", R"("abc)", "\"\x01\""})
    EXPECT_FALSE(any.accepts(s)) << s;
  // The chat-format marker character only as an escape: a string cannot spell <｜end▁of▁sentence｜> or <｜DSML｜.
  EXPECT_FALSE(any.accepts("\"<｜DSML｜tool_calls>\""));
  EXPECT_FALSE(any.accepts("\"<｜end▁of▁sentence｜>\""));
  EXPECT_TRUE(any.accepts(R"("<\uff5cDSML\uFF5C>")"));
  EXPECT_TRUE(any.accepts("\"\xEF\xBD\x9B\xEF\xBD\x9D\xEF\xBC\x9C\""));  // neighbours of U+FF5C are fine
  Doc len(J::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"));
  for (const char* s : {R"("ab")", R"("abc")", "\"中文\"", R"("\n\t")"}) EXPECT_TRUE(len.accepts(s)) << s;
  for (const char* s : {R"("a")", R"("abcd")", "\"中\""}) EXPECT_FALSE(len.accepts(s)) << s;
}

TEST(JsonSchemaGrammar, NumbersAndIntegerRanges) {
  Doc num(J::parse(R"({"type": "number"})"));
  for (const char* s : {"0", "-0", "12.5", "-3e10", "1E+5", "0.000001", "9999999999999999"})
    EXPECT_TRUE(num.accepts(s)) << s;
  for (const char* s : {"01", "1.", ".5", "+1", "1e", "--1", "99999999999999999", "1e123", "NaN"})
    EXPECT_FALSE(num.accepts(s)) << s;
  Doc integer(J::parse(R"({"type": "integer"})"));
  EXPECT_TRUE(integer.accepts("-42"));
  EXPECT_FALSE(integer.accepts("4.2"));
  struct R {
    J schema;
    double lo, hi;
  };
  for (const R& r : {R{J::parse(R"({"type": "integer", "minimum": -17, "maximum": 123})"), -17, 123},
                     R{J::parse(R"({"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 10})"), 6, 9},
                     R{J::parse(R"({"type": "integer", "minimum": 0})"), 0, 1e16},
                     R{J::parse(R"({"type": "integer", "maximum": -100})"), -1e16, -100},
                     R{J::parse(R"({"type": "integer", "minimum": 1.5, "maximum": 99.5})"), 2, 99},
                     R{J::parse(R"({"type": "integer", "minimum": 1000, "maximum": 1000})"), 1000, 1000}}) {
    Doc d(r.schema);
    for (int x = -250; x <= 1250; ++x)
      EXPECT_EQ(d.accepts(std::to_string(x)), x >= r.lo && x <= r.hi) << r.schema << " " << x;
  }
  Doc bounded(J::parse(R"({"type": "number", "minimum": -2.5, "maximum": 3})"));
  for (const char* s : {"-2", "-1.999", "0", "0.5", "2.75", "3", "-0.5"}) EXPECT_TRUE(bounded.accepts(s)) << s;
  for (const char* s : {"3.5", "-3", "4", "3.01", "1e2", "-2.9"}) EXPECT_FALSE(bounded.accepts(s)) << s;
  // The limitation the README states: only the span between the range's smallest and largest integers
  Doc inner(J::parse(R"({"type": "number", "minimum": 0.5, "maximum": 3.5})"));
  for (const char* s : {"1", "2.5", "3"}) EXPECT_TRUE(inner.accepts(s)) << s;
  for (const char* s : {"0.75", "3.25"}) EXPECT_FALSE(inner.accepts(s)) << s;
}

TEST(JsonSchemaGrammar, ArraysEnumsAnyOfRefsAndAny) {
  Doc arr(J::parse(R"({"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2})"));
  EXPECT_TRUE(arr.accepts("[true]"));
  EXPECT_TRUE(arr.accepts("[ true , false ]"));
  EXPECT_FALSE(arr.accepts("[]"));
  EXPECT_FALSE(arr.accepts("[true,true,true]"));
  Doc en(J::parse(R"({"enum": ["red", 3, null, {"k": [1]}]})"));
  for (const char* s : {R"("red")", "3", "null", R"({"k":[1]})"}) EXPECT_TRUE(en.accepts(s)) << s;
  EXPECT_FALSE(en.accepts(R"("blue")"));
  Doc any_of(J::parse(R"({"anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer"}]})"));
  EXPECT_TRUE(any_of.accepts(R"("a")"));
  EXPECT_TRUE(any_of.accepts("12"));
  EXPECT_FALSE(any_of.accepts(R"("ab")"));
  Doc nullable(J::parse(R"({"type": ["string", "null"]})"));
  EXPECT_TRUE(nullable.accepts("null"));
  EXPECT_TRUE(nullable.accepts(R"("x")"));
  // Recursive $ref: a tree of nodes.
  Doc tree(J::parse(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"], "additionalProperties": false}},
      "$ref": "#/$defs/node"})"));
  EXPECT_TRUE(tree.accepts(R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})"));
  EXPECT_FALSE(tree.accepts(R"({"v": 1, "kids": [{"w": 2}]})"));
  Doc any(J::parse("{}"));
  for (const char* s : {"1", R"({"a": [1, {"b": null}], "c": "d"})", "[[[]]]", "true"})
    EXPECT_TRUE(any.accepts(s)) << s;
  Doc free_map(J::parse(R"({"type": "object", "additionalProperties": {"type": "integer"}})"));
  EXPECT_TRUE(free_map.accepts(R"({"x": 1, "y": 2})"));
  EXPECT_FALSE(free_map.accepts(R"({"x": "1"})"));
}

TEST(JsonSchemaGrammar, BadSchemasNameTheKeyword) {
  EXPECT_EQ(error_param(J::parse(R"({"type": "string", "pattern": "^a$"})")), "schema.pattern");
  EXPECT_EQ(error_param(J::parse(R"({"properties": {"a": {"type": "string", "format": "email"}}})")),
            "schema.properties.a.format");
  EXPECT_EQ(error_param(J::parse(R"({"type": "objekt"})")), "schema.type");
  EXPECT_EQ(error_param(J::parse(R"({"properties": 3})")), "schema.properties");
  EXPECT_EQ(error_param(J::parse(R"({"type": "array", "items": {"$ref": "#/nope"}})")), "schema.items.$ref");
  EXPECT_EQ(error_param(J::parse(R"({"oneOf": [{"type": "string"}]})")), "schema.oneOf");
  EXPECT_EQ(error_param(J::parse(R"({"allOf": [{}, {}]})")), "schema.allOf");
  EXPECT_EQ(error_param(J::parse(R"({"type": "string", "minLength": 5, "maxLength": 2})")), "schema.maxLength");
  EXPECT_EQ(error_param(J::parse(R"({"type": "integer", "minimum": 5, "maximum": 4})")), "schema");
  EXPECT_EQ(error_param(J::parse(R"({"type": "number", "minimum": 0.2, "maximum": 0.4})")), "schema");
  EXPECT_EQ(error_param(J::parse(R"({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})")), "schema");
  EXPECT_EQ(error_param(J::parse("false")), "schema");
  EXPECT_EQ(error_param(J::parse("[1]")), "schema");
  EXPECT_EQ(error_param(J::parse(R"({"type": "object", "required": ["x"], "additionalProperties": false})")),
            "schema.required");
  EXPECT_EQ(error_param(J::parse(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})")), "schema");
  J deep = J::object();
  for (int i = 0; i < 100; ++i) deep = J{{"type", "array"}, {"items", deep}};
  EXPECT_EQ(error_param(deep).rfind("schema.items", 0), 0u);
  // Lenient mode (tool parameters) ignores what it cannot express.
  EXPECT_EQ(error_param(J::parse(R"({"type": "string", "pattern": "^a$", "format": "x"})"), true), "(no error)");
  EXPECT_EQ(error_param(J::parse(R"({"properties": 3})"), true), "schema.properties");
}

namespace {

// A random schema of the supported subset (the e2e property test has its own generator, validated with ajv).
J random_schema(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  const int kind = depth <= 0 ? pick(6) : pick(10);
  switch (kind) {
    case 0: {
      J s = {{"type", "string"}};
      if (pick(2)) s["maxLength"] = pick(8);
      if (pick(3) == 0) s["minLength"] = std::min<int>(pick(3), s.value("maxLength", 5));
      return s;
    }
    case 1: {
      J s = {{"type", "integer"}};
      if (pick(2)) s["minimum"] = pick(50) - 25;
      if (pick(2)) s["maximum"] = s.value("minimum", -25) + pick(1000);
      return s;
    }
    case 2: {
      J s = {{"type", "number"}};
      if (pick(3) == 0) {
        s["minimum"] = -1.5;
        s["exclusiveMaximum"] = 7;
      }
      return s;
    }
    case 3:
      return pick(2) ? J{{"type", "boolean"}} : J{{"type", "null"}};
    case 4:
      return J{{"enum", J::array({"alpha", "beta", 7, nullptr, J::array({1, 2})})}};
    case 5:
      return J{{"type", J::array({"string", "null"})}, {"maxLength", 4}};
    case 6:
    case 7: {
      J props = J::object();
      J req = J::array();
      const int n = 1 + pick(4);
      for (int i = 0; i < n; ++i) {
        const std::string k = std::string(1, static_cast<char>('a' + i)) + (pick(2) ? "_key" : "");
        props[k] = random_schema(rng, depth - 1);
        if (pick(2)) req.push_back(k);
      }
      J s = {{"type", "object"}, {"properties", props}, {"required", req}};
      if (pick(2)) s["additionalProperties"] = false;
      return s;
    }
    case 8: {
      J s = {{"type", "array"}, {"items", random_schema(rng, depth - 1)}};
      if (pick(2)) s["minItems"] = pick(2);
      if (pick(2)) s["maxItems"] = s.value("minItems", 0) + pick(3);
      return s;
    }
    default:
      return J{{"anyOf", J::array({random_schema(rng, depth - 1), random_schema(rng, depth - 1)})}};
  }
}

}  // namespace

TEST(JsonSchemaGrammar, PropertyRandomSentencesOfRandomSchemasValidate) {
  std::mt19937 rng(2024);
  int sentences = 0;
  for (int i = 0; i < 150; ++i) {
    const J schema = random_schema(rng, 3);
    Doc d(schema);
    test::JsonValidator v(schema);
    for (int k = 0; k < 6; ++k) {
      auto s = test::random_sentence(d.a, rng);
      if (!s) continue;
      ++sentences;
      const J doc = J::parse(*s, nullptr, false);
      ASSERT_FALSE(doc.is_discarded()) << schema.dump() << "\nnot JSON: " << *s;
      const std::string err = v.check(doc);
      ASSERT_TRUE(err.empty()) << schema.dump() << "\n" << *s << "\n" << err;
    }
  }
  EXPECT_GT(sentences, 600);
}

TEST(JsonSchemaGrammar, JsonObjectModeAcceptsObjectsOnly) {
  GrammarAutomaton a(json_object_grammar(), byte_vocab());
  auto ok = [&](std::string_view s) {
    const int32_t st = a.step_bytes(a.start(), s);
    return st >= 0 && a.accepting(st);
  };
  EXPECT_TRUE(ok(R"({"a": [1, 2.5, "x", {"b": null}], "c": true})"));
  EXPECT_TRUE(ok("{}"));
  EXPECT_FALSE(ok("[1]"));
  EXPECT_FALSE(ok("\"x\""));
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    auto s = test::random_sentence(a, rng);
    if (!s) continue;
    const J doc = J::parse(*s, nullptr, false);
    ASSERT_TRUE(doc.is_object()) << *s;
  }
}
