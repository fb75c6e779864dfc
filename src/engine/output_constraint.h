// The token constraint of one chat answer: free reasoning (optionally capped), then optionally a grammar
// (structured output, DSML tool calls). Used by the server for response_format, tool_choice and reasoning budgets.
//
//   reasoning phase (thinking mode: the prompt ended with <think>), until the </think> token:
//     - once `reasoning_budget` tokens were generated in it: only </think> (the budget closes the reasoning);
//     - with a grammar: no EOS (an answer must follow), no ｜DSML｜ token (tool calls come after </think>), and no
//       token whose bytes would complete the text "</think>" other than the </think> token itself, so the reasoning
//       ends exactly at a token boundary where the grammar starts;
//   answer phase: with a grammar, the grammar's token mask plus EOS when the answer so far is a complete sentence
//     (only EOS once nothing can follow); without one, anything.
// reasoning_tokens(): tokens generated in the reasoning phase, not counting the </think> that closes it, so it never
// exceeds the budget. Without thinking the answer phase starts at once and the budget does not apply.
//
// Closing within max_tokens (with a grammar and max_tokens >= 0): in the last steps of the budget (the shortest
// completion of the sentence, GrammarAutomaton::min_completion_length in bytes, plus EOS, plus a margin of 32, reach
// the tokens left) every candidate token is checked, and those after which the shortest completion would no longer
// fit are removed, so the answer still ends as a complete sentence (strings cut short, optional parts left out); a
// byte is always a token, so the shortest completion itself always fits. In the reasoning phase </think> is forced
// early enough for the shortest answer. forced_close() tells the caller that the budget removed tokens the grammar
// allowed (the server then reports the answer as cut by the length limit).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "engine/constraint_vocab.h"
#include "sampling/grammar_automaton.h"
#include "sampling/token_constraint.h"

namespace dsv4 {

struct OutputConstraintOptions {
  bool thinking = false;                      // generation starts inside the reasoning
  int64_t reasoning_budget = -1;              // < 0: unlimited
  std::shared_ptr<GrammarAutomaton> grammar;  // the answer's grammar (over vocab.trie), or null
  int64_t max_tokens = -1;                    // the generation's token budget (< 0: unknown, never close early)
};

class OutputConstraint : public TokenConstraint {
 public:
  // Throws dsv4::Error if the grammar is over another vocabulary, or a budget is set but there is no </think> token.
  OutputConstraint(std::shared_ptr<const ConstraintVocab> vocab, OutputConstraintOptions opts);

  void apply(std::span<float> logits) override;
  void accept(int32_t token) override;
  // A copy that shares the vocabulary and the grammar automaton (drafts of speculative decoding).
  std::unique_ptr<TokenConstraint> clone() const override;

  bool in_reasoning() const { return reasoning_; }
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  // The answer so far is a complete sentence of the grammar (true without a grammar).
  bool answer_complete();
  // The budget made the constraint close the answer (or the reasoning) early.
  bool forced_close() const { return forced_; }

 private:
  std::shared_ptr<const ConstraintVocab> vocab_;
  OutputConstraintOptions opts_;
  bool reasoning_;
  int64_t reasoning_tokens_ = 0;
  int think_k_ = 0;     // KMP state of "</think>" over the reasoning text
  static constexpr int32_t kNoState = -2;
  // Grammar state (answer phase), taken at the answer's first step. The automaton is shared (other requests, copies
  // of this one) and renumbers its states when it drops its caches (GrammarAutomaton::Limits): a state taken before
  // its last reset is found again from the answer's bytes.
  int32_t state_ = kNoState;
  int64_t state_resets_ = 0;  // the automaton's reset count when state_ was taken
  std::string answer_;        // the answer's bytes so far (grammar phase)
  int32_t state();
  TokenMask mask_;
  int64_t generated_ = 0;  // tokens accepted so far
  bool forced_ = false;
  // Tokens left, including the current step (max_tokens unknown: a large number).
  int64_t left() const { return opts_.max_tokens < 0 ? (int64_t{1} << 40) : opts_.max_tokens - generated_; }
};

}  // namespace dsv4
