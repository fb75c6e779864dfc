// Nesting depth of JSON text, found without parsing it. Deeply nested JSON (e.g. 70,000 levels of {"a": in half a
// megabyte) parses, but copying or printing the parsed value recurses once per level and overflows the stack, so
// every JSON text from outside (files, request bodies, tool-call arguments) is checked with this first.
#pragma once
#include <string_view>

namespace dsv4 {

// Deepest nesting that JSON from a client (request bodies, tool-call arguments, `dsv4 render` files) may have.
constexpr int kMaxJsonRequestDepth = 128;

// True when arrays / objects in `text` nest deeper than max_depth (brackets inside strings do not count).
inline bool json_nesting_exceeds(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (char ch : text) {
    if (in_str) {
      if (esc)
        esc = false;
      else if (ch == '\\')
        esc = true;
      else if (ch == '"')
        in_str = false;
    } else if (ch == '"') {
      in_str = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > max_depth) return true;
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return false;
}

}  // namespace dsv4
