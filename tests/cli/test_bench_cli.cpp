// `dsv4 bench model --json`: the results object alone on stdout (a script pipes it to a JSON parser), the progress
// lines on stderr.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <regex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "common/run_child.h"

namespace {
using dsv4::clitest::ProcResult;
using dsv4::clitest::run_dsv4;

TEST(CliBenchModel, JsonGoesToStdoutAndProgressToStderr) {
  const std::string cfg = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a/config.json";
  const std::vector<std::string> args = {"bench", "model", "--config", cfg, "--device", "cpu", "--prefill", "8",
                                         "--steps", "2", "--no-profile"};
  std::vector<std::string> with_json = args;
  with_json.push_back("--json");
  const ProcResult r = run_dsv4(with_json, "benchjson");
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;  // nothing but the object on stdout
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("steps").get<int>(), 2) << r.out;
  EXPECT_GT(j.at("decode_ms_per_step").get<double>(), 0.0);
  EXPECT_GT(j.at("copy_GBps").get<double>(), 0.0);
  EXPECT_GT(j.at("prefill_matmul_TFLOPs").get<double>(), 0.0);  // the CPU has no FP8 tensor-core peak:
  EXPECT_FALSE(j.contains("prefill_pct_of_fp8_peak"));              // no percentage
  for (const char* progress : {"copy bandwidth", "bench model: dummy", "loaded in", "prefill 8 tokens",
                               "prefill matrix products", "decode batch"}) {
    EXPECT_NE(r.err.find(progress), std::string::npos) << progress << ": " << r.err;
    EXPECT_EQ(r.out.find(progress), std::string::npos) << progress << ": " << r.out;
  }
  EXPECT_EQ(r.err.find("\"decode_ms_per_step\""), std::string::npos) << r.err;
  // without --json: the report on stderr, nothing on stdout
  const ProcResult t = run_dsv4(args, "benchtext");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(t.out, "");
  EXPECT_NE(t.err.find("decode batch"), std::string::npos) << t.err;
}

// "pdl" (Programmatic Dependent Launch of the CUDA decode kernels, backend.h set_cuda_pdl) is reported: never on the
// CPU backend; --no-pdl is accepted there (no effect).
TEST(CliBenchModel, ReportsPdlAndAcceptsNoPdl) {
  const std::string cfg = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a/config.json";
  std::vector<std::string> args = {"bench", "model", "--config", cfg, "--device", "cpu", "--prefill", "0",
                                   "--steps", "1", "--no-profile", "--json"};
  const ProcResult on = run_dsv4(args, "benchpdl");
  args.push_back("--no-pdl");
  const ProcResult off = run_dsv4(args, "benchnopdl");
  ASSERT_EQ(on.code, 0) << on.err;
  ASSERT_EQ(off.code, 0) << off.err;
  EXPECT_FALSE(nlohmann::json::parse(on.out).at("pdl").get<bool>()) << on.out;
  EXPECT_FALSE(nlohmann::json::parse(off.out).at("pdl").get<bool>()) << off.out;
}

// Impossible lengths and layer counts are usage errors before anything runs (a --ctx near INT64_MAX used to pass the
// length check by overflowing it and then fail inside the prefill); -m with --url of bench serve is refused.
TEST(CliBenchModel, ImpossibleLengthsAndLayersAreUsageErrors) {
  const std::string cfg = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a/config.json";
  const std::vector<std::string> base = {"bench", "model", "--config", cfg, "--device", "cpu", "--steps", "1",
                                         "--no-profile"};
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--ctx", "9223372036854775807", "--prefill", "1"},
        std::vector<std::string>{"--ctx", "9223372036854775800", "--prefill", "100"},
        std::vector<std::string>{"--prefill", "9223372036854775807"}, std::vector<std::string>{"--layers", "99"}}) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    const ProcResult r = run_dsv4(args, "benchbad");
    EXPECT_EQ(r.code, 2) << extra[0] << " " << extra[1] << ": " << r.err;
    EXPECT_NE(r.err.find("bench model: --"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  }
  const ProcResult s = run_dsv4({"bench", "serve", "-m", std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a", "--url",
                                 "http://127.0.0.1:1", "--clients", "1", "--tokens", "8", "--requests", "1"},
                                "benchserveboth");
  EXPECT_NE(s.code, 0);
  EXPECT_NE(s.err.find("give one of -m MODEL"), std::string::npos) << s.err;
}

