// Integer flags checked on the text the user typed. CLI11's own conversion does not see every bad number: it
// saturates values beyond 64 bits (strtoll: --seed 18446744073709551616 became 2^63 - 1) and wraps a negative one
// into an unsigned type (strtoull). integer_in(lo, hi) makes such a value a usage error that quotes it.
#pragma once
#include <CLI/CLI.hpp>
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
// conversion (which would read a leading 0 as octal); anything else: "'S' is not an integer in [lo, hi]".
template <class T>
CLI::Validator integer_in(T lo, T hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        const std::optional<T> v = parse_integer<T>(s);
        if (!v || *v < lo || *v > hi) return fmt::format("'{}' is not an integer in [{}, {}]", s, lo, hi);
        s = std::to_string(*v);
        return {};
      },
      "");
}

}  // namespace dsv4::cli
