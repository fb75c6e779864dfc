// Comma-separated integer lists on the command line (bench serve --clients 1,8; bench spec --batch / --draft;
// generate / logprobs --prompt-ids): every such option parses its text the same way, while the command line is
// parsed. CLI11's own list splitting (->delimiter(',')) dropped empty entries: "--clients 1,,2" ran as 1,2.
//
//   "1,8,64"   -> {1, 8, 64}     entries are decimal integers ("010" is 10), white space around one is ignored
//   ""         -> usage error    "is empty"
//   "1,,2"     -> usage error    "empty entry 2 in '1,,2'" (also a leading or trailing comma)
//   "1,x"      -> usage error    "'x' (entry 2 of '1,x') is not an integer in [1, 4096]" (also out of range)
// The message is CLI11's validation error, so the line names the option: "dsv4: error: --clients: ...", exit 2.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cli/int_option.h"

namespace dsv4::cli {

// The entries of a comma-separated list, each trimmed of white space; nullopt (and `why`) for a blank text or an
// empty entry.
inline std::optional<std::vector<std::string>> split_list(std::string_view s, std::string& why) {
  constexpr const char* kSpace = " \t\r\n";
  if (s.find_first_not_of(kSpace) == std::string_view::npos) {
    why = "is empty";
    return std::nullopt;
  }
  std::vector<std::string> out;
  for (size_t i = 0;;) {
    const size_t j = std::min(s.find(',', i), s.size());
    std::string_view e = s.substr(i, j - i);
    e.remove_prefix(std::min(e.find_first_not_of(kSpace), e.size()));
    e.remove_suffix(e.size() - (e.find_last_not_of(kSpace) + 1));  // (npos + 1 == 0: all of it)
    if (e.empty()) {
      why = fmt::format("empty entry {} in '{}'", out.size() + 1, s);
      return std::nullopt;
    }
    out.emplace_back(e);
    if (j == s.size()) return out;
    i = j + 1;
  }
}

// One entry as a decimal integer of type T in [lo, hi] (an optional sign, then digits; leading zeros are decimal).
template <class T>
std::optional<T> decimal_in(std::string_view e, T lo, T hi) {
  if (e.size() > 1 && e[0] == '+' && e[1] != '-') e.remove_prefix(1);
  const std::optional<T> v = parse_integer<T>(std::string(e));
  if (!v || *v < lo || *v > hi) return std::nullopt;
  return v;
}

// The list `s` of integers in [lo, hi]; nullopt (and `why`) when it is not one.
template <class T>
std::optional<std::vector<T>> parse_int_list(std::string_view s, T lo, T hi, std::string& why) {
  const std::optional<std::vector<std::string>> entries = split_list(s, why);
  if (!entries) return std::nullopt;
  std::vector<T> out;
  for (const std::string& e : *entries) {
    const std::optional<T> v = decimal_in<T>(e, lo, hi);
    if (!v) {
      why = entries->size() == 1
                ? fmt::format("'{}' is not an integer in [{}, {}]", e, lo, hi)
                : fmt::format("'{}' (entry {} of '{}') is not an integer in [{}, {}]", e, out.size() + 1, s, lo, hi);
      return std::nullopt;
    }
    out.push_back(*v);
  }
  return out;
}

// Adds `name` as a comma-separated list of integers in [lo, hi] that replaces `out` when given (`out` keeps its
// default otherwise; it must outlive the parse).
template <class T>
CLI::Option* add_int_list_option(CLI::App& app, const std::string& name, std::vector<T>& out, const std::string& help,
                                 T lo, T hi) {
  return app
      .add_option_function<std::string>(
          name,
          [&out, lo, hi](const std::string& s) {
            std::string why;
            out = parse_int_list<T>(s, lo, hi, why).value();  // (checked below, before this runs)
          },
          help)
      ->check(CLI::Validator(
          [lo, hi](std::string& s) {
            std::string why;
            return parse_int_list<T>(s, lo, hi, why) ? std::string() : why;
          },
          ""))
      ->type_name("LIST");
}

}  // namespace dsv4::cli
