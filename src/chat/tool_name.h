// The names a chat request may give its tools (functions): 1 to 64 ASCII letters, digits, '_', '-' or '.' — the
// rule of the OpenAI and DeepSeek APIs, plus '.' — text that cannot break the DSML markup a name is rendered into
// (<｜DSML｜invoke name="...">) or the tool-call grammar that constrains a call to the defined names. One rule for
// the server's request checks (server/openai_request.cpp) and the renderer (chat_encoding.cpp: dsv4 render, chat),
// so that `dsv4 render` accepts exactly the tool names the server does.
#pragma once
#include <algorithm>
#include <string_view>

namespace dsv4 {

inline constexpr const char* kToolNameRule = "1 to 64 letters, digits, '_', '-' or '.'";

inline bool valid_tool_name(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  });
}

}  // namespace dsv4
