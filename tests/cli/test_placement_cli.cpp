// `dsv4 profile-experts` and the expert placement options end to end on the demo model (issue 11): the profile's
// counts add up to tokens x top-k per layer, generation with the experts split between the "device" and the CPU
// (the CPU build's fake split) prints exactly the all-device text, and bad profiles / values are one-line errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/run_child.h"

namespace {
using namespace dsv4::clitest;

const std::string kDemo = std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo";

TEST(CliPlacement, ProfileThenHotExpertsGenerateTheSameText) {
  const auto dir = scratch_dir("placement");
  const auto prompts = dir / "prompts.txt", prof = dir / "hot.json";
  std::ofstream(prompts) << "The president said\n\nOur nation is strong\n";
  ProcResult p = run_dsv4({"profile-experts", "-m", kDemo, "--prompts", prompts.string(), "-o", prof.string(),
                           "--threads", "1"},
                          "profile");
  ASSERT_EQ(p.code, 0) << p.err;
  const auto j = nlohmann::json::parse(slurp(prof));
  EXPECT_EQ(j["format"], "dsv4-expert-profile");
  EXPECT_EQ(j["prompts"], 2);
  ASSERT_EQ(j["counts"].size(), 6u);
  const uint64_t tokens = j["tokens"];
  EXPECT_GT(tokens, 4u);
  for (const auto& row : j["counts"]) {
    ASSERT_EQ(row.size(), 8u);
    uint64_t sum = 0;
    for (const auto& c : row) sum += c.get<uint64_t>();
    EXPECT_EQ(sum, tokens * 2);  // top-2: every token's two slots
  }
  const std::vector<std::string> base{"generate", "-m", kDemo, "-p", "The president", "-n", "10", "--temp", "0",
                                      "--threads", "1"};
  ProcResult plain = run_dsv4(base, "plain");
  ASSERT_EQ(plain.code, 0) << plain.err;
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--hot-experts", prof.string(), "--gpu-experts", "3"},
        std::vector<std::string>{"--n-cpu-moe", "4"}, std::vector<std::string>{"--cpu-moe"},
        // the staged path: the CPU experts of every call copied to the "device" through 1 MiB buffers
        std::vector<std::string>{"--n-cpu-moe", "4", "--stage-tokens", "1", "--stage-mib", "1"}}) {
    auto args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    ProcResult r = run_dsv4(args, "split");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, plain.out) << extra[0];
    EXPECT_NE(r.err.find("on the CPU"), std::string::npos) << r.err;  // the device line names the split
    const bool staged = std::find(extra.begin(), extra.end(), "--stage-tokens") != extra.end();
    EXPECT_EQ(r.err.find("calls of >= 1 tokens run them on the device (staged)") != std::string::npos, staged)
        << r.err;  // ... and the staged path where it is on (on the CPU backend only when asked for)
  }
}

TEST(CliPlacement, BadProfilesAndValuesAreOneLineErrors) {
  const auto dir = scratch_dir("placementerr");
  const auto bad = dir / "bad.json";
  std::ofstream(bad) << R"({"format": "dsv4-expert-profile", "counts": [[1,2,3,4,5,6,7,8,9]]})";
  struct Case {
    std::vector<std::string> args;
    std::string needle;
    int code = 1;  // 2: a usage error (the command line and config.json alone are wrong), before "loading"
  };
  // recorded on another model of the same layer and expert counts (demo: 6 x 8, top-2)
  const auto other = dir / "other.json";
  {
    nlohmann::json o = {{"format", "dsv4-expert-profile"}, {"version", 1}, {"model", "DeepSeek-V4-Flash"},
                        {"n_layers", 6}, {"n_experts", 8}, {"top_k", 6}, {"hidden_size", 4096},
                        {"counts", std::vector<std::vector<int>>(6, std::vector<int>(8, 1))}};
    std::ofstream(other) << o.dump();
  }
  const std::vector<Case> cases{
      {{"--hot-experts", bad.string()}, "expert 8 does not exist"},
      {{"--hot-experts", other.string()}, "recorded on a model with top_k 6 but this model has 2"},
      {{"--hot-experts", (dir / "missing.json").string()}, "cannot open"},
      {{"--n-cpu-moe", "7"}, "--n-cpu-moe 7", 2},
      {{"--gpu-experts", "9"}, "--gpu-experts must be auto or a number of experts per layer in 0 .. 8", 2},
      {{"--cpu-moe", "--n-cpu-moe", "2"}, "give one of them", 2},  // ("--gpu-experts lots": test_usage_errors)
  };
  for (const auto& c : cases) {
    std::vector<std::string> args{"generate", "-m", kDemo, "-p", "x", "-n", "1", "--threads", "1"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    ProcResult r = run_dsv4(args, "placementerr");
    EXPECT_EQ(r.code, c.code) << r.err;
    EXPECT_NE(r.err.find("dsv4: error:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    if (c.code == 2) {
      EXPECT_EQ(r.err.find("loading"), std::string::npos) << r.err;
    }
    // one error line, the last one (generate prints "loading ..." first)
    const size_t at = r.err.find("dsv4: error:");
    ASSERT_NE(at, std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n', at), r.err.size() - 1) << r.err;
  }
  ProcResult p = run_dsv4({"profile-experts", "-m", kDemo, "--prompts", (dir / "none.txt").string(), "-o",
                           (dir / "o.json").string()},
                          "profileerr");
  EXPECT_EQ(p.code, 1) << p.err;
  EXPECT_NE(p.err.find("cannot open"), std::string::npos) << p.err;
}

}  // namespace
