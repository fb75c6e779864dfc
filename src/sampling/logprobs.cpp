#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dsv4 {

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int top_n) {
  const int32_t n = static_cast<int32_t>(logits.size());
  if (n == 0) fail("logprobs: no logits");
  if (chosen < 0 || chosen >= n) fail("logprobs: token {} outside [0, {})", chosen, n);
  if (top_n < 0) fail("logprobs: top_n must be >= 0, got {}", top_n);
  float mx = logits[0];
  for (float x : logits) mx = std::max(mx, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  const double lse = mx + std::log(sum);
  TokenLogprobs out;
  out.id = chosen;
  out.logprob = static_cast<float>(logits[chosen] - lse);
  top_n = std::min(top_n, n);
  if (top_n > 0) {
    // Bounded selection: keep the top_n best (logit desc, id asc) in a small sorted array.
    auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::vector<int32_t> best;
    best.reserve(top_n + 1);
    for (int32_t i = 0; i < n; ++i) {
      if (static_cast<int>(best.size()) == top_n && !better(i, best.back())) continue;
      best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
      if (static_cast<int>(best.size()) > top_n) best.pop_back();
    }
    for (int32_t i : best) out.top.push_back({i, static_cast<float>(logits[i] - lse)});
  }
  return out;
}

}  // namespace dsv4
