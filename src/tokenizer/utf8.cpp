#include "tokenizer/utf8.h"

namespace dsv4::utf8 {

namespace {
inline bool cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Valid range of the second byte for a given lead byte (Unicode Table 3-7), 0 lead = invalid.
inline bool second_ok(unsigned char lead, unsigned char b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return cont(b);
}

inline size_t seq_len_of_lead(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}
}  // namespace

size_t valid_seq_len(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const size_t n = seq_len_of_lead(c);
  if (n <= 1) return n;
  if (i + n > s.size()) return 0;
  if (!second_ok(c, static_cast<unsigned char>(s[i + 1]))) return 0;
  for (size_t k = 2; k < n; ++k)
    if (!cont(static_cast<unsigned char>(s[i + k]))) return 0;
  return n;
}

size_t incomplete_tail(std::string_view s, size_t i) {
  const size_t avail = s.size() - i;
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const size_t n = seq_len_of_lead(c);
  if (n <= 1 || avail >= n) return 0;
  if (avail >= 2 && !second_ok(c, static_cast<unsigned char>(s[i + 1]))) return 0;
  for (size_t k = 2; k < avail; ++k)
    if (!cont(static_cast<unsigned char>(s[i + k]))) return 0;
  return avail;
}

void append_codepoint(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t decode_at(std::string_view s, size_t i, size_t len) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (len) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

bool is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = valid_seq_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace dsv4::utf8
