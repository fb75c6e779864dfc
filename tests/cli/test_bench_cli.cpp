// `dsv4 bench model --json`: the results object alone on stdout (a script pipes it to a JSON parser), the progress
// lines on stderr.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli/run_child.h"

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

}  // namespace
