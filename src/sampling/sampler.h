// Token sampler: turns one position's logits into the next token id, reproducibly for a given seed.
//
// Order of operations (vLLM semantics), on fp32 logits [n_vocab]:
//   1. repetition_penalty on every token of the prompt or the output so far (logit > 0 ? l / r : l * r);
//   2. presence / frequency penalties on output tokens: l -= presence * [count > 0] + frequency * count;
//   3. temperature == 0: argmax (ties -> lowest id), done;
//   4. l / temperature, softmax over the vocabulary;
//   5. min_p: drop tokens with p < min_p * p_max;   6. top_k: keep the k most probable (ties -> lower id);
//   7. top_p: keep the smallest most-probable prefix (sorted by p desc, id asc) whose mass reaches top_p;
//   8. draw u = (rng() >> 11) * 2^-53 from std::mt19937_64(seed), one draw per sampled token, and walk the kept
//      tokens in ascending id order until the cumulative (unnormalised) mass exceeds u * total.
// The same seed, parameters and logits always give the same tokens.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "sampling/sampling_params.h"

namespace dsv4 {

class Sampler {
 public:
  // Throws dsv4::Error if `params` is invalid (SamplingParams::validate) or n_vocab <= 0.
  Sampler(const SamplingParams& params, int32_t n_vocab);

  // The prompt tokens (subject to the repetition penalty). Replaces any earlier prompt.
  void set_prompt(std::span<const int32_t> prompt);
  // Record a generated token (subject to all penalties).
  void accept(int32_t token);
  // Choose the next token. `logits` has n_vocab entries and is modified in place (penalties, scaling).
  // Throws dsv4::Error if its size differs from n_vocab.
  int32_t sample(std::span<float> logits);

  const SamplingParams& params() const { return params_; }

  // Speculative decoding (engine/spec_decode.h):
  // The distribution sample() draws from for these logits and the tokens accepted so far (steps 1-7), normalized,
  // dense [n_vocab] (0 outside the kept set; greedy: one-hot at the argmax). `logits` is modified in place.
  void distribution(std::span<float> logits, std::vector<float>& p);
  // One uniform draw in [0, 1) from the sampler's stream (the draw of step 8).
  double uniform();
  // Undo one accept(token) (penalties of tentative draft tokens).
  void unaccept(int32_t token);

 private:
  void apply_penalties(std::span<float> logits) const;
  // Steps 4-7 for a non-greedy sampler: prob_ = unnormalised probabilities, idx_ = kept ids in ascending order.
  void keep_candidates(std::span<float> logits);

  SamplingParams params_;
  int32_t n_vocab_;
  std::mt19937_64 rng_;
  std::vector<uint8_t> in_prompt_;                     // [n_vocab], 1 if the token occurs in the prompt
  std::vector<int32_t> prompt_ids_;                    // distinct prompt tokens
  std::unordered_map<int32_t, int32_t> output_count_;  // token -> occurrences in the output
  std::vector<int32_t> idx_;                           // scratch candidate ids
  std::vector<int32_t> heap_;                          // scratch top-k selection
  std::vector<float> prob_;                            // scratch [n_vocab] unnormalised probabilities
};

// Argmax with ties broken towards the lowest id (-0 == +0; NaNs never win, except a NaN at index 0): the result of
// `if (l[i] > l[best]) best = i` over i ascending, in one vectorized pass. Empty `logits`: 0.
int32_t argmax(std::span<const float> logits);

}  // namespace dsv4
