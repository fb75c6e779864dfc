// Typed access to the fields of a JSON request body; every mismatch is an ApiError 400 whose param names the field
// (`param` is the field's full location, e.g. "thinking.budget_tokens"). A field that is absent or null reads as
// nullopt. Shared by the OpenAI and Anthropic request parsers.
#pragma once
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/json_depth.h"
#include "server/api_error.h"

namespace dsv4::reqf {

using J = nlohmann::ordered_json;

inline const J* field(const J& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// A request body: a JSON object. Malformed JSON is a 400 'invalid_json' that carries the parser's message (with the
// line and column of the error); every endpoint reports it the same way. So is nesting deeper than
// kMaxJsonRequestDepth (core/json_depth.h), checked before parsing.
inline J parse_object_body(std::string_view body) {
  if (json_nesting_exceeds(body, kMaxJsonRequestDepth))
    throw ApiError(400, fmt::format("invalid JSON in the request body: nested deeper than {} levels", kMaxJsonRequestDepth),
                   "invalid_request_error", "", "invalid_json");
  J j;
  try {
    j = J::parse(body);
  } catch (const std::exception& e) {
    throw ApiError(400, fmt::format("invalid JSON in the request body: {}", e.what()), "invalid_request_error", "",
                   "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

inline std::string join(const std::string& prefix, const char* key) {
  return prefix.empty() ? std::string(key) : prefix + "." + key;
}

inline std::optional<double> number(const J& obj, const char* key, double lo, double hi, bool lo_open = false,
                                    const std::string& prefix = "") {
  const J* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string p = join(prefix, key);
  if (!v->is_number()) bad_request(p, fmt::format("'{}' must be a number", p));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
    bad_request(p, fmt::format("'{}' must be in {}{}, {}], got {}", p, lo_open ? "(" : "[", lo, hi, v->dump()));
  return x;
}

inline std::optional<int64_t> integer(const J& obj, const char* key, const std::string& prefix = "") {
  const J* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string p = join(prefix, key);
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))  // (get<int64_t> would wrap it)
    bad_request(p, fmt::format("'{}' is too large, got {}", p, v->dump()));
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double x = v->get<double>();
    if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9e15) return static_cast<int64_t>(x);
  }
  bad_request(p, fmt::format("'{}' must be an integer", p));
}

inline std::optional<bool> boolean(const J& obj, const char* key, const std::string& prefix = "") {
  const J* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string p = join(prefix, key);
  if (!v->is_boolean()) bad_request(p, fmt::format("'{}' must be a boolean", p));
  return v->get<bool>();
}

inline std::optional<std::string> string(const J& obj, const char* key, const std::string& prefix = "") {
  const J* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string p = join(prefix, key);
  if (!v->is_string()) bad_request(p, fmt::format("'{}' must be a string", p));
  return v->get<std::string>();
}

// An object field: must be a JSON object whose keys are all in `known` (new objects are checked strictly).
inline const J* object(const J& obj, const char* key, std::initializer_list<std::string_view> known,
                       const std::string& prefix = "") {
  const J* v = field(obj, key);
  if (!v) return nullptr;
  const std::string p = join(prefix, key);
  if (!v->is_object()) bad_request(p, fmt::format("'{}' must be an object", p));
  for (auto it = v->begin(); it != v->end(); ++it) {
    bool ok = false;
    for (auto k : known) ok = ok || k == it.key();
    if (!ok) bad_request(p + "." + it.key(), fmt::format("unknown field '{}' in '{}'", it.key(), p));
  }
  return v;
}

[[noreturn]] inline void unsupported(const std::string& key, const std::string& what) {
  bad_request(key, fmt::format("{} is not supported by this server", what), "unsupported_parameter");
}

}  // namespace dsv4::reqf
