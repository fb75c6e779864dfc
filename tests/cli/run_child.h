// Helpers of the `dsv4 generate` / `dsv4 serve` CLI tests: run the built binary as a child process.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace dsv4::clitest {

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::filesystem::path scratch_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("dsv4_cli_" + name + "_" + std::to_string(getpid()));
  std::filesystem::create_directories(d);
  return d;
}

// A started child with stdout/stderr redirected to files in `dir`.
struct Child {
  pid_t pid = -1;
  std::filesystem::path out, err;
  std::string stdout_text() const { return slurp(out); }
  std::string stderr_text() const { return slurp(err); }
  // Waits up to `timeout`; returns the exit code (128 + signal if killed), or -1 on timeout.
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
    auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      int status = 0;
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (std::chrono::steady_clock::now() - t0 > timeout) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// stdin_path: file fed to the child's stdin (default /dev/null).
inline Child start_dsv4(const std::vector<std::string>& args, const std::filesystem::path& dir,
                        const std::string& stdin_path = "/dev/null") {
  Child c;
  c.out = dir / "stdout.txt";
  c.err = dir / "stderr.txt";
  std::vector<std::string> argv_s{DSV4_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  c.pid = fork();
  if (c.pid == 0) {
    int o = ::open(c.out.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    int e = ::open(c.err.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    int in = ::open(stdin_path.c_str(), O_RDONLY);
    if (o < 0 || e < 0 || in < 0) _exit(126);
    dup2(in, 0);
    dup2(o, 1);
    dup2(e, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return c;
}

struct ProcResult {
  int code = -1;
  std::string out, err;
};

inline ProcResult run_dsv4(const std::vector<std::string>& args, const std::string& name = "run",
                           const std::string& stdin_text = "") {
  auto dir = scratch_dir(name);
  std::string in = "/dev/null";
  if (!stdin_text.empty()) {
    in = (dir / "stdin.txt").string();
    std::ofstream(in) << stdin_text;
  }
  Child c = start_dsv4(args, dir, in);
  ProcResult r;
  r.code = c.wait();
  r.out = c.stdout_text();
  r.err = c.stderr_text();
  return r;
}

}  // namespace dsv4::clitest
