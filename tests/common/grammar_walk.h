// Random sentences of a grammar, for property tests: a random walk over the automaton's bytes (favouring
// structural bytes: quotes, brackets, commas, colons, newlines, '<' '>' '/'), that may stop at any accepting state,
// and after a random length budget finishes with the shortest completion (GrammarAutomaton::shortest_completion), so
// that long literals (DSML closing tags) and unbounded strings still end.
#pragma once
#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "sampling/grammar_automaton.h"

namespace dsv4::test {

// `prefix`: bytes the sentence starts with (nullopt if the grammar does not allow them).
inline std::optional<std::string> random_sentence(GrammarAutomaton& a, std::mt19937& rng, size_t max_bytes = 4000,
                                                  const std::string& prefix = "") {
  std::string out = prefix;
  int32_t s = a.step_bytes(a.start(), prefix);
  if (s < 0) return std::nullopt;
  static const std::string kFavoured = "\"{}[],:<>/\n";
  const size_t budget = prefix.size() + 8 + rng() % 120;
  while (out.size() < max_bytes) {
    const bool can_end = a.accepting(s);
    if (can_end && (!a.can_continue(s) || rng() % 4 == 0)) return out;
    if (out.size() >= budget) {
      auto rest = a.shortest_completion(s);
      if (!rest) return std::nullopt;
      return out + *rest;
    }
    std::vector<std::pair<int, double>> opts;
    double total = 0;
    for (int b = 0; b < 256; ++b) {
      if (a.step(s, static_cast<uint8_t>(b)) < 0) continue;
      const double w = kFavoured.find(static_cast<char>(b)) != std::string::npos ? 25.0 : b >= 0x80 ? 0.3 : 1.0;
      opts.emplace_back(b, w);
      total += w;
    }
    if (opts.empty()) return std::nullopt;  // cannot happen: a live state can continue or is accepting
    double u = std::uniform_real_distribution<double>(0, total)(rng);
    int pick = opts.back().first;
    for (const auto& [b, w] : opts) {
      if (u < w) {
        pick = b;
        break;
      }
      u -= w;
    }
    out += static_cast<char>(pick);
    s = a.step(s, static_cast<uint8_t>(pick));
  }
  return std::nullopt;
}

}  // namespace dsv4::test
