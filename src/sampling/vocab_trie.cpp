#include "sampling/vocab_trie.h"

#include <algorithm>
#include <bit>
#include <numeric>

#include "core/error.h"

namespace dsv4 {

size_t TokenMask::count() const {
  size_t n = 0;
  for (uint64_t w : bits) n += static_cast<size_t>(std::popcount(w));
  return n;
}

VocabTrie::VocabTrie(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  if (bytes_.empty()) fail("vocabulary trie: no tokens");
  std::vector<int32_t> order;
  for (int32_t i = 0; i < n_vocab(); ++i)
    if (!bytes_[i].empty()) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });

  std::vector<int32_t> path;  // path[d - 1] = open node at depth d
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = bytes_[id];
    if (s.size() > 0xFFFF) fail("vocabulary trie: token {} is {} bytes long", id, s.size());
    size_t c = 0;
    if (prev) {
      const size_t m = std::min(prev->size(), s.size());
      while (c < m && (*prev)[c] == s[c]) ++c;
    }
    while (path.size() > c) {
      end_[path.back()] = n_nodes();
      path.pop_back();
    }
    for (size_t d = c + 1; d <= s.size(); ++d) {
      path.push_back(n_nodes());
      byte_.push_back(static_cast<uint8_t>(s[d - 1]));
      depth_.push_back(static_cast<uint16_t>(d));
      end_.push_back(0);
      first_.push_back(static_cast<int32_t>(tokens_.size()));
    }
    tokens_.push_back(id);
    max_depth_ = std::max(max_depth_, static_cast<int>(s.size()));
    prev = &s;
  }
  while (!path.empty()) {
    end_[path.back()] = n_nodes();
    path.pop_back();
  }
  first_.push_back(static_cast<int32_t>(tokens_.size()));
  sub_.assign(byte_.size(), ByteSet{});
  for (int32_t i = n_nodes() - 1; i >= 0; --i)
    for (int32_t c = i + 1; c < end_[i]; c = end_[c]) {
      sub_[i] |= sub_[c];
      sub_[i].add(byte_[c]);
    }
}

std::vector<int32_t> VocabTrie::prefix_tokens(std::string_view s) const {
  std::vector<int32_t> out;
  int32_t lo = 0, hi = n_nodes();  // the sibling range of the current depth
  for (char c : s) {
    int32_t node = -1;
    for (int32_t i = lo; i < hi; i = end_[i])
      if (byte_[i] == static_cast<uint8_t>(c)) {
        node = i;
        break;
      }
    if (node < 0) break;
    for (int32_t k = first_[node]; k < first_[node + 1]; ++k) out.push_back(tokens_[k]);
    lo = node + 1;
    hi = end_[node];
  }
  return out;
}

}  // namespace dsv4
