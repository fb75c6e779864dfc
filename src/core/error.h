// dsv4 error type: every user-facing failure (bad file, bad config, bad request) is a dsv4::Error
// whose what() is one line that names the file / tensor / field at fault. The CLI prints it and exits 1.
#pragma once
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace dsv4 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Throw a dsv4::Error with a fmt-style message.
template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dsv4
