// The narrow interface the generation engine (src/engine) and the server need from a language model.
// dsv4::Model (src/model/model.h) implements it for DeepSeek V4 checkpoints; tests implement it with doubles.
// Nothing here exposes tensors: server and engine code stay free of tensor details.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dsv4 {

// Per-sequence model state (KV window ring, compressed rows, compressor frontier, indexer rows for DeepSeek V4),
// together with the tokens it has consumed. Owned by one request at a time; never shared between sequences.
class LmSequence {
 public:
  virtual ~LmSequence() = default;
  // Number of positions consumed so far (== tokens().size()).
  virtual int64_t n_past() const = 0;
  // Every token consumed so far, in order.
  virtual const std::vector<int32_t>& tokens() const = 0;
  // Append `tokens` (a prefill chunk of any length >= 1, or one decode token) at positions n_past()...
  // and write the next-token logits of the LAST appended position to `last_logits` (fp32, size n_vocab()).
  // Throws dsv4::Error if the logits are non-finite or n_past() + tokens.size() exceeds the model's context.
  virtual void append(std::span<const int32_t> tokens, std::span<float> last_logits) = 0;
  // Drop every position >= p (0 <= p <= n_past()). Afterwards the state is identical to a cold prefill
  // of tokens()[0:p]. Throws dsv4::Error if p is out of range.
  virtual void rewind(int64_t p) = 0;
  // Bytes of state held by this sequence (for accounting and logs).
  virtual size_t memory_bytes() const = 0;
};

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual int32_t n_vocab() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  // Largest number of positions a sequence may hold (config max_position_embeddings).
  virtual int64_t max_context() const = 0;
  // A fresh, empty sequence (n_past() == 0).
  virtual std::unique_ptr<LmSequence> new_sequence() const = 0;
};

}  // namespace dsv4
