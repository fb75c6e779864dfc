#include "server/json_schema_grammar.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "server/api_error.h"

namespace dsv4 {

namespace {

using J = nlohmann::ordered_json;
using Seq = GrammarBuilder::Seq;
constexpr int kMaxSchemaDepth = 64;
constexpr int kMaxIntDigits = 16;
constexpr int64_t kMaxMagnitude = 9999999999999999;  // 16 digits
constexpr int64_t kMaxBound = 1 << 16;               // minLength / maxLength / minItems / maxItems

const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {"title",       "description", "default",  "examples",
                                          "$schema",     "$id",         "$comment", "$defs",
                                          "definitions", "deprecated",  "readOnly", "writeOnly"};
  return k;
}

// Keywords this converter understands (per JSON Schema meaning; see the header).
const std::set<std::string>& supported() {
  static const std::set<std::string> k = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "minItems",
                                          "maxItems",
                                          "minLength",
                                          "maxLength",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "allOf",
                                          "nullable",
                                          "$ref"};
  return k;
}

[[noreturn]] void schema_error(const std::string& path, const std::string& msg) {
  bad_request(path, fmt::format("{}: {}", path, msg));
}

std::string pth(const std::string& base, const std::string& key) { return base + "." + key; }
std::string idx(const std::string& base, size_t i) { return fmt::format("{}[{}]", base, i); }

int64_t nonneg_int(const J& s, const char* key, const std::string& path) {
  const J& v = s[key];
  if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == std::floor(v.get<double>())))
    schema_error(pth(path, key), "must be a non-negative integer");
  const double x = v.get<double>();
  if (x < 0) schema_error(pth(path, key), "must be a non-negative integer");
  if (x > kMaxBound) schema_error(pth(path, key), fmt::format("values above {} are not supported", kMaxBound));
  return static_cast<int64_t>(x);
}

std::string dec(int64_t x) { return std::to_string(x); }

// Digits [lo, hi] as byte sets.
GrammarBuilder::Sym digits(GrammarBuilder& b, char lo, char hi) {
  return b.bytes(ByteSet::range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)));
}

// Decimal strings of equal length between A and Z (A <= Z), digit by digit.
Seq same_len(GrammarBuilder& b, const std::string& A, const std::string& Z) {
  const size_t n = A.size();
  if (n == 0) return {};
  if (A[0] == Z[0])
    return GrammarBuilder::cat(b.byte(static_cast<uint8_t>(A[0])), same_len(b, A.substr(1), Z.substr(1)));
  const std::string zeros(n - 1, '0'), nines(n - 1, '9');
  if (A.substr(1) == zeros && Z.substr(1) == nines) {
    Seq s{digits(b, A[0], Z[0])};
    for (size_t i = 1; i < n; ++i) s.push_back(digits(b, '0', '9'));
    return s;
  }
  std::vector<Seq> alts;
  alts.push_back(GrammarBuilder::cat(b.byte(static_cast<uint8_t>(A[0])), same_len(b, A.substr(1), nines)));
  if (A[0] + 1 <= Z[0] - 1) {
    Seq s{digits(b, static_cast<char>(A[0] + 1), static_cast<char>(Z[0] - 1))};
    for (size_t i = 1; i < n; ++i) s.push_back(digits(b, '0', '9'));
    alts.push_back(std::move(s));
  }
  alts.push_back(GrammarBuilder::cat(b.byte(static_cast<uint8_t>(Z[0])), same_len(b, zeros, Z.substr(1))));
  return {b.choice(std::move(alts), "digits")};
}

// Decimal numbers in [lo, hi] without leading zeros (0 <= lo <= hi <= kMaxMagnitude).
GrammarBuilder::Sym uint_range(GrammarBuilder& b, int64_t lo, int64_t hi) {
  std::vector<Seq> alts;
  int64_t p = 1;  // 10^(d-1)
  for (int d = 1; d <= kMaxIntDigits; ++d, p *= 10) {
    const int64_t first = d == 1 ? 0 : p, last = p * 10 - 1;
    const int64_t a = std::max(lo, first), z = std::min(hi, last);
    if (a <= z) alts.push_back(same_len(b, dec(a), dec(z)));
    if (last >= hi) break;
  }
  return b.choice(std::move(alts), "uint_range");
}

}  // namespace

