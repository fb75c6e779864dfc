// Runs the built `dsv4` binary (DSV4_BINARY) as a child process for the tests that drive the command line
// (tests/cli, and tests/gpu through gpu_cli.h): its stdout and stderr go to files of a scratch folder (stderr into the
// stdout file when merged, as a shell's 2>&1), optional variables set in its environment, an exit code back.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

// stdin_path: file fed to the child's stdin (default /dev/null). env: "NAME=VALUE" entries set in the child's
// environment ("NAME=": the empty value). merge_stderr: stderr into the stdout file (stderr_text() is then empty).
inline Child start_dsv4(const std::vector<std::string>& args, const std::filesystem::path& dir,
                        const std::string& stdin_path = "/dev/null", const std::vector<std::string>& env = {},
                        bool merge_stderr = false) {
  Child c;
  c.out = dir / "stdout.txt";
  c.err = dir / "stderr.txt";
  std::vector<std::string> argv_s{DSV4_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The child's environment, made here (between fork and exec only async-signal-safe calls): ours with `env` on top.
  std::vector<std::string> env_s;
  for (char** v = environ; *v; ++v) {
    const std::string kv = *v;
    const auto same_name = [&](const std::string& e) { return kv.rfind(e.substr(0, e.find('=') + 1), 0) == 0; };
    if (std::none_of(env.begin(), env.end(), same_name)) env_s.push_back(kv);
  }
  env_s.insert(env_s.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& kv : env_s) envp.push_back(kv.data());
  envp.push_back(nullptr);
  c.pid = fork();
  if (c.pid == 0) {
    int o = ::open(c.out.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    int e = ::open(c.err.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    int in = ::open(stdin_path.c_str(), O_RDONLY);
    if (o < 0 || e < 0 || in < 0) _exit(126);
    dup2(in, 0);
    dup2(o, 1);
    dup2(merge_stderr ? o : e, 2);  // (one open file: the two streams interleave as written)
    execve(argv[0], argv.data(), envp.data());
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

// The words of a command line written as one string ("logprobs -m DIR --prompt-ids 1,2"): split at spaces and tabs,
// no quoting.
inline std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

struct MergedResult {
  int rc = -1;      // exit code (128 + signal if killed, -1 on timeout)
  std::string out;  // stdout and stderr, interleaved as written
};

// `env dsv4 args 2>&1`: args and env ("NAME=VALUE" assignments, or empty) as split_words. The timeout is generous:
// the GPU tests run whole benchmarks this way (ctest's timeout still applies).
inline MergedResult run_dsv4_merged(const std::string& args, const std::string& env = "",
                                    std::chrono::milliseconds timeout = std::chrono::hours(2)) {
  Child c = start_dsv4(split_words(args), scratch_dir("merged"), "/dev/null", split_words(env), /*merge_stderr=*/true);
  MergedResult r;
  r.rc = c.wait(timeout);
  r.out = c.stdout_text();
  return r;
}

}  // namespace dsv4::clitest
