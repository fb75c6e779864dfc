// `dsv4 logprobs`: JSON shape, agreement with the in-process model, chunked feeding, one-line errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "common/run_child.h"
#include "model/model.h"

namespace {

using Result = dsv4::clitest::MergedResult;  // rc, out

// stdout (and stderr too when merge_stderr: error tests; the JSON tests read stdout alone, stderr names the device)
Result run(const std::string& args, bool merge_stderr = true) {
  if (merge_stderr) return dsv4::clitest::run_dsv4_merged(args);
  const dsv4::clitest::ProcResult p = dsv4::clitest::run_dsv4(dsv4::clitest::split_words(args), "logprobs");
  return {p.code, p.out};
}

const std::string kModel = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a";
const std::string kIds = "3,17,250,9,9,41,100,7,5,88,12";

TEST(CliLogprobs, JsonMatchesInProcessModelAndChunking) {
  for (const char* num : {"reference", "dense"}) {
    const Result a =
        run("logprobs -m " + kModel + " --prompt-ids " + kIds + " --top-k 5 --json --numerics " + num, false);
    ASSERT_EQ(a.rc, 0) << a.out;
    const auto j = nlohmann::json::parse(a.out);
    ASSERT_EQ(j.at("positions").size(), 11u);
    dsv4::ModelOptions o;
    o.numerics = *dsv4::parse_numerics(num);
    auto m = dsv4::Model::load(kModel, o);
    const std::vector<int32_t> ids{3, 17, 250, 9, 9, 41, 100, 7, 5, 88, 12};
    const auto lg = m->logits_all(ids);
    for (size_t p = 0; p < ids.size(); ++p) {
      const auto& e = j["positions"][p];
      const auto top = e.at("top_ids").get<std::vector<int>>();
      const auto lp = e.at("top_logprobs").get<std::vector<double>>();
      ASSERT_EQ(top.size(), 5u);
      const float* row = &lg[p * size_t(m->n_vocab())];
      double mx = -INFINITY, s = 0;
      for (int v = 0; v < m->n_vocab(); ++v) mx = std::max(mx, double(row[v]));
      for (int v = 0; v < m->n_vocab(); ++v) s += std::exp(double(row[v]) - mx);
      for (size_t i = 0; i < 5; ++i) {
        EXPECT_NEAR(lp[i], double(row[top[i]]) - mx - std::log(s), 1e-9);
        EXPECT_LE(lp[i], 0.0);
        if (i) {
          EXPECT_LE(lp[i], lp[i - 1]);
        }
      }
    }
    const Result b = run("logprobs -m " + kModel + " --prompt-ids " + kIds + " --top-k 5 --json --chunk 3 --numerics " +
                         num, false);
    ASSERT_EQ(b.rc, 0) << b.out;
    EXPECT_EQ(nlohmann::json::parse(b.out), j);
  }
}

TEST(CliLogprobs, TableAndErrors) {
  const Result t = run("logprobs -m " + kModel + " --prompt-ids 1,2,3");
  ASSERT_EQ(t.rc, 0) << t.out;
  EXPECT_NE(t.out.find("pos"), std::string::npos);
  // exit 2: a usage error (the command line alone is wrong, or config.json tells: id 256 is past the vocabulary)
  for (const auto& [bad, code] : std::vector<std::pair<std::string, int>>{
           {"--prompt-ids 1,x", 2}, {"--prompt-ids 1,,2", 2}, {"--prompt-ids 1,256", 2},
           {"--prompt-ids 1 --numerics fp8", 2}}) {
    const Result r = run("logprobs -m " + kModel + " " + bad);
    EXPECT_EQ(r.rc, code) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("dsv4: error:"), std::string::npos) << r.out;
  }
  const Result r = run("logprobs -m /nonexistent --prompt-ids 1");
  EXPECT_EQ(r.rc, 1) << r.out;
}

// --device: malformed values are usage errors (exit 2); CUDA where this build or machine has none (or a GPU index
// past the machine's) is a one-line error with exit 1.
TEST(CliLogprobs, DeviceErrorsAreOneLine) {
  for (const std::string bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", "cuda:99"}) {
    const Result r = run("logprobs -m " + kModel + " --prompt-ids 1,2 --device " + bad);
    EXPECT_EQ(r.rc, bad == "cuda:99" ? 1 : 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("dsv4: error:"), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << bad << ": " << r.out;
  }
  if (!dsv4::cuda_compiled() || dsv4::cuda_device_count() == 0) {
    const Result r = run("logprobs -m " + kModel + " --prompt-ids 1,2 --device cuda");
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(r.out.find(dsv4::cuda_compiled() ? "no CUDA device" : "without CUDA"), std::string::npos) << r.out;
  }
  const Result ok = run("logprobs -m " + kModel + " --prompt-ids 1,2 --device cpu");
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_NE(ok.out.find("device: cpu"), std::string::npos) << ok.out;
}

}  // namespace
