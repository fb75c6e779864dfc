// Sampling parameters of one request, with their validation (OpenAI / vLLM semantics, see sampler.h for the order
// in which they are applied).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4 {

struct SamplingParams {
  // 0 selects greedy decoding (argmax, ties -> lowest id); otherwise logits are divided by it. Range [0, 100].
  float temperature = 1.0f;
  // Keep only the k most probable tokens; 0 (or < 0) disables. Range: any integer, <= 0 means off.
  int32_t top_k = 0;
  // Nucleus: keep the smallest set of most probable tokens whose probability sum reaches top_p. Range (0, 1].
  float top_p = 1.0f;
  // Drop tokens whose probability is below min_p * (probability of the most likely token). Range [0, 1].
  float min_p = 0.0f;
  // CTRL-style penalty on every token seen in the prompt or the output: logit > 0 -> logit / r, else logit * r.
  // 1 disables. Range (0, 10].
  float repetition_penalty = 1.0f;
  // OpenAI penalties on output tokens only: logit -= presence * [count > 0] + frequency * count. Range [-2, 2].
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Seed of the random stream (std::mt19937_64); the same seed and logits give the same tokens.
  uint64_t seed = 0;

  bool greedy() const { return temperature == 0.0f; }
  // Throws dsv4::Error naming the first out-of-range field (e.g. "top_p must be in (0, 1], got 1.5").
  void validate() const;
  // The check of one float field for `value` (a value as given, before it is rounded to float): "" when it is in the
  // field's range, else validate()'s message with `shown` as the value ("presence_penalty must be in [-2, 2], got
  // 1e308": the float would be inf).
  static std::string range_error(float SamplingParams::*field, double value, std::string_view shown);
};

}  // namespace dsv4