JsonSchemaGrammar::JsonSchemaGrammar(GrammarBuilder& b, const J& root, std::string path, bool lenient)
    : b_(b), root_(root), path_(std::move(path)), lenient_(lenient) {}

int32_t JsonSchemaGrammar::ws() {
  if (ws_ < 0) {
    // "" | " " | "\n"{1,2} [ \t]{0,kMaxIndent}: compact, one space, or a line break with indentation.
    ByteSet indent;
    indent.add(' ');
    indent.add('\t');
    ws_ = b_.rule("ws");
    b_.add(ws_, {});
    b_.add(ws_, {b_.byte(' ')});
    b_.add(ws_, {b_.repeat({b_.byte('\n')}, 1, 2), b_.repeat({b_.bytes(indent)}, 0, kMaxIndent)});
  }
  return ws_;
}

int32_t JsonSchemaGrammar::str_char() {
  if (str_char_ < 0) {
    ByteSet plain;
    plain.add_range(0x20, 0x7F);
    plain.remove('"');
    plain.remove('\\');
    ByteSet esc;
    for (char c : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) esc.add(static_cast<uint8_t>(c));
    ByteSet hex;
    hex.add_range('0', '9');
    hex.add_range('a', 'f');
    hex.add_range('A', 'F');
    ByteSet h1;  // first hex digit of a non-surrogate code unit: 0-C, E-F (D only as D0-D7)
    h1.add_range('0', '9');
    h1.add_range('a', 'c');
    h1.add_range('A', 'C');
    h1.add_range('e', 'f');
    h1.add_range('E', 'F');
    ByteSet d;
    d.add('d');
    d.add('D');
    const auto H = b_.bytes(hex);
    const auto u = b_.choice({{b_.bytes(h1), H, H, H}, {b_.bytes(d), digits(b_, '0', '7'), H, H}}, "unicode_escape");
    const auto escape = b_.choice({{b_.bytes(esc)}, {b_.byte('u'), u}}, "escape");
    // Multi-byte UTF-8 characters other than U+FF5C "｜" (EF BD 9C): every chat-format marker the output parser
    // looks for (<｜DSML｜…>, <｜end▁of▁sentence｜>) contains it, so a JSON string can never end the answer or open a
    // tool-call block by accident (the character is still available as \uff5c).
    const auto c = b_.bytes(ByteSet::range(0x80, 0xBF));
    ByteSet e3 = ByteSet::range(0xE1, 0xEC);
    e3.add(0xEE);
    ByteSet bd_tail = ByteSet::range(0x80, 0xBF);
    bd_tail.remove(0x9C);
    ByteSet ef_mid = ByteSet::range(0x80, 0xBF);
    ef_mid.remove(0xBD);
    const auto multi = b_.choice({{b_.bytes(ByteSet::range(0xC2, 0xDF)), c},
                                  {b_.byte(0xE0), b_.bytes(ByteSet::range(0xA0, 0xBF)), c},
                                  {b_.bytes(e3), c, c},
                                  {b_.byte(0xED), b_.bytes(ByteSet::range(0x80, 0x9F)), c},
                                  {b_.byte(0xEF), b_.bytes(ef_mid), c},
                                  {b_.byte(0xEF), b_.byte(0xBD), b_.bytes(bd_tail)},
                                  {b_.byte(0xF0), b_.bytes(ByteSet::range(0x90, 0xBF)), c, c},
                                  {b_.bytes(ByteSet::range(0xF1, 0xF3)), c, c, c},
                                  {b_.byte(0xF4), b_.bytes(ByteSet::range(0x80, 0x8F)), c, c}},
                                 "utf8_multibyte_json");
    str_char_ = b_.rule("string_char");
    b_.add(str_char_, {b_.bytes(plain)});
    b_.add(str_char_, {multi});
    b_.add(str_char_, {b_.byte('\\'), escape});
  }
  return str_char_;
}

int32_t JsonSchemaGrammar::string_value(int64_t min_len, int64_t max_len) {
  if (min_len == 0 && max_len < 0 && string_ >= 0) return string_;
  const int32_t r = b_.rule("string");
  b_.add(r, GrammarBuilder::cat(b_.byte('"'), b_.repeat({GrammarBuilder::ref(str_char())}, min_len, max_len),
                                b_.byte('"')));
  if (min_len == 0 && max_len < 0) string_ = r;
  return r;
}

