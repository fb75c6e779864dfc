// UTF-8 helpers used by the tokenizer and the streaming decoder (no locale, no allocation).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4::utf8 {

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when the bytes there do not start a valid
// sequence (RFC 3629: no overlongs, no surrogates, max U+10FFFF). A sequence cut by the end of s returns 0.
size_t valid_seq_len(std::string_view s, size_t i);

// Length of the longest prefix of s[i..] that is an incomplete-but-so-far-valid sequence (for streaming): returns
// k > 0 if s[i..i+k) with k = s.size()-i could still become a valid character with more bytes, else 0.
size_t incomplete_tail(std::string_view s, size_t i);

// Appends U+FFFD.
inline void append_replacement(std::string& out) { out += "\xEF\xBF\xBD"; }

// Appends the UTF-8 encoding of code point cp (cp <= 0x10FFFF).
void append_codepoint(std::string& out, uint32_t cp);

// Decodes the sequence of valid_seq_len() bytes at s[i].
uint32_t decode_at(std::string_view s, size_t i, size_t len);

// True if the whole string is valid UTF-8.
bool is_valid(std::string_view s);

}  // namespace dsv4::utf8
