#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace dsv4::byte_level {

namespace {
struct Tables {
  std::array<uint32_t, 256> b2c{};
  std::array<int16_t, 324> c2b{};  // code points < 324 only
  Tables() {
    c2b.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      b2c[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      c2b[b2c[b]] = static_cast<int16_t>(b);
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}
}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return tables().b2c[b]; }

std::optional<std::string> decode_token(std::string_view token) {
  const Tables& t = tables();
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    const size_t n = utf8::valid_seq_len(token, i);
    if (n == 0) return std::nullopt;
    const uint32_t cp = utf8::decode_at(token, i, n);
    if (cp >= t.c2b.size() || t.c2b[cp] < 0) return std::nullopt;
    out += static_cast<char>(t.c2b[cp]);
    i += n;
  }
  return out;
}

std::string encode_bytes(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) utf8::append_codepoint(out, tables().b2c[b]);
  return out;
}

}  // namespace dsv4::byte_level