int32_t JsonSchemaGrammar::any_value() {
  if (any_ >= 0) return any_;
  any_ = b_.rule("value");
  const auto W = GrammarBuilder::ref(ws());
  const auto V = GrammarBuilder::ref(any_);
  const auto S = GrammarBuilder::ref(string_value());
  // object: "{" ws (string ws ":" ws value ws ("," ws string ws ":" ws value ws)*)? "}"
  const Seq member = GrammarBuilder::cat(S, W, b_.byte(':'), W, V, W);
  const auto more_members = b_.star(GrammarBuilder::cat(b_.byte(','), W, member));
  const auto members = b_.opt(GrammarBuilder::cat(member, more_members));
  const auto obj = b_.choice({GrammarBuilder::cat(b_.byte('{'), W, members, b_.byte('}'))}, "object");
  const Seq item = GrammarBuilder::cat(V, W);
  const auto items = b_.opt(GrammarBuilder::cat(item, b_.star(GrammarBuilder::cat(b_.byte(','), W, item))));
  const auto arr = b_.choice({GrammarBuilder::cat(b_.byte('['), W, items, b_.byte(']'))}, "array");
  b_.add(any_, {obj});
  b_.add(any_, {arr});
  b_.add(any_, {S});
  b_.add(any_, {GrammarBuilder::ref(number(J::object(), path_, false))});
  b_.add(any_, b_.lit("true"));
  b_.add(any_, b_.lit("false"));
  b_.add(any_, b_.lit("null"));
  return any_;
}

int32_t JsonSchemaGrammar::literal(const J& v) {
  const int32_t r = b_.rule("const");
  b_.add(r, b_.lit(v.dump(-1, ' ', false, J::error_handler_t::strict)));
  return r;
}

int32_t JsonSchemaGrammar::number(const J& s, const std::string& path, bool integer) {
  const bool bounded = s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
                       s.contains("exclusiveMaximum");
  const auto sign = b_.opt({b_.byte('-')});
  if (!bounded) {
    int32_t& cached = integer ? integer_ : number_;
    if (cached >= 0) return cached;
    const auto intpart = b_.choice(
        {{b_.byte('0')}, {digits(b_, '1', '9'), b_.repeat({digits(b_, '0', '9')}, 0, kMaxIntDigits - 1)}}, "int");
    cached = b_.rule(integer ? "integer" : "number");
    if (integer) {
      b_.add(cached, {sign, intpart});
    } else {
      const auto frac = b_.opt({b_.byte('.'), b_.repeat({digits(b_, '0', '9')}, 1, kMaxIntDigits)});
      ByteSet e, pm;
      e.add('e');
      e.add('E');
      pm.add('+');
      pm.add('-');
      const auto exp = b_.opt({b_.bytes(e), b_.opt({b_.bytes(pm)}), b_.repeat({digits(b_, '0', '9')}, 1, 2)});
      b_.add(cached, {sign, intpart, frac, exp});
    }
    return cached;
  }
  // Integer bounds [a, z] of the range (see the header: bounded numbers have no exponent).
  double lo = -static_cast<double>(kMaxMagnitude), hi = static_cast<double>(kMaxMagnitude);
  bool lo_excl = false, hi_excl = false;
  auto num = [&](const char* key) {
    const J& v = s[key];
    if (!v.is_number()) schema_error(pth(path, key), "must be a number");
    return v.get<double>();
  };
  if (s.contains("minimum")) lo = num("minimum");
  if (s.contains("maximum")) hi = num("maximum");
  for (const char* key : {"exclusiveMinimum", "exclusiveMaximum"}) {
    if (!s.contains(key)) continue;
    const bool is_min = std::string_view(key) == "exclusiveMinimum";
    const J& v = s[key];
    if (v.is_boolean()) {  // draft 4: modifies minimum / maximum
      (is_min ? lo_excl : hi_excl) = v.get<bool>();
      continue;
    }
    const double x = num(key);
    if (is_min && x >= lo) lo = x, lo_excl = true;
    if (!is_min && x <= hi) hi = x, hi_excl = true;
  }
  const double cap = static_cast<double>(kMaxMagnitude);
  double a = lo_excl ? std::floor(lo) + 1 : std::ceil(lo);
  double z = hi_excl ? std::ceil(hi) - 1 : std::floor(hi);
  a = std::clamp(a, -cap, cap);
  z = std::clamp(z, -cap, cap);
  if (a > z)
    schema_error(path, integer ? "minimum / maximum leave no integer in range"
                               : "a bounded number needs an integer in its range (narrower ranges are not supported)");
  const int64_t A = static_cast<int64_t>(a), Z = static_cast<int64_t>(z);
  std::vector<Seq> alts;
  const auto frac = [&] {
    return GrammarBuilder::cat(b_.byte('.'), b_.repeat({digits(b_, '0', '9')}, 1, kMaxIntDigits));
  };
  if (Z >= 0) alts.push_back({uint_range(b_, std::max<int64_t>(A, 0), Z)});
  if (A < 0) alts.push_back({b_.byte('-'), uint_range(b_, std::max<int64_t>(1, -Z), -A)});
  if (!integer) {
    if (Z - 1 >= std::max<int64_t>(A, 0))
      alts.push_back(GrammarBuilder::cat(uint_range(b_, std::max<int64_t>(A, 0), Z - 1), frac()));
    if (-A - 1 >= std::max<int64_t>(0, -Z))
      alts.push_back(GrammarBuilder::cat(b_.byte('-'), uint_range(b_, std::max<int64_t>(0, -Z), -A - 1), frac()));
  }
  const int32_t r = b_.rule(integer ? "integer_range" : "number_range");
  for (auto& alt : alts) b_.add(r, std::move(alt));
  return r;
}

