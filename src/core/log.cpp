#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace dsv4::log {
void set_verbosity(int level) {
  static bool init = [] {
    auto logger = spdlog::stderr_color_mt("dsv4");
    logger->set_pattern("[%l] %v");
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)init;
  spdlog::set_level(level >= 2 ? spdlog::level::debug : level == 1 ? spdlog::level::info : spdlog::level::warn);
}
}  // namespace dsv4::log
