// A tiny byte-level tokenizer.json for tests, generated in memory: ids 0/1/2 = BOS/EOS/pad, 3..258 = the 256 bytes
// (GPT-2 byte alphabet spelling, no merges), then the DeepSeek V4 chat control tokens. Same JSON layout as the real
// tokenizer.json, so it goes through the real Tokenizer loader.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dsv4::test {

inline std::vector<std::string> tiny_special_tokens() {
  return {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"};
}
inline std::vector<std::string> tiny_control_tokens() {
  return {"<｜User｜>",   "<｜Assistant｜>", "<think>",         "</think>",     "｜DSML｜",    "<｜latest_reminder｜>",
          "<｜action｜>", "<｜query｜>",     "<｜authority｜>", "<｜domain｜>", "<｜title｜>", "<｜read_url｜>"};
}

inline std::string tiny_tokenizer_json() {
  // GPT-2 bytes_to_unicode.
  std::vector<int> cps(256);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    cps[b] = printable ? b : 256 + n++;
  }
  auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  int id = 0;
  auto add_special = [&](const std::string& s) {
    added.push_back({{"id", id},
                     {"content", s},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
    vocab[s] = id++;
  };
  for (const auto& s : tiny_special_tokens()) add_special(s);
  for (int b = 0; b < 256; ++b) vocab[utf8(cps[b])] = id++;
  for (const auto& s : tiny_control_tokens()) add_special(s);
  nlohmann::ordered_json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", nlohmann::ordered_json::array()}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"vocab", vocab},
        {"merges", nlohmann::ordered_json::array()}}}};
  return j.dump();
}

inline int32_t tiny_vocab_size() { return 3 + 256 + static_cast<int32_t>(tiny_control_tokens().size()); }

inline const Tokenizer& tiny_tokenizer() {
  static Tokenizer tok = Tokenizer::from_json_text(tiny_tokenizer_json(), "tiny tokenizer.json");
  return tok;
}

}  // namespace dsv4::test
