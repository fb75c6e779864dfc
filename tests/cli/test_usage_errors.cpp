// Usage errors (unknown flags, missing subcommand, out-of-range values) are one-line `dsv4: error:` messages with a
// non-zero exit, like every other dsv4 error; --help still prints help and exits 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/run_child.h"

namespace {
using dsv4::clitest::ProcResult;
using dsv4::clitest::run_dsv4;

const std::string kDemo = std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo";

void expect_one_line_error(const std::vector<std::string>& args) {
  ProcResult r = run_dsv4(args);
  std::string joined;
  for (const auto& a : args) joined += a + " ";
  EXPECT_NE(r.code, 0) << joined;
  EXPECT_EQ(r.err.rfind("dsv4: error: ", 0), 0u) << joined << "\n" << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << joined << "\n" << r.err;
}

TEST(CliUsage, ParseErrorsAreOneLine) {
  expect_one_line_error({});
  expect_one_line_error({"generate", "-m", kDemo, "-p", "hi", "--bogus"});
  expect_one_line_error({"serve", "-m", kDemo, "--port", "70000"});
  expect_one_line_error({"logprobs", "-m", kDemo, "--prompt-ids", "1", "--top-k", "0"});
}

// An unknown command names itself and lists the valid ones (CLI11 alone said "A subcommand is required"); exit 2.
TEST(CliUsage, UnknownCommandListsTheValidOnes) {
  for (const auto& [args, valid] : std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>>{
           {{"frobnicate"}, {"generate", "chat", "serve", "bench", "logprobs", "info"}},
           {{"-v", "frobnicate", "-m", kDemo}, {"generate", "serve"}},
           {{"bench", "frobnicate"}, {"gemm", "model", "serve", "spec"}}}) {
    const ProcResult r = run_dsv4(args);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(r.err.rfind("dsv4: error: unknown command 'frobnicate'", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("--help"), std::string::npos) << r.err;
    for (const auto& v : valid) EXPECT_NE(r.err.find(v), std::string::npos) << v << ": " << r.err;
    EXPECT_EQ(r.err.find("A subcommand is required"), std::string::npos) << r.err;
  }
  // a known command's own parse errors keep CLI11's message
  const ProcResult g = run_dsv4({"generate", "frob", "-m", kDemo});
  EXPECT_EQ(g.code, 2) << g.err;
  EXPECT_NE(g.err.find("frob"), std::string::npos) << g.err;
  EXPECT_EQ(g.err.find("unknown command"), std::string::npos) << g.err;
}

TEST(CliUsage, ImpossibleValuesAreRejected) {
  expect_one_line_error({"generate", "-m", kDemo, "-p", "hi", "-n", "3", "--top-k", "-5"});
  expect_one_line_error({"generate", "-m", kDemo, "-p", "hi", "-n", "3", "--threads", "-3"});
  expect_one_line_error({"generate", "-m", kDemo, "-p", "hi", "-n", "3", "--stop", ""});  // before the model loads
  EXPECT_EQ(run_dsv4({"generate", "-m", kDemo, "-p", "hi", "-n", "3", "--stop", ""}).code, 2);
  expect_one_line_error({"chat", "-m", kDemo, "--ctx", "0"});
  expect_one_line_error({"serve", "-m", kDemo, "--port", "0", "--reasoning-budget", "0"});
  expect_one_line_error({"serve", "-m", kDemo, "--port", "0", "--api-key-file", "/nonexistent/key"});
  expect_one_line_error({"serve", "-m", kDemo, "--port", "0", "--api-key", "a", "--api-key-file", "/tmp/k"});
  expect_one_line_error({"serve", "-m", kDemo, "--port", "0", "--parallel", "0"});
  expect_one_line_error({"serve", "-m", kDemo, "--port", "0", "--batch-tokens", "0"});
  expect_one_line_error({"serve", "-m", kDemo, "--port", "0", "--kv-memory", "lots"});
  expect_one_line_error({"serve", "-m", kDemo, "--port", "0", "--cache-dir", "/proc/dsv4-cache"});  // cannot create
  expect_one_line_error({"serve", "-m", kDemo, "--port", "0", "--cache-dir", "/dev/null"});         // not a folder
  expect_one_line_error({"serve", "-m", kDemo, "--port", "0", "--kv-memory", "8X"});
  expect_one_line_error({"serve", "-m", kDemo, "--port", "0", "--kv-memory", "-1G"});
  expect_one_line_error({"serve", "-m", kDemo, "--port", "0", "--cache-size", "0.5"});
}

// `--api-key "$KEY"` with KEY unset must not start a server without authentication: exit 2 before the model loads.
TEST(CliUsage, AnEmptyApiKeyIsAUsageError) {
  for (const char* key : {"", " ", "\t"}) {
    // (without the check the server would start and serve: wait a bounded time, the child is killed after)
    dsv4::clitest::Child c = dsv4::clitest::start_dsv4({"serve", "-m", kDemo, "--port", "0", "--api-key", key},
                                                       dsv4::clitest::scratch_dir("empty_api_key"));
    EXPECT_EQ(c.wait(std::chrono::seconds(20)), 2) << "--api-key '" << key << "'";
    const std::string err = c.stderr_text();
    EXPECT_EQ(err.rfind("dsv4: error: --api-key", 0), 0u) << err;
    EXPECT_NE(err.find("empty"), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
}

TEST(CliUsage, ThreadCountsOutsideTheirRangeAreOneShortLine) {
  for (const char* cmd : {"generate", "profile-experts"}) {
    for (const char* v : {"-1", "abc", "100000"}) {
      std::vector<std::string> args = {cmd, "-m", kDemo, "--threads", v};
      if (std::string(cmd) == "generate") args.insert(args.end(), {"-p", "hi", "-n", "1"});
      else args.insert(args.end(), {"--prompts", kDemo + "/config.json", "-o", "/tmp/dsv4-test-profile.json"});
      expect_one_line_error(args);
      const ProcResult r = run_dsv4(args);
      std::string want = "'";
      want += v;
      want += std::string(v) == "abc" ? "' is not a decimal integer" : "' is not an integer in [0, 4096]";
      EXPECT_NE(r.err.find(want), std::string::npos) << cmd << " --threads " << v << ": " << r.err;
      EXPECT_LT(r.err.size(), 200u) << r.err;  // (the range of a double used to print 300 digits)
    }
  }
}

// Flag values the command line alone shows to be wrong (sampling ranges, --device, bench model's counts) are usage
// errors of their flag: one line naming it, exit 2, and the model is not even looked at (the folder does not exist:
// the error must not be "not a model folder").
TEST(CliUsage, BadFlagValuesAreRefusedBeforeTheModelLoads) {
  const std::string none = "/nonexistent/dsv4-model";
  struct Case {
    std::vector<std::string> args;
    std::string flag;
  };
  std::vector<Case> cases;
  const std::vector<std::pair<std::string, std::vector<std::string>>> base{
      {"generate", {"generate", "-m", none, "-p", "hi"}}, {"chat", {"chat", "-m", none}}};
  for (const auto& [cmd, b] : base) {
    for (const auto& [flag, v] : std::vector<std::pair<std::string, std::string>>{
             {"--temp", "-0.5"}, {"--temp", "101"}, {"--temp", "nan"}, {"--top-p", "0"}, {"--top-p", "1.5"},
             {"--top-p", "-1"}, {"--top-k", "-2"}, {"--min-p", "-0.1"}, {"--min-p", "2"}, {"-n", "0"},
             {"--device", ""}, {"--device", "gpu7"}, {"--device", "cuda:x"}, {"--device", "cuda:"}}) {
      if (cmd == "generate" && flag == "-n") continue;  // generate: -n -1 is "until the context is full"
      auto a = b;
      a.insert(a.end(), {flag, v});
      cases.push_back({a, flag == "-n" ? "--max-tokens" : flag});
    }
  }
  for (const auto& [flag, v] : std::vector<std::pair<std::string, std::string>>{
           {"--repeat-penalty", "0"}, {"--repeat-penalty", "11"}, {"--presence-penalty", "3"},
           {"--frequency-penalty", "-2.5"}, {"-n", "-2"}, {"-n", "0"}})
    cases.push_back({{"generate", "-m", none, "-p", "hi", flag, v}, flag == "-n" ? "--max-tokens" : flag});
  for (const char* d : {"", "gpu7", "cuda:x"}) {
    cases.push_back({{"serve", "-m", none, "--port", "0", "--device", d}, "--device"});
    cases.push_back({{"logprobs", "-m", none, "--prompt-ids", "1", "--device", d}, "--device"});
    cases.push_back({{"bench", "model", "-m", none, "--device", d}, "--device"});
  }
  cases.push_back({{"logprobs", "-m", none, "--prompt-ids", ""}, "--prompt-ids"});
  cases.push_back({{"logprobs", "-m", none, "--prompt-ids", "1,a"}, "--prompt-ids"});
  cases.push_back({{"logprobs", "-m", none, "--prompt-ids", "1", "--numerics", "fast"}, "--numerics"});
  cases.push_back({{"bench", "model", "-m", none, "--steps", "0"}, "--steps"});
  cases.push_back({{"bench", "model", "-m", none, "--batch", "0"}, "--batch"});
  cases.push_back({{"bench", "model", "-m", none, "--prefill", "-1"}, "--prefill"});
  cases.push_back({{"bench", "model", "-m", none, "--numerics", "fast"}, "--numerics"});
  cases.push_back({{"bench", "model", "-m", none, "--load-format", "gguf"}, "--load-format"});
  cases.push_back({{"serve", "-m", none, "--port", "0", "--kv-memory", "lots"}, "--kv-memory"});
  // Every enumerated flag of every command: --numerics, --load-format, --gpu-experts (its syntax).
  for (const std::vector<std::string>& b : std::vector<std::vector<std::string>>{
           {"generate", "-m", none, "-p", "hi"},
           {"chat", "-m", none},
           {"serve", "-m", none, "--port", "0"},
           {"profile-experts", "-m", none, "--prompts", none, "-o", "/tmp/dsv4-test-profile.json"},
           {"bench", "gemm"},
           {"bench", "serve", "-m", none},
           {"bench", "spec", "-m", none},
           {"bench", "structured", "-m", none}}) {
    auto a = b;
    a.insert(a.end(), {"--numerics", "foo"});
    cases.push_back({a, "--numerics"});
  }
  cases.push_back({{"bench", "spec", "-m", none, "--load-format", "gguf"}, "--load-format"});
  for (const char* g : {"many", "-1", "3x"}) {
    cases.push_back({{"generate", "-m", none, "-p", "hi", "--gpu-experts", g}, "--gpu-experts"});
    cases.push_back({{"serve", "-m", none, "--port", "0", "--gpu-experts", g}, "--gpu-experts"});
    cases.push_back({{"generate", "-m", none, "-p", "hi", "--stage-tokens", g}, "--stage-tokens"});
    cases.push_back({{"bench", "model", "-m", none, "--stage-tokens", g}, "--stage-tokens"});
  }
  for (const char* k : {"nan", "-nan", "0", "inf"})  // (CLI::Range let NaN through: the server ran with it)
    cases.push_back({{"serve", "-m", none, "--port", "0", "--keepalive", k}, "--keepalive"});
  for (const char* mib : {"0", "-3", "lots"})
    cases.push_back({{"serve", "-m", none, "--port", "0", "--stage-mib", mib}, "--stage-mib"});
  for (const auto& c : cases) {
    std::string joined;
    for (const auto& a : c.args) joined += "'" + a + "' ";
    const ProcResult r = run_dsv4(c.args, "flagerr");
    EXPECT_EQ(r.code, 2) << joined << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("dsv4: error: ", 0), 0u) << joined << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << joined << "\n" << r.err;
    EXPECT_NE(r.err.find(c.flag), std::string::npos) << joined << "\n" << r.err;
    EXPECT_EQ(r.err.find("not a model folder"), std::string::npos) << joined << "\n" << r.err;
    EXPECT_EQ(r.err.find("loading"), std::string::npos) << joined << "\n" << r.err;
  }
}

// The checks accept the documented edges of every range.
TEST(CliUsage, SamplingRangeEdgesAreAccepted) {
  const std::string tiny = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a";
  for (const auto& [flag, v] : std::vector<std::pair<std::string, std::string>>{
           {"--temp", "0"}, {"--temp", "100"}, {"--top-p", "1"}, {"--top-p", "0.01"}, {"--min-p", "0"},
           {"--min-p", "1"}, {"--top-k", "-1"}, {"--repeat-penalty", "10"}, {"--presence-penalty", "-2"},
           {"--frequency-penalty", "2"}, {"--device", "cpu"}}) {
    const ProcResult r = run_dsv4({"generate", "-m", tiny, "--prompt-ids", "0,1", "-n", "1", flag, v}, "edges");
    EXPECT_EQ(r.code, 0) << flag << " " << v << ": " << r.err;
  }
}

TEST(CliUsage, DummyWeightsBeyondHostMemoryAreRefusedUpFront) {
  // all 43 V4-Flash layers as dummy weights on the CPU need ~150 GiB: refused before anything is allocated (it used
  // to fill the host memory until the OOM killer came)
  uint64_t avail_kb = 0;
  {
    std::ifstream f("/proc/meminfo");
    std::string key, unit;
    uint64_t kb = 0;
    while (f >> key >> kb >> unit)
      if (key == "MemAvailable:") avail_kb = kb;
  }
  if (avail_kb == 0 || avail_kb > (uint64_t(140) << 20)) GTEST_SKIP() << "this machine could hold the dummy model";
  ProcResult r = run_dsv4({"bench", "model", "--config", std::string(DSV4_SOURCE_DIR) +
                           "/tests/data/configs/deepseek-v4-flash-config.json", "--load-format", "dummy", "--device",
                           "cpu", "--prefill", "16", "--steps", "1"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("GiB of host memory but"), std::string::npos) << r.err;
}

TEST(CliUsage, TooLittleStateMemoryIsAClearError) {
  // The state layout follows from config.json: a usage error (one line, exit 2) before the model loads.
  ProcResult r = run_dsv4({"serve", "-m", kDemo, "--port", "0", "--kv-memory", "1K"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("dsv4: error: --kv-memory: state memory of 1024 bytes cannot hold 16 sequence slots"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("loading"), std::string::npos) << "checked only after loading the model:\n" << r.err;
  // the same with --parallel 2 and a fraction of the CPU's 1G default that is still too small
  ProcResult f = run_dsv4({"serve", "-m", kDemo, "--port", "0", "--parallel", "2", "--kv-memory", "0.000001"});
  EXPECT_EQ(f.code, 2);
  EXPECT_NE(f.err.find("cannot hold 2 sequence slots"), std::string::npos) << f.err;
  EXPECT_EQ(f.err.find("loading"), std::string::npos) << f.err;
}

// A bad value of an option with a short and a long name names both spellings, so that the flag the user typed is
// in the message ("bench structured -n 0" said only "--tokens").
TEST(CliUsage, BadValuesOfShortFlagsNameBothSpellings) {
  for (const auto& [args, flag] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"bench", "structured", "-m", kDemo, "-n", "0"}, "-n/--tokens"},
           {{"bench", "structured", "-m", kDemo, "--tokens", "0"}, "-n/--tokens"},
           {{"bench", "spec", "-m", kDemo, "-n", "1"}, "-n/--tokens"},
           {{"generate", "-m", kDemo, "-p", "hi", "-n", "0"}, "-n/--max-tokens"},
           {{"chat", "-m", kDemo, "-n", "0"}, "-n/--max-tokens"}}) {
    const ProcResult r = run_dsv4(args, "shortflag");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(r.err.rfind("dsv4: error: " + flag + ": ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// Integers beyond their option's range are usage errors that quote what was typed, before the model loads: CLI11's
// conversion saturated values beyond 64 bits (--seed 18446744073709551616 ran with seed 2^63 - 1, --chunk 1e20 with one
// prefill) and a negative seed silently meant "random". The edges are accepted.
TEST(CliUsage, OutOfRangeIntegersAreUsageErrors) {
  const std::string none = "/nonexistent/dsv4-model";
  for (const auto& [args, flag, typed] : std::vector<std::tuple<std::vector<std::string>, std::string, std::string>>{
           {{"generate", "-m", none, "-p", "hi", "--seed", "18446744073709551616"}, "--seed", "18446744073709551616"},
           {{"generate", "-m", none, "-p", "hi", "--seed", "-1"}, "--seed", "-1"},
           {{"generate", "-m", none, "-p", "hi", "--seed", "1.5"}, "--seed", "1.5"},
           {{"chat", "-m", none, "--seed", "99999999999999999999999"}, "--seed", "99999999999999999999999"},
           {{"chat", "-m", none, "--seed", "-3"}, "--seed", "-3"},
           {{"generate", "-m", none, "-p", "hi", "--ctx", "99999999999999999999"}, "--ctx", "99999999999999999999"},
           {{"generate", "-m", none, "-p", "hi", "--ctx", "-1"}, "--ctx", "-1"},
           {{"generate", "-m", none, "-p", "hi", "-n", "99999999999999999999"}, "--max-tokens", "99999999999999999999"},
           {{"logprobs", "-m", none, "--prompt-ids", "1", "--chunk", "99999999999999999999"}, "--chunk",
            "99999999999999999999"},
           {{"logprobs", "-m", none, "--prompt-ids", "1", "--chunk", "-1"}, "--chunk", "-1"}}) {
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    const ProcResult r = run_dsv4(args, "intrange");
    EXPECT_EQ(r.code, 2) << joined << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("dsv4: error: ", 0), 0u) << joined << "\n" << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << joined << "\n" << r.err;
    EXPECT_NE(r.err.find(typed), std::string::npos) << joined << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << joined << "\n" << r.err;
  }
  const std::string tiny = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a";
  for (const char* seed : {"0", "18446744073709551615"}) {
    const ProcResult r = run_dsv4({"generate", "-m", tiny, "--prompt-ids", "0,1", "-n", "1", "--seed", seed}, "seed");
    EXPECT_EQ(r.code, 0) << seed << ": " << r.err;
  }
  const ProcResult c = run_dsv4({"logprobs", "-m", tiny, "--prompt-ids", "0,1,2", "--chunk", "0"}, "chunk0");
  EXPECT_EQ(c.code, 0) << c.err;
}

// Range errors of numeric options have one form and quote the value as typed: integer options say "'S' is not an
// integer in [lo, hi]" (chat -n 0 printed CLI11's "Value 0 not in range 1 to 1099511627776"), float options the
// field's range and the typed value (a finite value beyond a float's range said "got inf").
TEST(CliUsage, RangeErrorsQuoteTheValueAsTyped) {
  const std::string none = "/nonexistent/dsv4-model";
  for (const auto& [args, want] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"chat", "-m", none, "-n", "0"}, "-n/--max-tokens: '0' is not an integer in [1, 1099511627776]"},
           {{"chat", "-m", none, "--ctx", "1"}, "--ctx: '1' is not an integer in [2, 1099511627776]"},
           {{"serve", "-m", none, "--port", "70000"}, "--port: '70000' is not an integer in [0, 65535]"},
           {{"logprobs", "-m", none, "--prompt-ids", "1", "--top-k", "0"}, "--top-k: '0' is not an integer in [1, "},
           {{"generate", "-m", none, "-p", "hi", "--presence-penalty", "1e308"},
            "--presence-penalty: presence_penalty must be in [-2, 2], got 1e308"},
           {{"generate", "-m", none, "-p", "hi", "--frequency-penalty", "-1e39"},
            "--frequency-penalty: frequency_penalty must be in [-2, 2], got -1e39"},
           {{"chat", "-m", none, "--temp", "1e400"}, "--temp: temperature must be in [0, 100], got 1e400"},
           {{"generate", "-m", none, "-p", "hi", "--repeat-penalty", "3.5e38"},
            "--repeat-penalty: repetition_penalty must be in (0, 10], got 3.5e38"},
           {{"generate", "-m", none, "-p", "hi", "--top-p", "1e-50"},
            "--top-p: top_p must be in (0, 1], got 1e-50 (0 as a 32-bit float)"},
           {{"serve", "-m", none, "--kv-memory", "1e308"}, "--kv-memory: '1e308' is out of range (1 byte to 16 EiB)"}}) {
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    const ProcResult r = run_dsv4(args, "rangeform");
    EXPECT_EQ(r.code, 2) << joined << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("dsv4: error: " + want, 0), 0u) << joined << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << joined << "\n" << r.err;
    EXPECT_EQ(r.err.find("inf"), std::string::npos) << joined << "\n" << r.err;
    EXPECT_EQ(r.err.find("Value "), std::string::npos) << joined << "\n" << r.err;
  }
}

TEST(CliUsage, HelpStillWorks) {
  ProcResult r = run_dsv4({"generate", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--top-k"), std::string::npos);
}


// Every integer option reads its value as decimal (CLI11 alone read "010" as octal 8 and "0x10" as hex 16): a
// leading zero is still decimal, and hex or any other non-decimal text is a usage error that names the option.
TEST(CliUsage, IntegerOptionsAreDecimal) {
  const std::string cfg = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a/config.json";
  const ProcResult r = run_dsv4(
      {"bench", "model", "--config", cfg, "--device", "cpu", "--prefill", "010", "--steps", "1", "--no-profile"},
      "decimal");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("prefill 10 tokens"), std::string::npos) << r.err;

  for (const auto& [args, option] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"serve", "-m", kDemo, "--port", "0x10"}, "--port"},
           {{"serve", "-m", kDemo, "--ctx", "0x100"}, "--ctx"},
           {{"generate", "-m", kDemo, "-p", "hi", "--threads", "0x10"}, "--threads"},
           {{"generate", "-m", kDemo, "-p", "hi", "-n", "1e3"}, "-n/--max-tokens"},
           {{"bench", "serve", "--tokens", "0x10"}, "--tokens"},
           {{"bench", "structured", "-m", kDemo, "-n", "0x10"}, "-n/--tokens"},
           {{"bench", "spec", "-m", kDemo, "-n", "0x10"}, "-n/--tokens"},
           {{"bench", "model", "--config", cfg, "--prefill", "0b1"}, "--prefill"},
           {{"logprobs", "-m", kDemo, "--prompt-ids", "1", "--top-k", "0x1"}, "--top-k"}}) {
    const ProcResult u = run_dsv4(args, "decimalbad");
    EXPECT_EQ(u.code, 2) << option << ": " << u.err;
    EXPECT_NE(u.err.find(option + ": '" + args.back() + "' is not a decimal integer"), std::string::npos) << u.err;
  }
  // 010000 is 10000 (octal it was 4096, in range): out of range
  const ProcResult t = run_dsv4({"generate", "-m", kDemo, "-p", "hi", "--threads", "010000"}, "decimalrange");
  EXPECT_EQ(t.code, 2) << t.err;
  EXPECT_NE(t.err.find("10000"), std::string::npos) << t.err;
}

