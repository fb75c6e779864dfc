// Matcher for added tokens (HF AddedVocabulary): finds occurrences of any token's exact text, leftmost-longest
// (same result as HF's Aho-Corasick LeftmostLongest), using a byte trie.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

class AddedTokenMatcher {
 public:
  void add(std::string_view text, int32_t id, bool special);  // empty text is ignored

  struct Match {
    size_t begin = 0, end = 0;
    int32_t id = -1;
  };
  // First (leftmost, then longest) match at or after `from`; returns false if none. include_special=false
  // ignores tokens added as special (they are then plain text).
  bool find(std::string_view text, size_t from, Match& m, bool include_special) const;
  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;  // sorted by byte
    int32_t token = -1;
    bool special = false;
  };
  int32_t child(int32_t node, unsigned char b) const;
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_byte_{};          // first bytes of any token
  std::array<bool, 256> first_byte_plain_{};    // first bytes of non-special tokens
};

}  // namespace dsv4
