// `dsv4 bench structured`: decode speed with and without a JSON-schema constraint (src/cli/bench_structured.cpp).
#pragma once
#include "cli/command.h"

namespace dsv4::cli {

void setup_bench_structured(CLI::App& app, Runner& run);

}  // namespace dsv4::cli
