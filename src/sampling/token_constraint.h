// A constraint on the tokens a generation may produce (structured output, forced tokens), consulted by the engine
// at every step: apply() before sampling removes forbidden tokens from the logits (sets them to -infinity), accept()
// after sampling reports the token that was chosen. The sampler then only ever picks allowed tokens; penalties and
// temperature leave -infinity in place. Implementations keep at least one token allowed at every step.
//
// Works on the host logits the engine already has (fp32 [n_vocab]); nothing here touches the model.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>

#include "sampling/vocab_trie.h"

namespace dsv4 {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual void apply(std::span<float> logits) = 0;
  virtual void accept(int32_t token) = 0;
  // An independent copy of the current state (speculative decoding masks its drafts with one, engine/spec_decode.h);
  // null: cannot be copied (drafts are then not masked; the verified tokens still are).
  virtual std::unique_ptr<TokenConstraint> clone() const { return nullptr; }
};

// logits[t] = -infinity for every t not in `allowed` (ids past the mask are forbidden too).
inline void apply_token_mask(const TokenMask& allowed, std::span<float> logits) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t bits = w < allowed.bits.size() ? allowed.bits[w] : 0;
    if (bits == ~uint64_t{0}) continue;
    const size_t end = std::min(n, w * 64 + 64);
    for (size_t t = w * 64; t < end; ++t)
      if (!((bits >> (t - w * 64)) & 1)) logits[t] = kNegInf;
  }
}

}  // namespace dsv4
