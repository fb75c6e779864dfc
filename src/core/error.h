// dsv4 error type: every user-facing failure (bad file, bad config, bad request) is a dsv4::Error
// whose what() is one line that names the file / tensor / field at fault. The CLI prints it and exits 1 (2 for a
// dsv4::UsageError).
#pragma once
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace dsv4 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A bad command line found after parsing (an empty prompt, an out-of-range sampling value, an unknown device): the
// CLI prints it like a parse error and exits 2, before anything is loaded.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& msg) : Error(msg) {}
};

template <typename... Args>
[[noreturn]] inline void usage_fail(fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(fmt::format(f, std::forward<Args>(args)...));
}

// Throw a dsv4::Error with a fmt-style message.
template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dsv4
