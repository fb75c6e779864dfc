#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dsv4 {

// The first index of the largest logit (NaNs never win, except a NaN at index 0, which every comparison keeps): the
// maximum over 8 independent chains (the maximum of the non-NaN values does not depend on the order), then the first
// index that equals it — the result of `if (l[i] > l[best]) best = i` over i ascending, at a vocabulary's size
// several times faster (one decode step of a small model spent ~3% of its time here).
int32_t argmax(std::span<const float> logits) {
  const int64_t n = static_cast<int64_t>(logits.size());
  const float* l = logits.data();
  if (n == 0 || std::isnan(l[0])) return 0;
  float m[8];
  for (float& v : m) v = l[0];
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) m[j] = l[i + j] > m[j] ? l[i + j] : m[j];
  for (; i < n; ++i) m[0] = l[i] > m[0] ? l[i] : m[0];
  float best = m[0];
  for (int j = 1; j < 8; ++j) best = m[j] > best ? m[j] : best;
  for (int64_t k = 0; k < n; ++k)
    if (l[k] == best) return static_cast<int32_t>(k);
  return 0;
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
