#include "tokenizer/stream_decoder.h"

#include "tokenizer/utf8.h"

namespace dsv4 {

StreamDecoder::StreamDecoder(const Tokenizer& tok) : tok_(&tok) {}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_->token_bytes(id);
  std::string out;
  size_t i = 0;
  const size_t n = pending_.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(pending_[i]);
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    const size_t len = utf8::valid_seq_len(pending_, i);
    if (len > 0) {
      out.append(pending_, i, len);
      i += len;
      continue;
    }
    if (utf8::incomplete_tail(pending_, i) > 0) break;  // wait for the rest of the character
    // Maximal invalid subpart: the lead byte plus the continuation bytes that were valid so far.
    size_t k = 1;
    while (i + k < n && utf8::incomplete_tail(std::string_view(pending_).substr(0, i + k + 1), i) > 0) ++k;
    utf8::append_replacement(out);
    i += k;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  if (!pending_.empty()) utf8::append_replacement(out);
  pending_.clear();
  return out;
}

}  // namespace dsv4
