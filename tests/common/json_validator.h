// A small JSON Schema validator for tests: exactly the keywords of server/json_schema_grammar.h (type, properties,
// required, additionalProperties, items, minItems, maxItems, minLength, maxLength (code points), minimum, maximum,
// exclusiveMinimum, exclusiveMaximum, enum, const, anyOf, oneOf (as anyOf), allOf, nullable, $ref into the root).
// Independent of the grammar code, so that "every sentence of the grammar validates" is a real check. (The e2e
// tests validate model outputs with ajv.)
#pragma once
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

namespace dsv4::test {

class JsonValidator {
 public:
  using J = nlohmann::ordered_json;
  explicit JsonValidator(const J& root) : root_(root) {}
  // Empty string: valid; else the reason.
  std::string check(const J& v) const { return check(root_, v, "$"); }

 private:
  static size_t code_points(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }
  static bool type_ok(const std::string& t, const J& v) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "number") return v.is_number();
    if (t == "integer")
      return v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
    return false;
  }
  std::string check(const J& s, const J& v, const std::string& at) const {
    if (s.is_boolean()) return s.get<bool>() ? "" : at + ": schema false";
    if (s.contains("$ref")) {
      const std::string ref = s["$ref"];
      return check(root_.at(J::json_pointer(ref.substr(1))), v, at);
    }
    if (s.value("nullable", false) && v.is_null()) return "";
    if (s.contains("type")) {
      const J& t = s["type"];
      bool ok = false;
      if (t.is_string()) ok = type_ok(t, v);
      for (const auto& x : t.is_array() ? t : J::array()) ok = ok || type_ok(x, v);
      if (!ok) return at + ": type " + t.dump() + " but got " + v.dump();
    }
    if (s.contains("const") && s["const"] != v) return at + ": not the const";
    if (s.contains("enum")) {
      bool ok = false;
      for (const auto& e : s["enum"]) ok = ok || e == v;
      if (!ok) return at + ": not in enum";
    }
    for (const char* k : {"anyOf", "oneOf"})
      if (s.contains(k)) {
        bool ok = false;
        for (const auto& b : s[k]) ok = ok || check(b, v, at).empty();
        if (!ok) return at + ": no " + k + " branch matches";
      }
    if (s.contains("allOf"))
      for (const auto& b : s["allOf"])
        if (auto e = check(b, v, at); !e.empty()) return e;
    if (v.is_object()) {
      const J props = s.value("properties", J::object());
      for (const auto& r : s.value("required", J::array()))
        if (!v.contains(r.get<std::string>())) return at + ": missing " + r.dump();
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (props.contains(it.key())) {
          if (auto e = check(props[it.key()], it.value(), at + "." + it.key()); !e.empty()) return e;
        } else if (s.contains("additionalProperties")) {
          const J& ap = s["additionalProperties"];
          if (ap.is_boolean() && !ap.get<bool>()) return at + ": extra property " + it.key();
          if (ap.is_object())
            if (auto e = check(ap, it.value(), at + "." + it.key()); !e.empty()) return e;
        }
      }
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": too few items";
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": too many items";
      if (s.contains("items"))
        for (size_t i = 0; i < v.size(); ++i)
          if (auto e = check(s["items"], v[i], at + "[" + std::to_string(i) + "]"); !e.empty()) return e;
    }
    if (v.is_string()) {
      const size_t n = code_points(v.get<std::string>());
      if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return at + ": too short";
      if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return at + ": too long";
    }
    if (v.is_number()) {
      const double x = v.get<double>();
      if (s.contains("minimum") && x < s["minimum"].get<double>()) return at + ": below minimum";
      if (s.contains("maximum") && x > s["maximum"].get<double>()) return at + ": above maximum";
      if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() &&
          x <= s["exclusiveMinimum"].get<double>())
        return at + ": not above exclusiveMinimum";
      if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() &&
          x >= s["exclusiveMaximum"].get<double>())
        return at + ": not below exclusiveMaximum";
    }
    return "";
  }
  const J& root_;
};

}  // namespace dsv4::test