// bench gemm's bounds are readable (CLI::PositiveNumber quoted DBL_MAX in ~300 digits) and NaN is no number of
// seconds.
TEST(CliUsage, BenchGemmRangesAreReadable) {
  for (const auto& [option, value] : std::vector<std::pair<std::string, std::string>>{{"--seconds", "0"},
                                                                                      {"--seconds", "inf"},
                                                                                      {"--seconds", "nan"},
                                                                                      {"--seconds", "-1"},
                                                                                      {"--mem-mib", "0"},
                                                                                      {"--prefill-tokens", "0"}}) {
    const ProcResult r = run_dsv4({"bench", "gemm", option, value}, "gemmrange");
    EXPECT_EQ(r.code, 2) << option << " " << value << ": " << r.err;
    EXPECT_EQ(r.err.rfind("dsv4: error: " + option + ": ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("'" + value + "'"), std::string::npos) << r.err;
    EXPECT_LT(r.err.size(), 160u) << r.err;
  }
}

// An empty --host ("$HOST" unset) is a usage error, not a server listening on whatever "" resolves to.
TEST(CliUsage, EmptyHostIsAUsageError) {
  const ProcResult r = run_dsv4({"serve", "-m", kDemo, "--host", "", "--port", "0"}, "emptyhost");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--host: needs an address"), std::string::npos) << r.err;
}

// Every comma-separated integer list option parses its text the same way (cli/int_list_option.h): an empty entry,
// an entry that is not a decimal integer or one out of the option's range is a usage error naming the option and
// the entry, before anything is loaded. (bench serve --clients dropped empty entries: "1,,2" ran as 1,2; bench spec
// --batch "1,2," ran as 1,2.)
TEST(CliUsage, IntegerListOptionsParseAlike) {
  const std::string none = "/nonexistent/dsv4-model";
  struct ListOption {
    std::vector<std::string> command;
    std::string option, beyond;  // beyond: an entry out of its range
  };
  const std::vector<ListOption> lists{{{"bench", "serve", "-m", none}, "--clients", "0"},
                                      {{"bench", "serve", "-m", none}, "--clients", "4097"},
                                      {{"bench", "spec", "-m", none}, "--batch", "257"},
                                      {{"bench", "spec", "-m", none}, "--draft", "0"},
                                      {{"generate", "-m", none}, "--prompt-ids", "-1"},
                                      {{"logprobs", "-m", none}, "--prompt-ids", "2147483648"}};
  for (const ListOption& l : lists) {
    for (const auto& [value, entry] : std::vector<std::pair<std::string, std::string>>{
             {"1,,2", "empty entry 2 in '1,,2'"},
             {",1", "empty entry 1 in ',1'"},
             {"1,", "empty entry 2 in '1,'"},
             {"1, ,2", "empty entry 2"},
             {"", "is empty"},
             {"1,x", "'x' (entry 2 of '1,x')"},
             {"1,0x10", "'0x10' (entry 2 of '1,0x10')"},
             {"1,1.5", "'1.5'"},
             {"1,99999999999999999999", "'99999999999999999999'"},
             {"1," + l.beyond, "'" + l.beyond + "' (entry 2"},
             {l.beyond, "'" + l.beyond + "' is not an integer in ["}}) {
      std::vector<std::string> args = l.command;
      args.insert(args.end(), {l.option, value});
      const ProcResult r = run_dsv4(args, "intlist");
      const std::string what = l.option + " '" + value + "': ";
      EXPECT_EQ(r.code, 2) << what << r.err;
      EXPECT_EQ(r.err.rfind("dsv4: error: " + l.option + ": ", 0), 0u) << what << r.err;
      EXPECT_NE(r.err.find(entry), std::string::npos) << what << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << r.err;
    }
  }
  // accepted: spaces around entries, leading zeros (decimal), the range's edges
  const std::string tiny = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a";
  const ProcResult g =
      run_dsv4({"generate", "-m", tiny, "--prompt-ids", " 0, 05 ,255", "-n", "1", "--json", "--threads", "1"}, "lists");
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(nlohmann::json::parse(g.out).at("prompt_ids"), nlohmann::json::parse("[0, 5, 255]")) << g.out;
}

// A value impossible for the model named, that its config.json tells before anything loads, is a usage error like
// one the command line alone refutes: exit 2, one line, nothing printed before it (these exited 1, most after the
// model had loaded). Also: two commands' missing or conflicting inputs.
TEST(CliUsage, ValuesImpossibleForTheModelAreUsageErrors) {
  const std::string tiny = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a";
  const std::string dspark = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-dspark";
  const std::string cfg = tiny + "/config.json";
  for (const auto& [args, needle] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"bench", "serve", "-m", kDemo, "--clients", "0"}, "--clients: '0'"},
           {{"bench", "model", "-m", kDemo, "--layers", "3"}, "--layers needs --load-format dummy"},
           {{"generate", "-m", kDemo, "-p", "hi", "--ctx", "99999999"}, "--ctx 99999999: the model has 1048576"},
           {{"generate", "-m", tiny, "--prompt-ids", "0,999999"}, "id 999999 (entry 2) is outside the model's vocab"},
           {{"logprobs", "-m", tiny, "--prompt-ids", "0,256"}, "id 256 (entry 2) is outside the model's vocabulary"},
           {{"generate", "-m", tiny, "--prompt-ids", "0,1,2", "--ctx", "3"}, "no room to generate"},
           {{"generate", "-m", dspark, "--prompt-ids", "0", "--spec-draft", "6"}, "--spec-draft 6: the checkpoint's"},
           {{"chat", "-m", dspark, "--spec-draft", "6"}, "at most its block size 5"},
           {{"serve", "-m", dspark, "--port", "0", "--spec-draft", "6"}, "at most its block size 5"},
           {{"bench", "spec", "-m", kDemo, "--draft", "2,5"}, "--draft 5: the checkpoint's drafter is its MTP module"},
           {{"generate", "-m", kDemo, "-p", "x", "--n-cpu-moe", "7"}, "--n-cpu-moe 7: the model has 6 layers"},
           {{"chat", "-m", kDemo, "--gpu-experts", "9"}, "experts per layer in 0 .. 8"},
           {{"serve", "-m", kDemo, "--port", "0", "--gpu-experts", "9"}, "experts per layer in 0 .. 8"},
           {{"logprobs", "-m", kDemo, "--prompt-ids", "1", "--cpu-moe", "--n-cpu-moe", "2"}, "give one of them"},
           {{"bench", "model", "-m", kDemo, "--n-cpu-moe", "7"}, "--n-cpu-moe 7"},
           {{"bench", "serve", "-m", kDemo, "--n-cpu-moe", "7"}, "--n-cpu-moe 7"},
           {{"bench", "serve", "-m", kDemo, "--kv-memory", "1K"}, "--kv-memory: state memory of 1024 bytes"},
           {{"bench", "serve", "-m", kDemo, "--url", "http://127.0.0.1:1"}, "give one of -m MODEL"},
           {{"bench", "serve"}, "give -m MODEL"},
           {{"bench", "spec", "-m", kDemo, "--config", cfg}, "exactly one of -m DIR and --config FILE"},
           {{"tokenize", "hi"}, "give --tokenizer FILE or -m MODEL_DIR"}}) {
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    const ProcResult r = run_dsv4(args, "modelusage");
    EXPECT_EQ(r.code, 2) << joined << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("dsv4: error: ", 0), 0u) << joined << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << joined << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << joined << "\n" << r.err;
    EXPECT_EQ(r.out, "") << joined;
  }
}

// bench gemm's --experts-alloc is checked with the other options while parsing (exit 2, before the bandwidth run);
// it was checked only when the benchmark ran (exit 1).
TEST(CliUsage, BenchGemmExpertsAllocIsCheckedWithTheOtherOptions) {
  for (const char* v : {"5", "0", "-1", "257", "x", "0x10"}) {
    const ProcResult r = run_dsv4({"bench", "gemm", "--experts-alloc", v, "--seconds", "0.01"}, "expertsalloc");
    EXPECT_EQ(r.code, 2) << v << ": " << r.err;
    EXPECT_EQ(r.err.rfind(std::string("dsv4: error: --experts-alloc: '") + v + "'", 0), 0u) << r.err;
    EXPECT_EQ(r.out, "") << v;
  }
  const ProcResult h = run_dsv4({"bench", "gemm", "--help"}, "expertsallochelp");
  EXPECT_NE(h.out.find("6 .. 256"), std::string::npos) << h.out;
}

}  // namespace
