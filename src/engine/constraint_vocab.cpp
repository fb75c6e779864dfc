#include "engine/constraint_vocab.h"

#include "core/error.h"

namespace dsv4 {

ConstraintVocab::ConstraintVocab(const Tokenizer& tok, int32_t n_vocab, int32_t eos_id) : eos(eos_id) {
  if (n_vocab < tok.n_vocab())
    fail("constraint vocabulary: model vocabulary {} < tokenizer's {}", n_vocab, tok.n_vocab());
  if (auto t = tok.token_id("</think>")) think_end = *t;
  if (auto t = tok.token_id("｜DSML｜")) dsml = *t;
  std::vector<std::string> bytes(n_vocab);
  all_bytes_.resize(n_vocab);
  for (int32_t i = 0; i < tok.n_vocab(); ++i) {
    all_bytes_[i] = tok.token_bytes(i);
    if (i == eos) continue;
    if (tok.is_special(i) && i != dsml) continue;
    bytes[i] = all_bytes_[i];
  }
  trie = std::make_shared<VocabTrie>(std::move(bytes));
}

int ConstraintVocab::think_kmp(int k, std::string_view bytes) {
  // "</think>" has no proper border, so the failure function is 0 everywhere but at its first byte.
  for (char c : bytes) {
    if (k == 8) return 8;
    if (c == kThinkEnd[k])
      ++k;
    else
      k = c == kThinkEnd[0] ? 1 : 0;
  }
  return k;
}

const TokenMask& ConstraintVocab::think_completing(int k) const {
  if (k < 0 || k >= 8) fail("think_completing: state {} out of range", k);
  std::lock_guard lk(mu_);
  if (!completing_[k]) {
    auto m = std::make_unique<TokenMask>();
    m->reset(n_vocab());
    for (int32_t t = 0; t < n_vocab(); ++t)
      if (!all_bytes_[t].empty() && think_kmp(k, all_bytes_[t]) == 8) m->set(t);
    completing_[k] = std::move(m);
  }
  return *completing_[k];
}

}  // namespace dsv4
