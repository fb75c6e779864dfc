// ModelSequence: append / rewind / snapshots over SequenceState (spec §5.10, §6; errata on rollback).
#include "model/sequence.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

ModelSequence::ModelSequence(const Model& model) : model_(model), state_(model.fresh_state()) {}

void ModelSequence::checkpoint() {
  if (!checkpoints_.empty() && checkpoints_.back().n_past == state_.n_past) return;
  checkpoints_.push_back(StateCheckpoint::take(state_));
  if (checkpoints_.size() > kMaxCheckpoints) checkpoints_.erase(checkpoints_.begin());
}

void ModelSequence::run(std::span<const int32_t> tokens, const std::function<bool(int64_t)>& want,
                        const Model::LogitsSink& sink) {
  const int64_t n = int64_t(tokens.size());
  if (state_.n_past + n > model_.max_context())
    fail("context overflow: {} + {} positions exceed the model context {}", state_.n_past, n, model_.max_context());
  for (int32_t t : tokens)
    if (t < 0 || t >= model_.n_vocab()) fail("token id {} outside the vocabulary [0, {})", t, model_.n_vocab());
  // Segments of up to one ubatch (at least kCheckpointEvery tokens): what is left in one segment when it fits, else
  // up to the last multiple of kCheckpointEvery within one ubatch, so that checkpoints land exactly there. A long
  // prompt thus runs in ubatch-sized forward steps (one pass over the weights per ubatch, not per 128 tokens).
  const int64_t seg_max = std::max(kCheckpointEvery, model_.options().ubatch / kCheckpointEvery * kCheckpointEvery);
  for (int64_t i = 0; i < n;) {
    const int64_t p = state_.n_past, left = n - i;
    const int64_t m = left <= seg_max ? left : (p + seg_max) / kCheckpointEvery * kCheckpointEvery - p;
    auto seg = tokens.subspan(static_cast<size_t>(i), size_t(m));
    try {
      model_.forward(state_, seg, want, sink);
    } catch (...) {
      // the state may have advanced past tokens_ (e.g. non-finite logits): bring it back to tokens_ exactly
      recover(int64_t(tokens_.size()));
      throw;
    }
    tokens_.insert(tokens_.end(), seg.begin(), seg.end());
    if (state_.n_past % kCheckpointEvery == 0) checkpoint();
    i += m;
  }
  if (n > 1) checkpoint();
}

void ModelSequence::append(std::span<const int32_t> tokens, std::span<float> last_logits) {
  if (tokens.empty()) fail("append: no tokens");
  if (int64_t(last_logits.size()) != model_.n_vocab())
    fail("append: logits buffer has {} entries, expected {}", last_logits.size(), model_.n_vocab());
  const int64_t last = state_.n_past + int64_t(tokens.size()) - 1;
  run(tokens, [last](int64_t p) { return p == last; },
      [&](int64_t, std::span<const float> lg) { std::copy(lg.begin(), lg.end(), last_logits.begin()); });
}

void ModelSequence::append_all(std::span<const int32_t> tokens, const Model::LogitsSink& sink) {
  run(tokens, [](int64_t) { return true; }, sink);
}

void ModelSequence::rewind(int64_t p) {
  if (p < 0 || p > n_past()) fail("rewind: position {} outside [0, {}]", p, n_past());
  if (p == n_past()) return;
  recover(p);
}

void ModelSequence::recover(int64_t p) {
  while (!checkpoints_.empty() && checkpoints_.back().n_past > p) checkpoints_.pop_back();
  if (checkpoints_.empty()) {
    state_ = model_.fresh_state();
  } else {
    checkpoints_.back().restore(state_);
  }
  std::vector<int32_t> gap(tokens_.begin() + state_.n_past, tokens_.begin() + p);
  tokens_.resize(static_cast<size_t>(state_.n_past));
  if (!gap.empty()) run(gap, nullptr, nullptr);
}

void ModelSequence::restore(const Snapshot& s) {
  if (s.state.pool.layout().layers.size() != state_.pool.layout().layers.size() ||
      int64_t(s.tokens.size()) != s.state.n_past || s.state.backend != state_.backend)
    fail("restore: snapshot does not belong to this model");
  tokens_ = s.tokens;
  state_ = s.state;
  checkpoints_.clear();
}

size_t ModelSequence::memory_bytes() const {
  size_t b = state_.bytes() + tokens_.capacity() * sizeof(int32_t);
  for (const auto& c : checkpoints_) b += c.bytes();
  return b;
}

}  // namespace dsv4
