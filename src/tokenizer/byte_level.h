// GPT-2 "ByteLevel" byte <-> unicode alphabet used by byte-level BPE vocabularies (HF tokenizers
// `pre_tokenizers::byte_level::bytes_char`): printable bytes map to themselves (as code points), the other 68 bytes
// to U+0100.. in byte order.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dsv4::byte_level {

// Code point that byte b is spelled as in the vocabulary.
uint32_t byte_to_codepoint(uint8_t b);

// Vocabulary spelling -> raw bytes, following the HF ByteLevel decoder: if every character of `token` is in the
// byte alphabet, the bytes it stands for; otherwise nullopt (HF then uses the token's own UTF-8 bytes).
std::optional<std::string> decode_token(std::string_view token);

// Raw bytes -> vocabulary spelling.
std::string encode_bytes(std::string_view bytes);

}  // namespace dsv4::byte_level
