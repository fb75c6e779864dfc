// The vocabulary as a byte trie, laid out for computing token masks of a byte-level automaton (GrammarAutomaton).
//
// Nodes are stored in depth-first preorder (children in ascending byte order): node i has the byte of the edge that
// leads to it, its depth (1 = first byte of a token) and end(i), the index one past its subtree, so a walk that
// rejects node i continues at end(i). Tokens are listed in the same preorder: the tokens whose bytes end exactly at
// node i are tokens()[first(i) .. first(i + 1)), and all tokens of its subtree are tokens()[first(i) .. first(end(i))).
// sub_bytes(i) is the set of bytes on the edges strictly below node i (what a walk would still read there).
//
// Tokens with empty bytes (special tokens the caller excludes, ids without a string) are in no node and are never
// allowed by a mask. Immutable after construction; share one instance between requests.
//
// Masks: a TokenMask is one bit per token id.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/grammar.h"

namespace dsv4 {

struct TokenMask {
  std::vector<uint64_t> bits;  // bit t = token t allowed
  void reset(int32_t n_vocab) { bits.assign((static_cast<size_t>(n_vocab) + 63) / 64, 0); }
  bool test(int32_t t) const { return (bits[static_cast<size_t>(t) >> 6] >> (t & 63)) & 1; }
  void set(int32_t t) { bits[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63); }
  void clear(int32_t t) { bits[static_cast<size_t>(t) >> 6] &= ~(uint64_t{1} << (t & 63)); }
  size_t count() const;
};

class VocabTrie {
 public:
  // token_bytes[id] = the bytes of token id ("" = never allowed).
  explicit VocabTrie(std::vector<std::string> token_bytes);

  int32_t n_vocab() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& token_bytes(int32_t id) const { return bytes_[id]; }
  int32_t n_nodes() const { return static_cast<int32_t>(byte_.size()); }

  uint8_t byte(int32_t node) const { return byte_[node]; }
  uint16_t depth(int32_t node) const { return depth_[node]; }
  int32_t end(int32_t node) const { return end_[node]; }
  int32_t first(int32_t node) const { return first_[node]; }  // node may be n_nodes() (sentinel)
  const ByteSet& sub_bytes(int32_t node) const { return sub_[node]; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int max_depth() const { return max_depth_; }
  // The tokens whose bytes are a non-empty prefix of s (shortest first).
  std::vector<int32_t> prefix_tokens(std::string_view s) const;

 private:
  std::vector<std::string> bytes_;
  std::vector<uint8_t> byte_;
  std::vector<uint16_t> depth_;
  std::vector<int32_t> end_, first_;
  std::vector<ByteSet> sub_;
  std::vector<int32_t> tokens_;
  int max_depth_ = 0;
};

}  // namespace dsv4