int32_t JsonSchemaGrammar::object(const J& s, const std::string& path) {
  const auto W = GrammarBuilder::ref(ws());
  std::vector<std::pair<std::string, const J*>> props;
  static const J kAny = J::object();
  if (s.contains("properties")) {
    const J& p = s["properties"];
    if (!p.is_object()) schema_error(pth(path, "properties"), "must be an object");
    for (auto it = p.begin(); it != p.end(); ++it) props.emplace_back(it.key(), &it.value());
  }
  std::set<std::string> required;
  if (s.contains("required")) {
    const J& r = s["required"];
    if (!r.is_array()) schema_error(pth(path, "required"), "must be an array of strings");
    for (size_t i = 0; i < r.size(); ++i) {
      if (!r[i].is_string()) schema_error(idx(pth(path, "required"), i), "must be a string");
      required.insert(r[i].get<std::string>());
    }
  }
  const J* extra = nullptr;  // schema of additional properties; nullptr: none allowed
  bool extra_allowed = true;
  if (s.contains("additionalProperties")) {
    const J& ap = s["additionalProperties"];
    if (ap.is_boolean()) {
      extra_allowed = ap.get<bool>();
      extra = extra_allowed ? &kAny : nullptr;
    } else if (ap.is_object()) {
      extra = &ap;
    } else {
      schema_error(pth(path, "additionalProperties"), "must be a boolean or a schema");
    }
  } else {
    extra = &kAny;
  }
  for (const auto& name : required) {
    const bool listed = std::any_of(props.begin(), props.end(), [&](const auto& p) { return p.first == name; });
    if (listed) continue;
    if (!extra_allowed)
      schema_error(pth(path, "required"),
                   fmt::format("'{}' is required but not in properties, and additionalProperties is false", name));
    props.emplace_back(name, extra ? extra : &kAny);
  }

  const int32_t r = b_.rule("object");
  if (props.empty()) {
    if (!extra) {
      b_.add(r, {b_.byte('{'), W, b_.byte('}')});
      return r;
    }
    // A map: any keys, values of the additionalProperties schema.
    const auto V = GrammarBuilder::ref(value(*extra, pth(path, "additionalProperties")));
    const Seq member = GrammarBuilder::cat(GrammarBuilder::ref(string_value()), W, b_.byte(':'), W, V, W);
    const auto more = b_.star(GrammarBuilder::cat(b_.byte(','), W, member));
    b_.add(r, GrammarBuilder::cat(b_.byte('{'), W, b_.opt(GrammarBuilder::cat(member, more)), b_.byte('}')));
    return r;
  }
  // kv_i = "key" ws ":" ws value ws. R_i: the rest from property i after at least one was written;
  // F_i: the first written property is i or later.
  const size_t n = props.size();
  std::vector<Seq> kv(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string key = J(props[i].first).dump(-1, ' ', false, J::error_handler_t::strict);
    const int32_t v = value(*props[i].second, pth(pth(path, "properties"), props[i].first));
    kv[i] = GrammarBuilder::cat(b_.lit(key), W, b_.byte(':'), W, GrammarBuilder::ref(v), W);
  }
  std::vector<int32_t> R(n + 1), F(n + 1);
  R[n] = b_.rule("members_rest");
  b_.add(R[n], {});
  F[n] = -1;
  for (size_t i = n; i-- > 0;) {
    const bool req = required.count(props[i].first) > 0;
    R[i] = b_.rule("members_rest");
    b_.add(R[i], GrammarBuilder::cat(b_.byte(','), W, kv[i], GrammarBuilder::ref(R[i + 1])));
    if (!req) b_.add(R[i], {GrammarBuilder::ref(R[i + 1])});
    F[i] = b_.rule("members");
    b_.add(F[i], GrammarBuilder::cat(kv[i], GrammarBuilder::ref(R[i + 1])));
    if (!req) {
      if (F[i + 1] >= 0)
        b_.add(F[i], {GrammarBuilder::ref(F[i + 1])});
      else
        b_.add(F[i], {});
    }
  }
  b_.add(r, GrammarBuilder::cat(b_.byte('{'), W, GrammarBuilder::ref(F[0]), b_.byte('}')));
  return r;
}

