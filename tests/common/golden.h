// Golden fixtures of tests/data/golden (see its README): loading, the prompt-length groups, and the per-position
// comparison with its statistics. Shared by the CPU golden tests (tests/model) and the CUDA ones (tests/gpu).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsv4::test {

inline std::vector<double> golden_log_softmax(std::span<const float> lg) {
  double mx = -INFINITY;
  for (float v : lg) mx = std::max(mx, double(v));
  double s = 0;
  for (float v : lg) s += std::exp(double(v) - mx);
  const double lse = mx + std::log(s);
  std::vector<double> out(lg.size());
  for (size_t i = 0; i < lg.size(); ++i) out[i] = double(lg[i]) - lse;
  return out;
}

struct GoldenPrompt {
  std::vector<int32_t> ids;
  std::vector<std::vector<int32_t>> top_ids;
  std::vector<std::vector<double>> top_lp;
};
struct Golden {
  std::vector<GoldenPrompt> prompts;
  nlohmann::json meta;
};

inline Golden load_golden(const std::string& model, const std::string& numerics) {
  const std::string path = std::string(DSV4_SOURCE_DIR) + "/tests/data/golden/" + model + "." + numerics + ".json";
  std::ifstream f(path);
  if (!f) ADD_FAILURE() << "missing golden file " << path;
  Golden g;
  if (!f) return g;
  nlohmann::json j = nlohmann::json::parse(f);
  for (const auto& p : j.at("prompts")) {
    GoldenPrompt gp;
    gp.ids = p.at("ids").get<std::vector<int32_t>>();
    gp.top_ids = p.at("top_ids").get<std::vector<std::vector<int32_t>>>();
    gp.top_lp = p.at("top_logprobs").get<std::vector<std::vector<double>>>();
    g.prompts.push_back(std::move(gp));
  }
  j.erase("prompts");
  g.meta = std::move(j);
  return g;
}

// Lengths tested per golden prompt length (the prompt's own group, see the file comment).
inline std::vector<int64_t> lengths_for(int64_t L) {
  std::vector<int64_t> out;
  auto add = [&](int64_t a, int64_t b) {
    for (int64_t x = a; x <= b && x <= L; ++x) out.push_back(x);
  };
  if (L <= 9) add(1, 9);
  else if (L <= 130) add(127, 130);
  else if (L <= 258) add(255, 258);
  else if (L <= 513) add(511, 513);
  else add(2047, 2050);
  return out;
}

struct Stats {
  std::vector<double> diffs;     // |Δ logprob| over the golden's top-20 ids, all positions
  int64_t positions = 0, top1_agree = 0, top1_checked = 0;
  double quantile(double q) const {
    if (diffs.empty()) return 0;
    std::vector<double> d = diffs;
    std::sort(d.begin(), d.end());
    return d[std::min(d.size() - 1, size_t(q * double(d.size())))];
  }
};

// Compare our logits row (position p) against the golden entry; record stats. Dense mode also asserts the strict
// per-position rule (tokens in both top-20 lists within 2e-3; same argmax where the golden top-2 gap > 1e-3).
inline void compare_row(std::span<const float> lg, const GoldenPrompt& g, size_t p, bool strict, Stats& st,
                 const std::string& where) {
  const auto lp = golden_log_softmax(lg);
  const auto& gi = g.top_ids[p];
  const auto& gl = g.top_lp[p];
  std::vector<int32_t> ours(lp.size());
  std::iota(ours.begin(), ours.end(), 0);
  const size_t k = std::min<size_t>(gi.size(), ours.size());
  std::partial_sort(ours.begin(), ours.begin() + k, ours.end(), [&](int32_t a, int32_t b) { return lp[a] > lp[b]; });
  std::vector<char> in_ours(lp.size(), 0);
  for (size_t i = 0; i < k; ++i) in_ours[size_t(ours[i])] = 1;
  for (size_t i = 0; i < gi.size(); ++i) {
    const double d = std::abs(lp[size_t(gi[i])] - gl[i]);
    st.diffs.push_back(d);
    if (strict && in_ours[size_t(gi[i])]) {
      EXPECT_LE(d, 2e-3) << where << " token " << gi[i];
    }
  }
  ++st.positions;
  const bool clear_top1 = gl.size() < 2 || gl[0] - gl[1] > 1e-3;
  if (clear_top1) {
    ++st.top1_checked;
    if (ours[0] == gi[0]) ++st.top1_agree;
    if (strict) {
      EXPECT_EQ(ours[0], gi[0]) << where << " argmax (golden gap " << (gl[0] - gl[1]) << ")";
    }
  }
}

}  // namespace dsv4::test
