// Incremental detokenizer for streaming output: turns a sequence of token ids into UTF-8 text pieces.
// Never emits a partial UTF-8 sequence: bytes of a character split over several tokens are held back until the
// character is complete. Bytes that can never form a valid character (stray continuation bytes, overlong or
// surrogate encodings, 0xF5..0xFF) are emitted as U+FFFD, one per maximal invalid subpart (as Python's
// bytes.decode(errors="replace") does), so every emitted piece is valid UTF-8 and the concatenation of all pieces
// equals decode(ids) whenever decode(ids) is valid UTF-8.
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace dsv4 {

class StreamDecoder {
 public:
  // The tokenizer must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tok);
  // Appends one token; returns the newly completed text (possibly empty). Throws dsv4::Error for a bad id.
  std::string push(int32_t id);
  // Ends the stream: returns held-back bytes of an incomplete character as U+FFFD (empty if none), and resets.
  std::string flush();
  // Number of bytes currently held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  std::string pending_;
};

}  // namespace dsv4