// A port nothing listens on: bound once by this process to get a free number, then closed.
int dead_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return 0;
  close(fd);
  return ntohs(a.sin_port);
}

// A server that is not there: bench serve says why it could not measure (it used to say only "1 failed"), once,
// without running the levels, and exits 1.
TEST(CliBenchServe, ADeadUrlIsAnErrorThatSaysWhy) {
  const int port = dead_port();
  ASSERT_GT(port, 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  const ProcResult r = run_dsv4({"bench", "serve", "--url", url, "--clients", "1,2", "--tokens", "8", "--requests",
                                 "1"},
                                "benchservedead");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("dsv4: error: bench serve:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("could not connect"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.out.find("clients"), std::string::npos) << r.out;  // no level ran
}

// Failed requests of a level are explained once per distinct error (HTTP status and a body excerpt, or what was
// wrong with a 200 answer), with their count; any failure makes the exit code 1. A fake server answers the warm-up
// (max_tokens 2) and then, request by request: 503 with a body, 200 without usage (used to terminate the program:
// an uncaught exception in a client thread), 200 that is not JSON, 503 again, then 200 with usage.
TEST(CliBenchServe, FailedRequestsAreExplainedOncePerDistinctError) {
  httplib::Server fake;
  std::atomic<int> n{0};
  fake.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    if (nlohmann::json::parse(req.body).at("max_tokens") == 2) {
      res.set_content(R"({"usage": {"completion_tokens": 2}})", "application/json");
      return;
    }
    switch (n++) {
      case 0:
      case 3:
        res.status = 503;
        res.set_content(R"({"error": {"message": "the queue is full", "type": "queue_full"}})", "application/json");
        return;
      case 1: res.set_content(R"({"choices": []})", "application/json"); return;
      case 2: res.set_content("<html>hello</html>", "text/html"); return;
      default: res.set_content(R"({"usage": {"completion_tokens": 8}})", "application/json");
    }
  });
  const int port = fake.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { fake.listen_after_bind(); });
  const ProcResult r = run_dsv4({"bench", "serve", "--url", "http://127.0.0.1:" + std::to_string(port), "--clients",
                                 "1", "--tokens", "8", "--requests", "6"},
                                "benchservefail");
  fake.stop();
  serving.join();
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.out.find("(4 failed)"), std::string::npos) << r.out;
  auto count = [&](const std::string& s) {
    size_t c = 0;
    for (size_t at = r.err.find(s); at != std::string::npos; at = r.err.find(s, at + 1)) ++c;
    return c;
  };
  EXPECT_EQ(count("HTTP 503"), 1u) << r.err;
  EXPECT_EQ(count("the queue is full"), 1u) << r.err;
  EXPECT_NE(r.err.find("2 requests failed: HTTP 503"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1 request failed: HTTP 200 without usage.completion_tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1 request failed: HTTP 200 but the body is not JSON: <html>hello</html>"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

// A --url that is not http://HOST:PORT is a usage error (a port that is not a number was an uncaught std::stoi
// exception: "internal error").
TEST(CliBenchServe, AMalformedUrlIsAUsageError) {
  for (const char* url : {"http://127.0.0.1:abc", "http://127.0.0.1", "127.0.0.1:8080", "http://127.0.0.1:99999",
                          "http://:8080"}) {
    const ProcResult r = run_dsv4({"bench", "serve", "--url", url, "--clients", "1"}, "benchserveurl");
    EXPECT_EQ(r.code, 2) << url << ": " << r.err;
    EXPECT_NE(r.err.find("--url must look like http://HOST:PORT"), std::string::npos) << url << ": " << r.err;
  }
}

// A --draft count beyond the checkpoint's drafter (the demo's MTP module drafts at most 4) is a usage error (exit 2)
// found in config.json before the model loads (it used to fail only after the whole plain-decoding baseline, then
// after the load with exit 1), naming --draft, the flag bench spec has (not serve's --spec-draft); a --draft or
// --batch that is not a list of integers in range is a usage error too.
TEST(CliBenchSpec, DraftCountsAreCheckedBeforeAnyRunAndNamedAsTyped) {
  const std::string demo = std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo";
  const ProcResult r = run_dsv4({"bench", "spec", "-m", demo, "--batch", "1", "-n", "8", "--draft", "2,9"}, "specdraft");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("dsv4: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("--draft 9:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("at most 4"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--spec-draft"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.out.find("plain"), std::string::npos) << "a run before the check:\n" << r.out;
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--draft", "1,x"},
                                              std::vector<std::string>{"--draft", "0"},
                                              std::vector<std::string>{"--batch", "99999999999999999999"}}) {
    std::vector<std::string> args = {"bench", "spec", "-m", demo, "-n", "8"};
    args.insert(args.end(), bad.begin(), bad.end());
    const ProcResult u = run_dsv4(args, "specdraftbad");
    EXPECT_EQ(u.code, 2) << bad[0] << " " << bad[1] << ": " << u.err;
    EXPECT_EQ(u.err.rfind("dsv4: error: " + bad[0] + ": ", 0), 0u) << u.err;
  }
}

// --timeline FILE traces one more prefill (backend/timeline_ops.h): the rows (a header and one line per op) into FILE,
// the summary into the JSON ("timeline") and stderr; without a prefill to trace it is a usage error.
TEST(CliBenchModel, TimelineWritesRowsAndSummary) {
  const std::string cfg = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a/config.json";
  const std::filesystem::path dir = dsv4::clitest::scratch_dir("benchtimeline");
  const std::string file = (dir / "timeline.tsv").string();
  const ProcResult r = run_dsv4({"bench", "model", "--config", cfg, "--device", "cpu", "--prefill", "40", "--steps",
                                 "1", "--no-profile", "--json", "--timeline", file},
                                "benchtimeline");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("timeline")) << r.out;
  const nlohmann::json& t = j.at("timeline");
  const int64_t ops = t.at("ops").get<int64_t>();
  EXPECT_GT(ops, 10);
  EXPECT_EQ(t.at("tokens").get<int64_t>(), 40);
  EXPECT_EQ(t.at("file").get<std::string>(), file);
  for (const char* k : {"wall_ms", "before_first_op_ms", "after_last_op_ms", "host_enqueue_ms", "device_intervals_ms",
                        "device_busy_ms", "device_idle_ms", "host_behind_ms", "host_behind_between_ops_ms",
                        "host_behind_in_enqueue_ms", "clock_uncertainty_ms"})
    EXPECT_GE(t.at(k).get<double>(), 0.0) << k;
  EXPECT_NEAR(t.at("device_busy_ms").get<double>() + t.at("device_idle_ms").get<double>(),
              t.at("wall_ms").get<double>(), 1e-6);
  int64_t calls = 0;
  for (const auto& o : t.at("by_op")) calls += o.at("calls").get<int64_t>();
  EXPECT_EQ(calls, ops);
  const std::string tsv = dsv4::clitest::slurp(file);
  EXPECT_EQ(tsv.rfind("i\top\tqueue\t", 0), 0u) << tsv.substr(0, 200);
  EXPECT_EQ(int64_t(std::count(tsv.begin(), tsv.end(), '\n')), ops + 1);
  EXPECT_NE(r.err.find("timeline of a prefill of 40 tokens"), std::string::npos) << r.err;

  const ProcResult bad = run_dsv4({"bench", "model", "--config", cfg, "--device", "cpu", "--prefill", "0", "--steps",
                                   "1", "--no-profile", "--timeline", file},
                                  "benchtimelinebad");
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--timeline traces a prefill"), std::string::npos) << bad.err;
}

// An unwritable --timeline FILE is an error before the model loads, not after the whole run; "" is a usage error.
TEST(CliBenchModel, TimelineFileIsCheckedFirst) {
  const std::string cfg = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a/config.json";
  const ProcResult r = run_dsv4({"bench", "model", "--config", cfg, "--device", "cpu", "--prefill", "8", "--steps",
                                 "1", "--no-profile", "--timeline", "/nonexistent-dir/t.tsv"},
                                "timelinefirst");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot write the timeline to /nonexistent-dir/t.tsv"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("loaded in"), std::string::npos) << "checked after loading:\n" << r.err;
  const ProcResult e =
      run_dsv4({"bench", "model", "--config", cfg, "--prefill", "8", "--timeline", ""}, "timelineempty");
  EXPECT_EQ(e.code, 2) << e.err;
  EXPECT_NE(e.err.find("--timeline"), std::string::npos) << e.err;
}

// bench spec checks --layers as bench model does (it ran the full checkpoint for -m DIR --layers 3, and ran with
// --layers 99), before loading: exit 2.
TEST(CliBenchSpec, LayersAreCheckedLikeBenchModel) {
  const std::string demo = std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo";
  const std::string cfg = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a/config.json";
  const ProcResult r = run_dsv4({"bench", "spec", "--config", cfg, "--layers", "99", "-n", "8"}, "speclayers");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("bench spec: --layers must be in [1, 2], or 0 for all (got 99)"), std::string::npos) << r.err;
  const ProcResult n = run_dsv4({"bench", "spec", "--config", cfg, "--layers", "-1", "-n", "8"}, "speclayersneg");
  EXPECT_EQ(n.code, 2) << n.err;  // (CLI::NonNegativeNumber quoted DBL_MAX in ~300 digits)
  EXPECT_NE(n.err.find("bench spec: --layers must be in [1, 2], or 0 for all (got -1)"), std::string::npos) << n.err;
  const ProcResult c = run_dsv4({"bench", "spec", "-m", demo, "--layers", "3", "-n", "8"}, "speclayersckpt");
  EXPECT_EQ(c.code, 2) << c.err;
  EXPECT_NE(c.err.find("bench spec: --layers needs --load-format dummy"), std::string::npos) << c.err;
  EXPECT_EQ(c.out.find("plain"), std::string::npos) << "a run before the check:\n" << c.out;
}

