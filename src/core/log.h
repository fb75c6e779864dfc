// Logging: spdlog to stderr. The library never reads environment variables; the CLI sets the level.
#pragma once
#include <spdlog/spdlog.h>

namespace dsv4::log {
using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::warn;
// Set the global level: 0 = warn (default), 1 = info, 2 = debug.
void set_verbosity(int level);
}  // namespace dsv4::log
