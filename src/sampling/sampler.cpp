#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace dsv4 {

// The first index of the largest logit, the result of `if (l[i] > l[best]) best = i` over i ascending (NaNs never
// win, except a NaN at index 0, which every comparison keeps; -0 == +0), in one vectorized pass: 16 running maxima,
// all starting at (l[0], index 0), each with the index where it was first reached (two vectors of 8 lanes: the loop
// carries two compare-and-select chains; a NaN never compares greater, so it never enters a lane), then the lowest
// index among the lanes that hold the overall maximum; elements past the last full 16 (higher ids) replace it only
// when strictly greater. ~7-9 us for 129,280 logits on the 2-core EPYC VM, wherever the maximum is (a max pass and
// then a search for the first index equal to it: 9-90 us); greedy decoding runs it for every sequence of a step.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DSV4_ARGMAX_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DSV4_ARGMAX_CLONES
#endif
#pragma GCC diagnostic ignored "-Wpsabi"  // the vectors never cross a function boundary
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

DSV4_ARGMAX_CLONES int32_t argmax(std::span<const float> logits) {
  const int32_t n = static_cast<int32_t>(logits.size());
  const float* x = logits.data();
  if (n == 0 || std::isnan(x[0])) return 0;
  int32_t i = 0, best = 0;
  float mx = x[0];
  if (n >= 16) {
    v8f m0 = v8f{} + mx, m1 = m0;
    v8i a0 = {}, a1 = {}, i0 = {0, 1, 2, 3, 4, 5, 6, 7}, i1 = i0 + 8;
    for (; i + 16 <= n; i += 16) {
      v8f v0, v1;
      std::memcpy(&v0, x + i, sizeof v0);
      std::memcpy(&v1, x + i + 8, sizeof v1);
      const v8i g0 = v0 > m0, g1 = v1 > m1;
      m0 = g0 ? v0 : m0;
      a0 = g0 ? i0 : a0;
      m1 = g1 ? v1 : m1;
      a1 = g1 ? i1 : a1;
      i0 += 16;
      i1 += 16;
    }
    for (int l = 0; l < 8; ++l) {
      if (m0[l] > mx || (m0[l] == mx && a0[l] < best)) mx = m0[l], best = a0[l];
      if (m1[l] > mx || (m1[l] == mx && a1[l] < best)) mx = m1[l], best = a1[l];
    }
  }
  for (; i < n; ++i)
    if (x[i] > mx) mx = x[i], best = i;
  return best;
}

