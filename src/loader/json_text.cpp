#include "loader/json_text.h"

#include "core/error.h"

namespace dsv4 {

nlohmann::json parse_json_text(std::string_view text, const std::string& label, const char* what, int max_depth) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (char ch : text) {
    if (in_str) {
      if (esc) esc = false;
      else if (ch == '\\') esc = true;
      else if (ch == '"') in_str = false;
      continue;
    }
    if (ch == '"') in_str = true;
    else if (ch == '[' || ch == '{') {
      if (++depth > max_depth) fail("{}: malformed {} JSON: nesting deeper than {}", label, what, max_depth);
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    std::string m = e.what();
    for (auto& c : m)
      if (c == '\n' || c == '\r') c = ' ';
    fail("{}: malformed {} JSON: {}", label, what, m);
  }
}

}  // namespace dsv4
