#include "sampling/grammar.h"

#include <fmt/format.h>

#include <map>
#include <utility>

#include "core/error.h"

namespace dsv4 {

namespace {

constexpr int64_t kMaxRepeat = 1 << 16;

std::string set_to_string(const ByteSet& s) {
  auto one = [](int b) {
    if (b >= 0x21 && b < 0x7f && b != '\\' && b != ']' && b != '-' && b != '^') return std::string(1, char(b));
    return fmt::format("\\x{:02X}", b);
  };
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!s.has(static_cast<uint8_t>(b))) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && s.has(static_cast<uint8_t>(e + 1))) ++e;
    out += one(b);
    if (e > b + 1) out += '-';
    if (e > b) out += one(e);
    b = e + 1;
  }
  return out + "]";
}

// UTF-8 decoding automaton: 0 = at a character boundary; 1..3 = 1..3 continuation bytes (80-BF) missing;
// 4 = after E0 (A0-BF next), 5 = after ED (80-9F), 6 = after F0 (90-BF), 7 = after F4 (80-8F). -1 = invalid.
int utf8_next(int u, uint8_t b) {
  const bool cont = b >= 0x80 && b <= 0xBF;
  switch (u) {
    case 0:
      if (b < 0x80) return 0;
      if (b >= 0xC2 && b <= 0xDF) return 1;
      if (b == 0xE0) return 4;
      if (b == 0xED) return 5;
      if (b >= 0xE1 && b <= 0xEF) return 2;
      if (b == 0xF0) return 6;
      if (b >= 0xF1 && b <= 0xF3) return 3;
      if (b == 0xF4) return 7;
      return -1;
    case 1:
      return cont ? 0 : -1;
    case 2:
      return cont ? 1 : -1;
    case 3:
      return cont ? 2 : -1;
    case 4:
      return b >= 0xA0 && b <= 0xBF ? 1 : -1;
    case 5:
      return b >= 0x80 && b <= 0x9F ? 1 : -1;
    case 6:
      return b >= 0x90 && b <= 0xBF ? 2 : -1;
    case 7:
      return b >= 0x80 && b <= 0x8F ? 2 : -1;
  }
  return -1;
}

}  // namespace

int32_t GrammarBuilder::rule(std::string_view name) {
  rules_.push_back(RuleDef{std::string(name), {}});
  return static_cast<int32_t>(rules_.size()) - 1;
}

void GrammarBuilder::add(int32_t r, Seq alternative) {
  if (r < 0 || r >= n_rules()) fail("grammar: no rule {}", r);
  rules_[r].alts.push_back(std::move(alternative));
}

GrammarBuilder::Sym GrammarBuilder::bytes(const ByteSet& s) {
  if (s.empty()) fail("grammar: empty byte set");
  for (size_t i = 0; i < sets_.size(); ++i)
    if (sets_[i] == s) return Sym{false, static_cast<int32_t>(i)};
  sets_.push_back(s);
  return Sym{false, static_cast<int32_t>(sets_.size()) - 1};
}

GrammarBuilder::Seq GrammarBuilder::lit(std::string_view s) {
  Seq out;
  out.reserve(s.size());
  for (char c : s) out.push_back(byte(static_cast<uint8_t>(c)));
  return out;
}

GrammarBuilder::Sym GrammarBuilder::choice(std::vector<Seq> alternatives, std::string_view name) {
  const int32_t r = rule(name);
  for (auto& a : alternatives) add(r, std::move(a));
  return ref(r);
}

GrammarBuilder::Sym GrammarBuilder::opt(Seq body) {
  const int32_t r = rule("opt");
  add(r, std::move(body));
  add(r, {});
  return ref(r);
}

GrammarBuilder::Sym GrammarBuilder::star(Seq body) {
  const int32_t r = rule("star");
  body.push_back(ref(r));
  add(r, std::move(body));
  add(r, {});
  return ref(r);
}

GrammarBuilder::Sym GrammarBuilder::plus(Seq body) {
  Seq seq = body;
  seq.push_back(star(std::move(body)));
  return choice({std::move(seq)}, "plus");
}

