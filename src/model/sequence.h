// ModelSequence: the LmSequence of dsv4::Model — token list + SequenceState + automatic checkpoints for rewind.
//
// Checkpoints (StateCheckpoint, cheap: rings + compressor frontiers + row counts) are taken automatically at the end
// of every forward segment that ends on a multiple of kCheckpointEvery (an append runs in segments of up to one
// ubatch that end there: every 128 tokens while decoding, every ubatch of a long prompt) and at the end of every
// multi-token append (the prompt end); at most
// kMaxCheckpoints are kept (oldest dropped). rewind(p) restores the newest checkpoint at or before p and re-prefills
// the gap, so the state equals a cold prefill of tokens()[0:p] (spec errata: the state cannot roll back by itself).
// snapshot()/restore() are full deep copies (independent of later rewinds), for prefix caching and tests.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"
#include "model/sequence_state.h"

namespace dsv4 {

class ModelSequence final : public LmSequence {
 public:
  static constexpr int64_t kCheckpointEvery = 128;
  static constexpr size_t kMaxCheckpoints = 8;

  explicit ModelSequence(const Model& model);

  int64_t n_past() const override { return int64_t(tokens_.size()); }
  const std::vector<int32_t>& tokens() const override { return tokens_; }
  void append(std::span<const int32_t> tokens, std::span<float> last_logits) override;
  void rewind(int64_t p) override;
  size_t memory_bytes() const override;

  // Append and receive the logits of every appended position (logprobs, tests).
  void append_all(std::span<const int32_t> tokens, const Model::LogitsSink& sink);

  struct Snapshot {
    std::vector<int32_t> tokens;
    SequenceState state;
  };
  Snapshot snapshot() const { return {tokens_, state_}; }
  void restore(const Snapshot& s);

  const SequenceState& state() const { return state_; }
  size_t n_checkpoints() const { return checkpoints_.size(); }

 private:
  void run(std::span<const int32_t> tokens, const std::function<bool(int64_t)>& want, const Model::LogitsSink& sink);
  void checkpoint();
  // Make the state a cold prefill of tokens_[0:p] (restore the newest checkpoint <= p, re-prefill the gap).
  void recover(int64_t p);

  const Model& model_;
  std::vector<int32_t> tokens_;
  SequenceState state_;
  std::vector<StateCheckpoint> checkpoints_;  // ascending n_past
};

}  // namespace dsv4