int32_t JsonSchemaGrammar::array(const J& s, const std::string& path) {
  const auto W = GrammarBuilder::ref(ws());
  int64_t min = s.contains("minItems") ? nonneg_int(s, "minItems", path) : 0;
  int64_t max = s.contains("maxItems") ? nonneg_int(s, "maxItems", path) : -1;
  if (max >= 0 && max < min) schema_error(pth(path, "maxItems"), "is smaller than minItems");
  static const J kAny = J::object();
  const J* items = &kAny;
  if (s.contains("items")) {
    const J& it = s["items"];
    if (!it.is_object() && !it.is_boolean()) schema_error(pth(path, "items"), "must be a schema");
    items = &it;
  }
  const int32_t r = b_.rule("array");
  if (max == 0) {
    b_.add(r, {b_.byte('['), W, b_.byte(']')});
    return r;
  }
  const Seq item = GrammarBuilder::cat(GrammarBuilder::ref(value(*items, pth(path, "items"))), W);
  const Seq next = GrammarBuilder::cat(b_.byte(','), W, item);
  const auto rest = b_.repeat(next, std::max<int64_t>(min - 1, 0), max < 0 ? -1 : max - 1);
  const Seq some = GrammarBuilder::cat(item, rest);
  if (min == 0)
    b_.add(r, GrammarBuilder::cat(b_.byte('['), W, b_.opt(some), b_.byte(']')));
  else
    b_.add(r, GrammarBuilder::cat(b_.byte('['), W, some, b_.byte(']')));
  return r;
}

int32_t JsonSchemaGrammar::typed(const std::string& type, const J& s, const std::string& path) {
  if (type == "object") return object(s, path);
  if (type == "array") return array(s, path);
  if (type == "string") {
    const int64_t min = s.contains("minLength") ? nonneg_int(s, "minLength", path) : 0;
    const int64_t max = s.contains("maxLength") ? nonneg_int(s, "maxLength", path) : -1;
    if (max >= 0 && max < min) schema_error(pth(path, "maxLength"), "is smaller than minLength");
    return string_value(min, max);
  }
  if (type == "number" || type == "integer") return number(s, path, type == "integer");
  if (type == "boolean") {
    const int32_t r = b_.rule("boolean");
    b_.add(r, b_.lit("true"));
    b_.add(r, b_.lit("false"));
    return r;
  }
  if (type == "null") {
    const int32_t r = b_.rule("null");
    b_.add(r, b_.lit("null"));
    return r;
  }
  schema_error(pth(path, "type"), fmt::format("unknown type '{}'", type));
}

int32_t JsonSchemaGrammar::resolve_ref(const std::string& ref, const std::string& path) {
  for (const auto& [k, r] : refs_)
    if (k == ref) return r;
  if (ref.empty() || ref[0] != '#')
    schema_error(pth(path, "$ref"),
                 fmt::format("only references inside the schema ('#...') are supported, got '{}'", ref));
  const J* target = nullptr;
  try {
    const auto ptr = nlohmann::ordered_json::json_pointer(ref.substr(1));
    if (root_.contains(ptr)) target = &root_.at(ptr);
  } catch (const nlohmann::json::exception&) {
  }
  if (!target) schema_error(pth(path, "$ref"), fmt::format("'{}' does not point into the schema", ref));
  // The rule exists before its body is converted, so recursive references resolve to it.
  const int32_t r = b_.rule("ref");
  refs_.emplace_back(ref, r);
  b_.add(r, {GrammarBuilder::ref(value(*target, path + "($ref " + ref + ")"))});
  return r;
}