GrammarBuilder::Sym GrammarBuilder::repeat(Seq body, int64_t min, int64_t max) {
  if (min < 0 || (max >= 0 && max < min)) fail("grammar: bad repetition bounds {{{},{}}}", min, max);
  if (min > kMaxRepeat || max > kMaxRepeat) fail("grammar: repetition bound above {}", kMaxRepeat);
  Seq seq;
  for (int64_t i = 0; i < min; ++i) append(seq, body);
  if (max < 0) {
    seq.push_back(star(body));
  } else if (max > min) {
    // O_1 := body | ε;  O_k := body O_{k-1} | ε  (so that at most max - min more copies follow).
    int32_t prev = -1;
    for (int64_t k = 1; k <= max - min; ++k) {
      const int32_t r = rule("rep");
      Seq alt = body;
      if (prev >= 0) alt.push_back(ref(prev));
      add(r, std::move(alt));
      add(r, {});
      prev = r;
    }
    seq.push_back(ref(prev));
  }
  return choice({std::move(seq)}, "repeat");
}

GrammarBuilder::Sym GrammarBuilder::utf8_char(const ByteSet& ascii) {
  if (utf8_multi_ < 0) {
    utf8_multi_ = rule("utf8_multibyte");
    const Sym c = bytes(ByteSet::range(0x80, 0xBF));
    add(utf8_multi_, {bytes(ByteSet::range(0xC2, 0xDF)), c});
    add(utf8_multi_, {byte(0xE0), bytes(ByteSet::range(0xA0, 0xBF)), c});
    ByteSet e3 = ByteSet::range(0xE1, 0xEC);
    e3.add_range(0xEE, 0xEF);
    add(utf8_multi_, {bytes(e3), c, c});
    add(utf8_multi_, {byte(0xED), bytes(ByteSet::range(0x80, 0x9F)), c});
    add(utf8_multi_, {byte(0xF0), bytes(ByteSet::range(0x90, 0xBF)), c, c});
    add(utf8_multi_, {bytes(ByteSet::range(0xF1, 0xF3)), c, c, c});
    add(utf8_multi_, {byte(0xF4), bytes(ByteSet::range(0x80, 0x8F)), c, c});
  }
  ByteSet a;
  for (int b = 0; b < 0x80; ++b)
    if (ascii.has(static_cast<uint8_t>(b))) a.add(static_cast<uint8_t>(b));
  if (a.empty()) return ref(utf8_multi_);
  return choice({{bytes(a)}, {ref(utf8_multi_)}}, "utf8_char");
}

GrammarBuilder::Sym GrammarBuilder::utf8_text_without(std::string_view f) {
  if (f.empty()) fail("grammar: utf8_text_without needs a non-empty string");
  const int L = static_cast<int>(f.size());
  // KMP failure function and transition.
  std::vector<int> fail_fn(L, 0);
  for (int i = 1, k = 0; i < L; ++i) {
    while (k > 0 && f[i] != f[k]) k = fail_fn[k - 1];
    if (f[i] == f[k]) ++k;
    fail_fn[i] = k;
  }
  auto kmp = [&](int k, uint8_t b) {
    while (k > 0 && static_cast<uint8_t>(f[k]) != b) k = fail_fn[k - 1];
    return static_cast<uint8_t>(f[k]) == b ? k + 1 : 0;
  };
  // Product automaton (kmp state, utf8 state) as right-linear rules, built breadth first from (0, 0).
  std::map<std::pair<int, int>, int32_t> ids;
  std::vector<std::pair<int, int>> todo;
  auto get = [&](int k, int u) {
    auto [it, fresh] = ids.emplace(std::make_pair(k, u), 0);
    if (fresh) {
      it->second = rule("text_without");
      todo.emplace_back(k, u);
    }
    return it->second;
  };
  const int32_t start = get(0, 0);
  for (size_t i = 0; i < todo.size(); ++i) {
    const auto [k, u] = todo[i];
    const int32_t r = ids[{k, u}];
    std::map<std::pair<int, int>, ByteSet> by_next;
    for (int b = 0; b < 256; ++b) {
      const int u2 = utf8_next(u, static_cast<uint8_t>(b));
      if (u2 < 0) continue;
      const int k2 = kmp(k, static_cast<uint8_t>(b));
      if (k2 == L) continue;
      by_next[{k2, u2}].add(static_cast<uint8_t>(b));
    }
    for (const auto& [next, set] : by_next) add(r, {bytes(set), ref(get(next.first, next.second))});
    if (u == 0) add(r, {});
  }
  return ref(start);
}

