#include "engine/output_constraint.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "core/error.h"

namespace dsv4 {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Keep only token t.
void only(std::span<float> logits, int32_t t) {
  const float keep = logits[t];
  std::fill(logits.begin(), logits.end(), kNegInf);
  logits[t] = keep;
}
}  // namespace

OutputConstraint::OutputConstraint(std::shared_ptr<const ConstraintVocab> vocab, OutputConstraintOptions opts)
    : vocab_(std::move(vocab)), opts_(std::move(opts)), reasoning_(opts_.thinking) {
  if (!vocab_) fail("output constraint: no vocabulary");
  if (opts_.grammar && opts_.grammar->vocab().n_vocab() != vocab_->n_vocab())
    fail("output constraint: the grammar is built over another vocabulary");
  if (opts_.thinking && (opts_.reasoning_budget >= 0 || opts_.grammar) && vocab_->think_end < 0)
    fail("output constraint: the tokenizer has no </think> token");
}

// The grammar state, taken from the automaton when the answer starts, and again from the answer's bytes after the
// shared automaton renumbered its states (another generation's step_token() dropped its caches).
int32_t OutputConstraint::state() {
  const int64_t resets = opts_.grammar->stats().resets;
  if (state_ == kNoState || resets != state_resets_) {
    state_ = opts_.grammar->step_bytes(opts_.grammar->start(), answer_);
    state_resets_ = opts_.grammar->stats().resets;
  }
  return state_;
}

std::unique_ptr<TokenConstraint> OutputConstraint::clone() const { return std::make_unique<OutputConstraint>(*this); }

bool OutputConstraint::answer_complete() {
  if (reasoning_) return false;
  return !opts_.grammar || opts_.grammar->accepting(state());
}

namespace {
// Tokens before the last possible moment of closing at which every candidate token is checked (a token may lengthen
// the shortest completion by several bytes: an escape, a new member).
constexpr int64_t kCloseZone = 32;
}  // namespace

void OutputConstraint::apply(std::span<float> logits) {
  if (static_cast<int64_t>(logits.size()) != vocab_->n_vocab())
    fail("output constraint: {} logits, vocabulary {}", logits.size(), vocab_->n_vocab());
  const bool watch = opts_.grammar && opts_.max_tokens >= 0;
  if (reasoning_) {
    bool close = opts_.reasoning_budget >= 0 && reasoning_tokens_ >= opts_.reasoning_budget;
    if (!close && watch) {
      // Leave room for </think>, the shortest answer and EOS.
      if (opts_.grammar->min_completion_length(opts_.grammar->start()) + 2 >= left()) close = forced_ = true;
    }
    if (close) {
      only(logits, vocab_->think_end);
      return;
    }
    if (!opts_.grammar) return;
    if (vocab_->eos >= 0) logits[vocab_->eos] = kNegInf;
    if (vocab_->dsml >= 0) logits[vocab_->dsml] = kNegInf;
    const TokenMask& bad = vocab_->think_completing(think_k_);
    for (size_t w = 0; w < bad.bits.size(); ++w)
      for (uint64_t b = bad.bits[w]; b; b &= b - 1) {
        const int32_t t = static_cast<int32_t>(w * 64 + std::countr_zero(b));
        if (t != vocab_->think_end) logits[t] = kNegInf;
      }
    return;
  }
  if (!opts_.grammar) return;
  const int32_t st = state();
  opts_.grammar->mask(st, mask_);
  // Near the end of the budget: only tokens after which the shortest completion (+ EOS) still fits in what is left
  // (nothing to save once it does not fit any more).
  if (watch) {
    const int64_t need = opts_.grammar->min_completion_length(st) + 1;
    if (need <= left() && need + kCloseZone >= left() && opts_.grammar->restrict_to_completion(st, left() - 2, mask_) > 0)
      forced_ = true;
  }
  const bool complete = opts_.grammar->accepting(st);
  if (vocab_->eos >= 0 && complete) mask_.set(vocab_->eos);
  if (mask_.count() == 0) {  // cannot happen with a productive grammar; never leave nothing to sample
    if (vocab_->eos >= 0) mask_.set(vocab_->eos);
  }
  apply_token_mask(mask_, logits);
}

void OutputConstraint::accept(int32_t token) {
  ++generated_;
  if (reasoning_) {
    if (token == vocab_->think_end) {
      reasoning_ = false;
      return;
    }
    ++reasoning_tokens_;
    if (token >= 0 && token < vocab_->n_vocab())
      think_k_ = ConstraintVocab::think_kmp(
          think_k_, vocab_->trie->token_bytes(token).empty() ? std::string_view() : vocab_->trie->token_bytes(token));
    if (think_k_ == 8) {  // the text "</think>" (only possible without a grammar): the parser ends reasoning here
      reasoning_ = false;
      think_k_ = 0;
    }
    return;
  }
  if (!opts_.grammar || token == vocab_->eos) return;
  state_ = opts_.grammar->step_token(state(), token);  // may drop the caches: its result is in the new numbering
  state_resets_ = opts_.grammar->stats().resets;
  if (state_ < 0) fail("output constraint: token {} does not continue the grammar", token);
  answer_ += vocab_->trie->token_bytes(token);
}

}  // namespace dsv4
