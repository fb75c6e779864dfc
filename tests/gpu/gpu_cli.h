// The GPU tests' way to run the built `dsv4` binary (the CLI tests' child process, common/run_child.h): the command
// line's output (stdout + stderr, interleaved as written) and exit code, and the JSON object a `--json` run prints
// last.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "common/run_child.h"

namespace dsv4::test::gpu {

using CliResult = clitest::MergedResult;  // rc, out

// `env dsv4 args 2>&1` (words separated by spaces, no quoting; env: "NAME=VALUE" assignments, or empty).
inline CliResult cli(const std::string& args, const std::string& env = "") { return clitest::run_dsv4_merged(args, env); }

// The last JSON object of a --json run's output (progress lines on stderr come before it).
inline nlohmann::json cli_json(const CliResult& r) {
  const size_t at = r.out.rfind("\n{");
  return nlohmann::json::parse(at == std::string::npos ? r.out : r.out.substr(at + 1));
}

}  // namespace dsv4::test::gpu
