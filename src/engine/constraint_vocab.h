// Vocabulary data for constrained chat generation, built once per tokenizer and shared by all requests.
//
//   trie:       the byte strings of every token a grammar may produce: all non-special tokens plus the ｜DSML｜
//               special token (DSML tool calls are spelled with it); EOS, </think> and the other special tokens are
//               not in it (the constraint allows them explicitly). Sized to the model's vocabulary: ids the tokenizer
//               does not know have no bytes and are never allowed.
//   eos, think_end, dsml: token ids (-1 when the tokenizer lacks them).
//   think_completing(k): the tokens that would complete the text "</think>" when the text so far ends with its
//               first k bytes (0 <= k < 8) — computed on first use, 16 KiB each.
// Building the trie of the 129,280-token V4 vocabulary takes about 0.1 s; thread-safe after construction.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>

#include "sampling/vocab_trie.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

class ConstraintVocab {
 public:
  // n_vocab: the model's vocabulary size (>= tok.n_vocab()).
  ConstraintVocab(const Tokenizer& tok, int32_t n_vocab, int32_t eos_id);

  std::shared_ptr<const VocabTrie> trie;
  int32_t eos = -1, think_end = -1, dsml = -1;
  int32_t n_vocab() const { return trie->n_vocab(); }

  static constexpr std::string_view kThinkEnd = "</think>";
  const TokenMask& think_completing(int k) const;
  // KMP state after `bytes`, starting from state k (8 = "</think>" was completed).
  static int think_kmp(int k, std::string_view bytes);

 private:
  std::vector<std::string> all_bytes_;  // every token's bytes (for the </think> scan)
  mutable std::mutex mu_;
  mutable std::array<std::unique_ptr<TokenMask>, 8> completing_;
};

}  // namespace dsv4
