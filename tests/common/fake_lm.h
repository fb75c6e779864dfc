// Test double of LanguageModel (src/model/language_model.h): deterministic logits computed from the whole token
// history, so that any engine bug in prefix reuse / rewind / chunking changes the output.
//
// logits[v] = noise(hash(history), v) in [0, 2), plus +20 on one preferred token (sampled with p > 0.9999 at
// temperature 1):
//   - with a script: script[j] where j = positions since the last `marker` token (e.g. <｜Assistant｜>) and an
//     optional `skip` token right after it, or since position 0 when there is none; EOS once the script is
//     exhausted;
//   - without a script: a hash-chosen non-EOS token.
// Counters record how many tokens were appended (to check that prefix reuse skips the cached part), and an
// optional per-append delay lets tests cancel / disconnect mid-generation.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "model/language_model.h"

namespace dsv4::test {

class FakeLm : public LanguageModel {
 public:
  explicit FakeLm(int32_t n_vocab = 300, int64_t max_ctx = 4096) : n_vocab_(n_vocab), max_ctx_(max_ctx) {}

  int32_t n_vocab() const override { return n_vocab_; }
  int32_t bos_id() const override { return 0; }
  int32_t eos_id() const override { return 1; }
  int64_t max_context() const override { return max_ctx_; }
  std::unique_ptr<LmSequence> new_sequence() const override;

  // `skip`: tokens right after the marker that are still part of the prompt (e.g. <think> / </think>).
  void set_script(std::vector<int32_t> script, int32_t marker = -1, std::vector<int32_t> skip = {}) {
    std::lock_guard lk(mu_);
    script_ = std::move(script);
    marker_ = marker;
    skip_ = std::move(skip);
  }
  void set_delay(std::chrono::milliseconds d) { delay_ms_ = d.count(); }

  mutable std::atomic<int64_t> appended_tokens{0};  // total tokens appended over all sequences
  mutable std::atomic<int64_t> append_calls{0};
  mutable std::atomic<int64_t> in_flight{0};  // appends running right now (must never exceed 1)
  mutable std::atomic<int64_t> max_in_flight{0};

  // The logits for a given history (what a cold run computes).
  void logits_for(const std::vector<int32_t>& hist, std::span<float> out) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : hist) h = (h ^ static_cast<uint64_t>(t + 1)) * 1099511628211ull;
    for (int32_t v = 0; v < n_vocab_; ++v) {
      uint64_t x = (h ^ (static_cast<uint64_t>(v) * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
      x ^= x >> 29;
      out[v] = static_cast<float>((x >> 11) * 0x1.0p-53 * 2.0);
    }
    int32_t pref;
    std::lock_guard lk(mu_);
    if (!script_.empty()) {
      int64_t start = 0;
      for (int64_t i = static_cast<int64_t>(hist.size()) - 1; i >= 0; --i)
        if (hist[i] == marker_) {
          start = i + 1;
          if (start < static_cast<int64_t>(hist.size()) &&
              std::find(skip_.begin(), skip_.end(), hist[start]) != skip_.end())
            ++start;
          break;
        }
      int64_t j = static_cast<int64_t>(hist.size()) - start;
      pref = j < static_cast<int64_t>(script_.size()) ? script_[j] : eos_id();
    } else {
      pref = 3 + static_cast<int32_t>((h >> 17) % static_cast<uint64_t>(n_vocab_ - 3));
    }
    out[pref] += 20.0f;
  }

 private:
  friend class FakeSeq;
  int32_t n_vocab_;
  int64_t max_ctx_;
  mutable std::mutex mu_;
  std::vector<int32_t> script_;
  int32_t marker_ = -1;
  std::vector<int32_t> skip_;
  std::atomic<int64_t> delay_ms_{0};
};

class FakeSeq : public LmSequence {
 public:
  explicit FakeSeq(const FakeLm& lm) : lm_(lm) {}
  int64_t n_past() const override { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const override { return tokens_; }
  void append(std::span<const int32_t> tokens, std::span<float> last_logits) override {
    int64_t now = ++lm_.in_flight;
    for (int64_t m = lm_.max_in_flight; now > m && !lm_.max_in_flight.compare_exchange_weak(m, now);) {
    }
    struct Done {
      const FakeLm& lm;
      ~Done() { --lm.in_flight; }
    } done{lm_};
    if (tokens.empty()) fail("append: no tokens");
    if (n_past() + static_cast<int64_t>(tokens.size()) > lm_.max_context()) fail("append: context exceeded");
    if (static_cast<int32_t>(last_logits.size()) != lm_.n_vocab()) fail("append: bad logits size");
    for (int32_t t : tokens) {
      if (t < 0 || t >= lm_.n_vocab()) fail("append: bad token {}", t);
      tokens_.push_back(t);
    }
    lm_.appended_tokens += static_cast<int64_t>(tokens.size());
    ++lm_.append_calls;
    if (int64_t d = lm_.delay_ms_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(d));
    lm_.logits_for(tokens_, last_logits);
  }
  void rewind(int64_t p) override {
    if (p < 0 || p > n_past()) fail("rewind: {} out of range", p);
    tokens_.resize(p);
  }
  size_t memory_bytes() const override { return tokens_.size() * sizeof(int32_t); }

 private:
  const FakeLm& lm_;
  std::vector<int32_t> tokens_;
};

inline std::unique_ptr<LmSequence> FakeLm::new_sequence() const { return std::make_unique<FakeSeq>(*this); }

}  // namespace dsv4::test
