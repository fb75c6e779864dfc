// `dsv4 serve` end to end on the demo model: startup on a free port, a request, an error, clean SIGTERM shutdown.
#include <gtest/gtest.h>
#include <httplib.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "common/run_child.h"

namespace {
using namespace dsv4::clitest;
using json = nlohmann::json;
using namespace std::chrono_literals;

const std::string kTiny = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a";
const std::string kDemo = std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo";

// Port printed on stderr ("... on http://127.0.0.1:PORT ..."), 0 if the child has not printed it within `timeout`.
int wait_port(Child& c, std::chrono::milliseconds timeout) {
  auto t0 = std::chrono::steady_clock::now();
  std::regex re("http://127\\.0\\.0\\.1:([0-9]+)");
  while (std::chrono::steady_clock::now() - t0 < timeout) {
    std::smatch m;
    std::string err = c.stderr_text();
    if (std::regex_search(err, m, re)) return std::stoi(m[1]);
    std::this_thread::sleep_for(20ms);
  }
  return 0;
}

TEST(CliServe, ServesAndShutsDownCleanlyOnSigterm) {
  ASSERT_TRUE(std::filesystem::exists(kDemo + "/tokenizer.json")) << "demo model missing: " << kDemo;
  auto dir = scratch_dir("serve");
  Child c = start_dsv4({"serve", "-m", kDemo, "--port", "0", "--ctx", "512", "--threads", "1", "--parallel", "3",
                        "--batch-tokens", "64", "--kv-memory", "64M", "--queue", "5"},
                       dir);
  int port = wait_port(c, 60s);
  ASSERT_GT(port, 0) << c.stderr_text();
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  for (int i = 0; i < 500 && !cli.Get("/health"); ++i) std::this_thread::sleep_for(20ms);
  auto h = cli.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = cli.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(json::parse(m->body)["data"][0]["id"], "dsv4-demo");

  auto bad = cli.Post("/v1/chat/completions", "{\"messages\": [", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["type"], "invalid_request_error");
  auto over = cli.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 600})", "application/json");
  ASSERT_TRUE(over);
  EXPECT_EQ(over->status, 400);
  EXPECT_EQ(json::parse(over->body)["error"]["code"], "context_length_exceeded");

  auto ok = cli.Post("/v1/completions", R"({"prompt": "The president", "max_tokens": 3, "temperature": 0})",
                     "application/json");
  ASSERT_TRUE(ok);
  ASSERT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(json::parse(ok->body)["usage"]["completion_tokens"], 3);
  // The engine options arrived: 3 slots, 64 MiB of state, 3 + 5 admitted at once.
  auto h2 = json::parse(cli.Get("/health")->body);
  EXPECT_EQ(h2["parallel"], 3);
  EXPECT_EQ(h2["queue"], 5);
  auto metrics = cli.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("\ndsv4_state_slots_total 3\n"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("\ndsv4_requests_capacity 8\n"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("\ndsv4_generated_tokens_total 3\n"), std::string::npos) << metrics->body;
  const auto pos = metrics->body.find("\ndsv4_state_bytes ");
  ASSERT_NE(pos, std::string::npos);
  const double state_bytes = std::stod(metrics->body.substr(pos + 18));
  EXPECT_LE(state_bytes, 64.0 * 1024 * 1024);
  EXPECT_GT(state_bytes, 32.0 * 1024 * 1024);

  kill(c.pid, SIGTERM);
  EXPECT_EQ(c.wait(20s), 0) << c.stderr_text();
  EXPECT_NE(c.stderr_text().find("stopped"), std::string::npos) << c.stderr_text();
}

TEST(CliServe, RefusesModelsWithoutTokenizerAndBadOptions) {
  ProcResult r = run_dsv4({"serve", "-m", kTiny, "--port", "0"}, "serve_err");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("tokenizer.json"), std::string::npos) << r.err;
  ProcResult p = run_dsv4({"serve", "-m", kTiny, "--port", "70000"}, "serve_err2");
  EXPECT_NE(p.code, 0);
  ProcResult q = run_dsv4({"serve", "-m", "/nonexistent", "--port", "0"}, "serve_err3");
  EXPECT_EQ(q.code, 1);
  EXPECT_NE(q.err.find("dsv4: error:"), std::string::npos) << q.err;
}

TEST(CliServe, APortInUseIsAClearErrorAndANonZeroExit) {
  // the port's holder even allows sharing (SO_REUSEPORT, as cpp-httplib's default socket options set): dsv4 must
  // not join it
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int yes = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &yes, sizeof yes);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string port = std::to_string(ntohs(a.sin_port));
  ProcResult r = run_dsv4({"serve", "-m", kDemo, "--port", port, "--threads", "1"}, "serve_port_in_use");
  ::close(fd);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("dsv4: error: cannot listen on 127.0.0.1:" + port + ": the address is already in use"),
            std::string::npos)
      << r.err;
  // found before the model loads
  EXPECT_EQ(r.err.find("loading"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("device:"), std::string::npos) << r.err;
}

}  // namespace
