#include "server/auth.h"

#include <fstream>

#include "core/error.h"

namespace dsv4 {

namespace {
std::string_view trim(std::string_view s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}
}  // namespace

bool constant_time_equal(std::string_view presented, std::string_view secret) {
  // One pass over the secret whatever was presented; the presented length only enters through a comparison whose
  // result is folded in at the end.
  volatile unsigned char diff = presented.size() != secret.size() ? 1 : 0;
  const size_t n = presented.size();
  for (size_t i = 0; i < secret.size(); ++i) {
    const unsigned char p = n ? static_cast<unsigned char>(presented[i < n ? i : n - 1]) : 0;
    diff = diff | (p ^ static_cast<unsigned char>(secret[i]));
  }
  return diff == 0 && !secret.empty();
}

std::string presented_api_key(std::string_view authorization, std::string_view x_api_key) {
  const std::string_view a = trim(authorization);
  if (a.size() > 7) {
    std::string scheme(a.substr(0, 7));
    for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (scheme == "bearer ") return std::string(trim(a.substr(7)));
  }
  return std::string(trim(x_api_key));
}

std::string read_api_key_file(const std::filesystem::path& path) {
  std::ifstream f(path);
  if (!f) fail("{}: cannot read the API key file", path.string());
  std::string line;
  std::getline(f, line);
  const std::string key(trim(line));
  if (key.empty()) fail("{}: the API key file is empty (the key is its first line)", path.string());
  return key;
}

}  // namespace dsv4
