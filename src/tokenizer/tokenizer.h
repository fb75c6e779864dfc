// Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json` (spec §7.1).
//
// Pipeline of encode(), identical to HF `tokenizers` for the DeepSeek V4 tokenizer.json:
//   1. added tokens (the `added_tokens` list; for V4 all 1283 are special) are matched whole, leftmost-longest,
//      when parse_special is true; the text between them goes through steps 2-4;
//   2. pre-tokenizer: a Sequence of `Split` regexes (behaviour "Isolated": matches and the gaps between them both
//      become pieces; each regex runs on the pieces of the previous one), then `ByteLevel` (bytes -> GPT-2 unicode
//      alphabet; we skip the remap and run BPE on raw bytes, which is equivalent);
//   3. BPE with the `merges` ranks (string "a b" or pair ["a","b"] form), lowest rank first, leftmost on ties;
//   4. ids. No BOS/EOS is ever added (`add_bos_token: false`; the chat renderer writes BOS into the prompt).
// Regexes use PCRE2 (UTF + UCP + JIT), compiled once at load.
//
// Input bytes that are not valid UTF-8 (HF cannot receive those) are each tokenized as one isolated byte piece,
// so decode(encode(x)) == x holds for every byte string.
//
// Thread safety: encode/decode/... are const and may be called from many threads at once (the BPE word cache is
// guarded by a mutex; regex match data is per call).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

class Tokenizer {
 public:
  // Loads tokenizer.json. Throws dsv4::Error naming the file and the problem for unreadable/malformed files or
  // unsupported components (normalizers other than an empty Sequence, non-BPE models, unknown pre-tokenizers).
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json);
  // Same, from the JSON text; `origin` names the source in error messages.
  static Tokenizer from_json_text(std::string_view json_text, std::string_view origin = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // parse_special=true: added/special tokens are matched anywhere in the text (as HF tokenizers does by default;
  //   `dsv4 tokenize` uses this).
  // parse_special=false: the text is plain bytes; a special-token string inside it is NOT a control token, it is
  //   BPE-encoded like any other text (what user/tool content must use: prompt-injection safety). Added tokens
  //   that are not special (none in V4) are still matched, as HF does with split_special_tokens.
  // Never adds BOS/EOS. Returns token ids in [0, n_vocab()).
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;

  // Exact bytes of the tokens concatenated (special tokens give their text, e.g. "<｜User｜>"). The result may end
  // in (or contain) a partial UTF-8 sequence when the ids cut through a character; HF would show U+FFFD there.
  // Throws dsv4::Error for an id outside [0, n_vocab()).
  std::string decode(std::span<const int32_t> ids) const;
  // Bytes of one token (same rules as decode).
  const std::string& token_bytes(int32_t id) const;

  // Number of token ids (max id + 1 over vocab and added tokens): 129,280 for V4.
  int32_t n_vocab() const;
  // Id of a token given its text: an added/special token's content (e.g. "<｜User｜>", "</think>") or a BPE vocab
  // entry in its tokenizer.json spelling (GPT-2 byte alphabet, e.g. "Ġthe"). nullopt if unknown.
  std::optional<int32_t> token_id(std::string_view token_text) const;
  // True for ids of added tokens marked "special" in tokenizer.json (BOS/EOS/pad, <｜User｜>, <think>, ｜DSML｜, ...).
  bool is_special(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4
