#include "loader/json_text.h"

#include "core/error.h"
#include "core/json_depth.h"

namespace dsv4 {

nlohmann::json parse_json_text(std::string_view text, const std::string& label, const char* what, int max_depth) {
  if (json_nesting_exceeds(text, max_depth)) fail("{}: malformed {} JSON: nesting deeper than {}", label, what, max_depth);
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
