#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <cstring>

namespace dsv4 {

int32_t AddedTokenMatcher::child(int32_t node, unsigned char b) const {
  const auto& nx = nodes_[node].next;
  const auto it = std::lower_bound(nx.begin(), nx.end(), b, [](const auto& p, unsigned char v) { return p.first < v; });
  return it != nx.end() && it->first == b ? it->second : -1;
}

void AddedTokenMatcher::add(std::string_view text, int32_t id, bool special) {
  if (text.empty()) return;
  first_byte_[static_cast<unsigned char>(text[0])] = true;
  if (!special) first_byte_plain_[static_cast<unsigned char>(text[0])] = true;
  int32_t node = 0;
  for (unsigned char b : text) {
    int32_t c = child(node, b);
    if (c < 0) {
      c = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(Node{});
      auto& nx = nodes_[node].next;
      const auto it =
          std::lower_bound(nx.begin(), nx.end(), b, [](const auto& p, unsigned char v) { return p.first < v; });
      nx.insert(it, {b, c});
    }
    node = c;
  }
  if (nodes_[node].token < 0) {  // first definition wins
    nodes_[node].token = id;
    nodes_[node].special = special;
  }
}

bool AddedTokenMatcher::find(std::string_view text, size_t from, Match& m, bool include_special) const {
  if (empty()) return false;
  const auto& first = include_special ? first_byte_ : first_byte_plain_;
  const auto* data = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = from; i < text.size(); ++i) {
    if (!first[data[i]]) continue;
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, data[j]);
      if (node < 0) break;
      if (nodes_[node].token >= 0 && (include_special || !nodes_[node].special)) {
        best = nodes_[node].token;
        best_end = j + 1;
      }
    }
    if (best >= 0) {
      m = Match{i, best_end, best};
      return true;
    }
  }
  return false;
}

}  // namespace dsv4
