// Integer flags checked on the text the user typed. CLI11's own conversion does not see every bad number: it
// saturates values beyond 64 bits (strtoll: --seed 18446744073709551616 became 2^63 - 1) and wraps a negative one
// into an unsigned type (strtoull). integer_in(lo, hi) makes such a value a usage error that quotes it.
#pragma once
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <optional>
#include <string>

#include "core/error.h"

namespace dsv4::cli {

// The whole of `s` as a decimal integer of type T; nullopt when it is not one or does not fit T.
template <class T>
std::optional<T> parse_integer(const std::string& s) {
  T v{};
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return v;
}

// A transformer (->transform(...)): a decimal integer in [lo, hi], rewritten in canonical decimal for CLI11's
// conversion (which would read a leading 0 as octal); anything else: "'S' is not an integer in [lo, hi]". Every
// integer option of the CLI checks its range with it (CLI::Range's message had another form, "Value 0 not in range
// 1 to 1099511627776", and saturated values beyond 64 bits). T: the type the bounds are compared in (int64_t also for
// an int option: a value that passes is within the option's bounds, hence fits it).
template <class T>
CLI::Validator integer_in(T lo, T hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        const std::optional<T> v = parse_integer<T>(s);
        if (!v || *v < lo || *v > hi) return fmt::format("'{}' is not an integer in [{}, {}]", s, lo, hi);
        s = std::to_string(*v);
        return {};
      },
      fmt::format("INT in [{}, {}]", lo, hi));
}

// Every integer option (type INT or UINT) of `app` and its subcommands, at any depth, reads its value as decimal:
// CLI11 alone reads "010" as octal 8 and "0x10" as hex 16. A leading-zero number is decimal ("010" is 10); any
// other text that is not [+-]digits is a usage error ("'0x10' is not a decimal integer"). Call once, after every
// option is added: the transform runs before the option's own checks (CLI::Range, integer_in).
inline void decimal_integer_options(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    const std::string base = type.substr(0, type.find(':'));
    if (opt->get_type_size_max() == 0 || (base != "INT" && base != "UINT")) continue;  // flags, non-integers
    opt->transform(CLI::Validator(
        [](std::string& s) -> std::string {
          size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
          if (i == s.size() || s.find_first_not_of("0123456789", i) != std::string::npos)
            return fmt::format("'{}' is not a decimal integer", s);
          const std::string sign = s[0] == '-' ? "-" : "";
          const size_t first = std::min(s.find_first_not_of('0', i), s.size() - 1);  // "000" -> "0"
          s = sign + s.substr(first);
          if (s == "-0") s = "0";
          return {};
        },
        ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) decimal_integer_options(*sub);
}

}  // namespace dsv4::cli
