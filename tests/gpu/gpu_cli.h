// The GPU tests' way to run the built `dsv4` binary: the command line's output (stdout + stderr) and exit code, and
// the JSON object a `--json` run prints last.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace dsv4::test::gpu {

struct CliResult {
  int rc = -1;
  std::string out;  // stdout + stderr
};

// `env dsv4 args 2>&1` through the shell (env: variable assignments, or empty).
inline CliResult cli(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + " " + std::string(DSV4_BINARY) + " " + args + " 2>&1";
  CliResult r;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  const int st = pclose(f);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// The last JSON object of a --json run's output (progress lines on stderr come before it).
inline nlohmann::json cli_json(const CliResult& r) {
  const size_t at = r.out.rfind("\n{");
  return nlohmann::json::parse(at == std::string::npos ? r.out : r.out.substr(at + 1));
}

}  // namespace dsv4::test::gpu