Sampler::Sampler(const SamplingParams& params, int32_t n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(params.seed) {
  params_.validate();
  if (n_vocab <= 0) fail("sampler: n_vocab must be positive, got {}", n_vocab);
}

void Sampler::set_prompt(std::span<const int32_t> prompt) {
  if (params_.repetition_penalty == 1.0f) return;
  if (in_prompt_.empty()) in_prompt_.assign(n_vocab_, 0);
  for (int32_t t : prompt_ids_) in_prompt_[t] = 0;
  prompt_ids_.clear();
  for (int32_t t : prompt) {
    if (t < 0 || t >= n_vocab_) fail("sampler: prompt token {} outside the vocabulary [0, {})", t, n_vocab_);
    if (!in_prompt_[t]) {
      in_prompt_[t] = 1;
      prompt_ids_.push_back(t);
    }
  }
}

void Sampler::accept(int32_t token) {
  if (token < 0 || token >= n_vocab_) fail("sampler: token {} outside the vocabulary [0, {})", token, n_vocab_);
  ++output_count_[token];
}

void Sampler::apply_penalties(std::span<float> logits) const {
  const float r = params_.repetition_penalty;
  auto repeat = [&](int32_t t) {
    float& l = logits[t];
    l = l > 0.0f ? l / r : l * r;
  };
  if (r != 1.0f) {
    for (int32_t t : prompt_ids_) repeat(t);
    for (const auto& [t, n] : output_count_)
      if (in_prompt_.empty() || !in_prompt_[t]) repeat(t);
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f)
    for (const auto& [t, n] : output_count_)
      logits[t] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(n);
}

void Sampler::keep_candidates(std::span<float> logits) {
  // Softmax numerators relative to the maximum (unnormalised probabilities in (0, 1]).
  const float inv_t = 1.0f / params_.temperature;
  const float lmax = logits[argmax(logits)];
  prob_.resize(n_vocab_);
  for (int32_t i = 0; i < n_vocab_; ++i) prob_[i] = std::exp((logits[i] - lmax) * inv_t);

  // min_p is relative to the top probability, which is exp(0) = 1 here.
  idx_.clear();
  for (int32_t i = 0; i < n_vocab_; ++i)
    if (prob_[i] >= params_.min_p) idx_.push_back(i);

  auto by_prob = [&](int32_t a, int32_t b) { return prob_[a] > prob_[b] || (prob_[a] == prob_[b] && a < b); };
  bool reordered = false;  // idx_ is no longer in ascending id order
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < idx_.size()) {
    // Heap selection: O(n log k), the k best in (p desc, id asc) order.
    heap_.resize(params_.top_k);
    std::partial_sort_copy(idx_.begin(), idx_.end(), heap_.begin(), heap_.end(), by_prob);
    idx_.swap(heap_);
    reordered = true;
  }
  if (params_.top_p < 1.0f) {
    double total = 0.0;
    for (int32_t i : idx_) total += prob_[i];
    const double target = params_.top_p * total;
    // Exact prefilter: a token with p < (1 - top_p) * total / n lies in the tail (all tokens at or below it weigh
    // less than (1 - top_p) * total), so the nucleus never reaches it.
    const double eps = (1.0 - params_.top_p) * total / static_cast<double>(idx_.size());
    idx_.erase(std::remove_if(idx_.begin(), idx_.end(), [&](int32_t i) { return prob_[i] < eps; }), idx_.end());
    // Sort a growing head of the candidates until its mass reaches the target (exact, usually one round).
    size_t k = std::min<size_t>(256, idx_.size());
    reordered = true;
    for (;;) {
      if (k < idx_.size()) std::nth_element(idx_.begin(), idx_.begin() + k, idx_.end(), by_prob);
      std::sort(idx_.begin(), idx_.begin() + k, by_prob);
      double cum = 0.0;
      size_t keep = 0;
      while (keep < k && cum < target) cum += prob_[idx_[keep++]];
      if (cum >= target || k == idx_.size()) {
        idx_.resize(std::max<size_t>(keep, 1));
        break;
      }
      k = std::min(k * 4, idx_.size());
    }
  }
  if (reordered) std::sort(idx_.begin(), idx_.end());

}

int32_t Sampler::sample(std::span<float> logits) {
  if (static_cast<int64_t>(logits.size()) != n_vocab_)
    fail("sampler: got {} logits, expected n_vocab = {}", logits.size(), n_vocab_);
  apply_penalties(logits);
  if (params_.greedy()) return argmax(logits);
  keep_candidates(logits);

  double total = 0.0;
  for (int32_t i : idx_) total += prob_[i];
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double cum = 0.0;
  for (int32_t i : idx_) {
    cum += prob_[i];
    if (u < cum) return i;
  }
  return idx_.back();  // rounding: u landed on the total
}

void Sampler::distribution(std::span<float> logits, std::vector<float>& p) {
  if (static_cast<int64_t>(logits.size()) != n_vocab_)
    fail("sampler: got {} logits, expected n_vocab = {}", logits.size(), n_vocab_);
  apply_penalties(logits);
  p.assign(size_t(n_vocab_), 0.0f);
  if (params_.greedy()) {
    p[size_t(argmax(logits))] = 1.0f;
    return;
  }
  keep_candidates(logits);
  double total = 0.0;
  for (int32_t i : idx_) total += prob_[i];
  for (int32_t i : idx_) p[size_t(i)] = float(double(prob_[i]) / total);
}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

void Sampler::unaccept(int32_t token) {
  auto it = output_count_.find(token);
  if (it == output_count_.end()) fail("internal: sampler: unaccept of token {} that was not accepted", token);
  if (--it->second == 0) output_count_.erase(it);
}

}  // namespace dsv4
