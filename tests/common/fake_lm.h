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
//
// It is also a BatchModel (engine/batch_model.h), so the engine loop and the server run on it. Its batch state
// mimics the paged state: a slot holds the positions it has consumed, the tokens of its partial block and a running
// hash of its whole history (what a page cannot carry, like a compressor frontier); pages hold the tokens of their
// 128 positions; a snapshot is a copy of a slot at a block boundary. A forward step rebuilds each sequence's
// history from its page table and slot and checks it against the slot's hash (a wrong page, snapshot or slot is an
// error, never a silent wrong answer); the logits are those of that history. The per-append delay applies once per
// step; in_flight counts steps.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/batch_model.h"
#include "model/language_model.h"

namespace dsv4::test {

class FakeLm : public LanguageModel, public BatchModel {
 public:
  explicit FakeLm(int32_t n_vocab = 300, int64_t max_ctx = 4096) : n_vocab_(n_vocab), max_ctx_(max_ctx) {}

  int32_t n_vocab() const override { return n_vocab_; }
  int32_t bos_id() const override { return 0; }
  int32_t eos_id() const override { return 1; }
  int64_t max_context() const override { return max_ctx_; }
  std::unique_ptr<LmSequence> new_sequence() const override;

  // BatchModel
  StateLayout state_layout(bool = false) const override {
    StateLayout l;
    l.slot_bytes = l.page_bytes = l.snapshot_bytes = 1 << 20;  // nominal: keeps the pool sizes of tests small
    l.any_compressed = true;
    return l;
  }
  uint64_t state_salt() const override { return 0xFA4E; }
  std::unique_ptr<BatchState> make_state(const StatePoolOptions& o) const override;
  void forward(const Batch& batch, BatchState& state, const BatchLogitsSink& sink) const override;
  mutable std::atomic<int64_t> steps{0};  // batched forward steps

  // `skip`: tokens right after the marker that are still part of the prompt (e.g. <think> / </think>).
  void set_script(std::vector<int32_t> script, int32_t marker = -1, std::vector<int32_t> skip = {}) {
    std::lock_guard lk(mu_);
    script_ = std::move(script);
    marker_ = marker;
    skip_ = std::move(skip);
  }
  void set_delay(std::chrono::milliseconds d) { delay_ms_ = d.count(); }
  // The bonus of the preferred token (default 20; 0: every token about as likely, for sampling tests).
  void set_preference(float boost) { boost_ = boost; }

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
    out[pref] += boost_.load();
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
  std::atomic<float> boost_{20.0f};
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

inline uint64_t fake_hash_step(uint64_t h, int32_t t) { return (h ^ static_cast<uint64_t>(t + 1)) * 1099511628211ull; }

class FakeBatchState : public BatchState {
 public:
  static constexpr int64_t kBlock = 128;
  struct Slot {
    int64_t n = 0;               // positions consumed
    std::vector<int32_t> tail;   // tokens of positions [n / 128 * 128, n)
    uint64_t h = 1469598103934665603ull;  // hash of the whole history
  };
  explicit FakeBatchState(const StatePoolOptions& o)
      : slots(size_t(o.n_slots)), pages(size_t(o.n_pages), std::vector<int32_t>(kBlock, -1)),
        snaps(size_t(o.n_snapshots)) {}
  int64_t n_pages() const override { return int64_t(pages.size()); }
  size_t bytes() const override { return (slots.size() + pages.size() + snaps.size()) << 20; }
  void reset_slot(int64_t slot) override { slots.at(size_t(slot)) = Slot{}; }
  void restore_snapshot(int64_t snapshot, int64_t slot) override {
    slots.at(size_t(slot)) = snaps.at(size_t(snapshot));
  }
  std::vector<Slot> slots;
  std::vector<std::vector<int32_t>> pages;
  std::vector<Slot> snaps;
};

inline std::unique_ptr<BatchState> FakeLm::make_state(const StatePoolOptions& o) const {
  return std::make_unique<FakeBatchState>(o);
}

inline void FakeLm::forward(const Batch& batch, BatchState& state, const BatchLogitsSink& sink) const {
  auto& st = dynamic_cast<FakeBatchState&>(state);
  int64_t now = ++in_flight;
  for (int64_t m = max_in_flight; now > m && !max_in_flight.compare_exchange_weak(m, now);) {
  }
  struct Done {
    const FakeLm& lm;
    ~Done() { --lm.in_flight; }
  } done{*this};
  ++steps;
  if (int64_t d = delay_ms_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(d));
  constexpr int64_t B = FakeBatchState::kBlock;
  std::vector<float> lg(static_cast<size_t>(n_vocab_));
  for (size_t si = 0; si < batch.seqs.size(); ++si) {
    const BatchSeq& bs = batch.seqs[si];
    auto& sl = st.slots.at(size_t(bs.slot));
    if (sl.n != bs.p0) fail("fake forward: slot {} holds {} positions, the batch starts at {}", bs.slot, sl.n, bs.p0);
    if (bs.n() < 1 || bs.p0 + bs.n() > max_ctx_) fail("fake forward: bad chunk");
    if (int64_t(bs.pages.size()) < (bs.p0 + bs.n() + B - 1) / B) fail("fake forward: page table too short");
    std::vector<int32_t> hist;
    for (int64_t k = 0; k < bs.p0 / B; ++k) {
      const auto& pg = st.pages.at(size_t(bs.pages[size_t(k)]));
      hist.insert(hist.end(), pg.begin(), pg.end());
    }
    hist.insert(hist.end(), sl.tail.begin(), sl.tail.end());
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : hist) h = fake_hash_step(h, t);
    if (int64_t(hist.size()) != bs.p0 || h != sl.h)
      fail("fake forward: the pages and slot {} do not hold the sequence's history", bs.slot);
    size_t next_snap = 0;
    for (int64_t i = 0; i < bs.n(); ++i) {
      const int32_t t = bs.tokens[size_t(i)];
      if (t < 0 || t >= n_vocab_) fail("fake forward: bad token {}", t);
      const int64_t pos = bs.p0 + i;
      hist.push_back(t);
      st.pages.at(size_t(bs.pages[size_t(pos / B)]))[size_t(pos % B)] = t;
      ++sl.n;
      sl.h = fake_hash_step(sl.h, t);
      sl.tail.push_back(t);
      if (sl.n % B == 0) sl.tail.clear();
      while (next_snap < bs.snapshots.size() && bs.snapshots[next_snap].at == sl.n)
        st.snaps.at(size_t(bs.snapshots[next_snap++].id)) = sl;
      if (bs.wants(i)) {
        logits_for(hist, lg);
        sink(si, pos, lg, true);
      }
    }
    appended_tokens += bs.n();
    ++append_calls;
  }
}

}  // namespace dsv4::test
