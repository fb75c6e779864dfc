// JSON Schema -> Grammar (sampling/grammar.h) of JSON texts that validate against the schema: the grammar behind
// response_format json_schema / json_object and the typed arguments of DSML tool calls.
//
// Supported keywords (a schema may also be `true` or {}: any JSON value):
//   type          "object" | "array" | "string" | "number" | "integer" | "boolean" | "null", or an array of them;
//                 without `type`, the keywords present decide (properties -> object, items -> array, ...)
//   object        properties (emitted in schema order), required, additionalProperties (false, true or a schema).
//                 With `properties` only the listed properties are generated (valid whatever additionalProperties
//                 says); without, additionalProperties (default true) makes a map from any key to values of that
//                 schema. A required name missing from `properties` is generated with any value.
//   array         items, minItems, maxItems
//   string        minLength, maxLength (counted in code points, as JSON Schema does)
//   integer       minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, draft 6+ form)
//   number        the same bounds; a bounded number has no exponent and must have an integer in its range
//   any type      enum, const (values emitted in compact JSON), anyOf, allOf with one schema, nullable (OpenAPI),
//                 $ref to a JSON pointer inside the root schema ("#", "#/$defs/Name", "#/definitions/Name"; recursion
//                 is allowed)
//   annotations   title, description, default, examples, $schema, $id, $comment, $defs, definitions, deprecated,
//                 readOnly, writeOnly (ignored)
// Any other keyword (pattern, format, oneOf, multipleOf, uniqueItems, prefixItems, not, ...) is an error in strict
// mode; in lenient mode (tool parameters, where OpenAI accepts any schema) it is ignored and only the keywords above
// constrain the output. Keywords of the wrong type (e.g. `properties` not an object) are errors in both modes.
//
// Output form: whitespace between tokens is nothing, one space, or one or two newlines followed by at most
// kMaxIndent spaces / tabs (bounded, so a weak model cannot loop on whitespace; pretty-printed JSON fits); strings
// are valid UTF-8 without control characters and without a raw U+FF5C "｜" (the character of every chat-format marker
// the output parser looks for; \uff5c is allowed), with the escapes \" \\ \/ \b \f \n \r \t and \uXXXX outside the
// surrogate range; numbers have at most 16 integer and 16 fraction
// digits and a 1-2 digit exponent (integers: 16 digits).
//
// Errors: ApiError 400 (invalid_request_error) whose param is `path` + the keyword's location, e.g.
// "response_format.json_schema.schema.properties.age.pattern", and whose message says what is wrong.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "sampling/grammar.h"

namespace dsv4 {

inline constexpr int kMaxIndent = 20;

class JsonSchemaGrammar {
 public:
  // root: the whole schema document ($ref targets are looked up in it); path: its location in the request.
  JsonSchemaGrammar(GrammarBuilder& b, const nlohmann::ordered_json& root, std::string path, bool lenient);

  // A rule matching one JSON value valid against `schema` (located at `path`), without surrounding whitespace.
  int32_t value(const nlohmann::ordered_json& schema, const std::string& path);
  int32_t root_value() { return value(root_, path_); }
  // Shared pieces.
  int32_t ws();         // optional whitespace (see above)
  int32_t any_value();  // any JSON value
  int32_t string_value(int64_t min_len = 0, int64_t max_len = -1);

 private:
  int32_t object(const nlohmann::ordered_json& s, const std::string& path);
  int32_t array(const nlohmann::ordered_json& s, const std::string& path);
  int32_t number(const nlohmann::ordered_json& s, const std::string& path, bool integer);
  int32_t literal(const nlohmann::ordered_json& v);
  int32_t typed(const std::string& type, const nlohmann::ordered_json& s, const std::string& path);
  int32_t resolve_ref(const std::string& ref, const std::string& path);
  int32_t str_char();

  GrammarBuilder& b_;
  const nlohmann::ordered_json& root_;
  std::string path_;
  bool lenient_;
  int32_t ws_ = -1, any_ = -1, str_char_ = -1, string_ = -1, number_ = -1, integer_ = -1;
  std::vector<std::pair<std::string, int32_t>> refs_;  // resolved $ref -> rule
  int depth_ = 0;
};

// The grammar of a whole JSON document (leading / trailing whitespace allowed) valid against `schema`.
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const std::string& path, bool lenient = false);
// Any JSON object (response_format json_object).
Grammar json_object_grammar();

}  // namespace dsv4