Grammar GrammarBuilder::build(int32_t root) const {
  const int32_t n = n_rules();
  if (root < 0 || root >= n) fail("grammar: root rule {} does not exist", root);
  for (int32_t r = 0; r < n; ++r) {
    if (rules_[r].alts.empty()) fail("grammar: rule '{}' ({}) has no alternative", rules_[r].name, r);
    for (const auto& a : rules_[r].alts)
      for (const Sym& s : a) {
        if (s.rule && (s.id < 0 || s.id >= n))
          fail("grammar: rule '{}' refers to undefined rule {}", rules_[r].name, s.id);
        if (!s.rule && (s.id < 0 || s.id >= static_cast<int32_t>(sets_.size())))
          fail("grammar: rule '{}' uses an undefined byte set", rules_[r].name);
      }
  }
  // Productive and nullable rules (fixpoints).
  std::vector<char> productive(n, 0), nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < n; ++r) {
      for (const auto& a : rules_[r].alts) {
        bool prod = true, null = true;
        for (const Sym& s : a) {
          if (s.rule) {
            prod = prod && productive[s.id];
            null = null && nullable[s.id];
          } else {
            null = false;
          }
        }
        if (prod && !productive[r]) productive[r] = 1, changed = true;
        if (null && !nullable[r]) nullable[r] = 1, changed = true;
      }
    }
  }
  for (int32_t r = 0; r < n; ++r)
    if (!productive[r]) fail("grammar: rule '{}' ({}) derives no finite string", rules_[r].name, r);
  // Left recursion: r -> s when s can come first in an alternative of r (after nullable rules only).
  std::vector<std::vector<int32_t>> first(n);
  for (int32_t r = 0; r < n; ++r)
    for (const auto& a : rules_[r].alts)
      for (const Sym& s : a) {
        if (!s.rule) break;
        first[r].push_back(s.id);
        if (!nullable[s.id]) break;
      }
  std::vector<char> color(n, 0);  // 0 new, 1 on the DFS stack, 2 done
  std::vector<std::pair<int32_t, size_t>> st;
  for (int32_t r0 = 0; r0 < n; ++r0) {
    if (color[r0]) continue;
    st.push_back({r0, 0});
    color[r0] = 1;
    while (!st.empty()) {
      auto& [r, i] = st.back();
      if (i < first[r].size()) {
        const int32_t s = first[r][i++];
        if (color[s] == 1) fail("grammar: rule '{}' ({}) is left-recursive", rules_[s].name, s);
        if (color[s] == 0) {
          color[s] = 1;
          st.push_back({s, 0});
        }
      } else {
        color[r] = 2;
        st.pop_back();
      }
    }
  }
  Grammar g;
  g.sets_ = sets_;
  g.root_ = root;
  g.alts_.resize(n);
  g.names_.resize(n);
  for (int32_t r = 0; r < n; ++r) {
    g.names_[r] = rules_[r].name;
    for (const auto& a : rules_[r].alts) {
      g.alts_[r].push_back(static_cast<int32_t>(g.elems_.size()));
      for (const Sym& s : a) g.elems_.push_back({s.rule ? Grammar::Kind::kRule : Grammar::Kind::kBytes, s.id});
      g.elems_.push_back({Grammar::Kind::kEnd, r});
    }
  }
  return g;
}

std::string Grammar::to_string() const {
  std::string out;
  for (int32_t r = 0; r < n_rules(); ++r) {
    out += fmt::format("{}{}#{} ::=", r == root_ ? "*" : "", names_[r], r);
    bool first_alt = true;
    for (int32_t p : alts_[r]) {
      out += first_alt ? " " : " | ";
      first_alt = false;
      if (elems_[p].kind == Kind::kEnd) out += "()";
      for (; elems_[p].kind != Kind::kEnd; ++p) {
        if (elems_[p].kind == Kind::kBytes)
          out += set_to_string(sets_[elems_[p].arg]);
        else
          out += fmt::format("{}#{}", names_[elems_[p].arg], elems_[p].arg);
        if (elems_[p + 1].kind != Kind::kEnd) out += " ";
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace dsv4