int32_t JsonSchemaGrammar::value(const J& s, const std::string& path) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) schema_error(path, "the schema `false` matches nothing");
    return any_value();
  }
  if (!s.is_object()) schema_error(path, "a schema must be an object or a boolean");
  if (++depth_ > kMaxSchemaDepth) schema_error(path, fmt::format("nested deeper than {} levels", kMaxSchemaDepth));
  struct Leave {
    int& d;
    ~Leave() { --d; }
  } leave{depth_};

  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (supported().count(k) || annotations().count(k)) continue;
    if (!lenient_) schema_error(pth(path, k), fmt::format("unsupported keyword '{}'", k));
  }
  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) schema_error(pth(path, "$ref"), "must be a string");
    return resolve_ref(s["$ref"].get<std::string>(), path);
  }
  const bool nullable = s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>();
  int32_t base;
  if (s.contains("const")) {
    base = literal(s["const"]);
  } else if (s.contains("enum")) {
    const J& e = s["enum"];
    if (!e.is_array() || e.empty()) schema_error(pth(path, "enum"), "must be a non-empty array");
    base = b_.rule("enum");
    for (const auto& v : e) b_.add(base, {GrammarBuilder::ref(literal(v))});
  } else if (s.contains("anyOf") || (lenient_ && s.contains("oneOf"))) {
    const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
    const J& a = s[key];
    if (!a.is_array() || a.empty()) schema_error(pth(path, key), "must be a non-empty array of schemas");
    // Sibling keywords would constrain every branch too; the branches are converted as given, so strict mode
    // refuses siblings that validate (annotations and nullable are fine).
    if (!lenient_)
      for (auto it = s.begin(); it != s.end(); ++it)
        if (it.key() != key && it.key() != "nullable" && !annotations().count(it.key()))
          schema_error(pth(path, it.key()),
                       fmt::format("'{}' next to '{}' is not supported (move it into the branches)", it.key(), key));
    base = b_.rule("any_of");
    for (size_t i = 0; i < a.size(); ++i) b_.add(base, {GrammarBuilder::ref(value(a[i], idx(pth(path, key), i)))});
  } else if (s.contains("allOf")) {
    const J& a = s["allOf"];
    if (!a.is_array() || a.size() != 1)
      schema_error(pth(path, "allOf"), "only allOf with exactly one schema is supported");
    base = value(a[0], idx(pth(path, "allOf"), 0));
  } else if (s.contains("type")) {
    const J& t = s["type"];
    if (t.is_string()) {
      base = typed(t.get<std::string>(), s, path);
    } else if (t.is_array() && !t.empty()) {
      base = b_.rule("types");
      for (size_t i = 0; i < t.size(); ++i) {
        if (!t[i].is_string()) schema_error(idx(pth(path, "type"), i), "must be a type name");
        b_.add(base, {GrammarBuilder::ref(typed(t[i].get<std::string>(), s, path))});
      }
    } else {
      schema_error(pth(path, "type"), "must be a type name or a non-empty array of type names");
    }
  } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
    base = object(s, path);
  } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
    base = array(s, path);
  } else if (s.contains("minLength") || s.contains("maxLength")) {
    base = typed("string", s, path);
  } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
             s.contains("exclusiveMaximum")) {
    base = number(s, path, false);
  } else {
    base = any_value();
  }
  if (!nullable) return base;
  const int32_t r = b_.rule("nullable");
  b_.add(r, {GrammarBuilder::ref(base)});
  b_.add(r, b_.lit("null"));
  return r;
}

Grammar json_schema_grammar(const J& schema, const std::string& path, bool lenient) {
  GrammarBuilder b;
  JsonSchemaGrammar c(b, schema, path, lenient);
  const int32_t root = b.rule("document");
  const auto W = GrammarBuilder::ref(c.ws());
  b.add(root, {W, GrammarBuilder::ref(c.root_value()), W});
  try {
    return b.build(root);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    schema_error(path, fmt::format("cannot be turned into a grammar ({})", e.what()));
  }
}

Grammar json_object_grammar() {
  J schema = {{"type", "object"}};
  return json_schema_grammar(schema, "response_format");
}

}  // namespace dsv4