// The README's bench command lines show an option with a number in brackets ("[--tokens 32]") to state its default:
// each such number is the default its command's --help names ("(default 32)"). The bench serve line showed
// "[--tokens 64] [--requests 3]", the values of a measurement, while the defaults are 32 and 2.
TEST(CliReadme, BracketedNumbersAreTheDefaults) {
  std::ifstream readme(std::string(DSV4_SOURCE_DIR) + "/README.md");
  const std::regex bracket(R"(\[(-{1,2}[a-z][-a-z]*) ([0-9][0-9,.]*)\])");
  int checked = 0;
  for (std::string line; std::getline(readme, line);) {
    if (line.rfind("build/dsv4 ", 0) != 0) continue;
    std::vector<std::string> cmd;  // the command words: up to the first option
    std::istringstream words(line.substr(11));
    for (std::string w; words >> w && w[0] != '-';) cmd.push_back(w);
    for (std::sregex_iterator m(line.begin(), line.end(), bracket), end; m != end; ++m) {
      const std::string option = (*m)[1], value = (*m)[2];
      std::vector<std::string> args = cmd;
      args.push_back("--help");
      const ProcResult h = run_dsv4(args, "readmehelp");
      ASSERT_EQ(h.code, 0) << line << "\n" << h.err;
      // the option's entry: from its name ("  -n,--tokens ...", "  --tokens ...") to the next option's line
      const std::regex entry("\n  (-[a-z],)?" + option + "[ ,]");
      std::smatch at;
      ASSERT_TRUE(std::regex_search(h.out, at, entry)) << option << " not in the help of: " << line << "\n" << h.out;
      const size_t from = size_t(at.position(0)) + 1;
      const std::string text = h.out.substr(from, h.out.find("\n  -", from) - from);
      EXPECT_NE(text.find("default " + value), std::string::npos)
          << "README: " << (*m)[0] << " in\n" << line << "\nbut --help says:\n" << text;
      ++checked;
    }
  }
  EXPECT_GE(checked, 6);  // bench structured -n, bench serve's four, bench spec's three
}

}  // namespace
