// Log-probabilities of a generated token and of the most likely alternatives (OpenAI `logprobs` / `top_logprobs`).
//
// Values are the model's own distribution: log_softmax of the raw logits of that position, before penalties,
// grammar masks, temperature and top-k / top-p / min-p (so they do not depend on the sampling settings).
// top: the top_n most likely tokens, most likely first, ties towards the lower id (top_n is clamped to n_vocab).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace dsv4 {

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct TokenLogprobs {
  int32_t id = 0;        // the sampled token
  float logprob = 0.0f;  // its log-probability
  std::vector<TokenLogprob> top;
};

// Throws dsv4::Error if `logits` is empty, `chosen` is out of range or top_n < 0.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int top_n);

}  // namespace dsv4
