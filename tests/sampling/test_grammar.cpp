// Grammar IR, the lazily determinized automaton and its token masks over a vocabulary trie.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "core/error.h"
#include "sampling/grammar.h"
#include "sampling/grammar_automaton.h"
#include "sampling/vocab_trie.h"

using namespace dsv4;
using Seq = GrammarBuilder::Seq;

namespace {

std::shared_ptr<const VocabTrie> byte_vocab() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  return std::make_shared<VocabTrie>(v);
}

struct Matcher {
  explicit Matcher(Grammar g, std::shared_ptr<const VocabTrie> v = byte_vocab()) : a(std::move(g), std::move(v)) {}
  int32_t run(std::string_view s) { return a.step_bytes(a.start(), s); }
  bool accepts(std::string_view s) {
    const int32_t st = run(s);
    return st >= 0 && a.accepting(st);
  }
  bool viable(std::string_view s) { return run(s) >= 0; }
  GrammarAutomaton a;
};

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (int k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n + 1;
  }
  return true;
}

}  // namespace

TEST(Grammar, LiteralsAlternativesAndRepetition) {
  GrammarBuilder b;
  const int32_t root = b.rule("root");
  // root := "ab" ("c" | "dd")* "x"{2,3}
  b.add(root,
        GrammarBuilder::cat(b.lit("ab"), b.star({b.choice({b.lit("c"), b.lit("dd")})}), b.repeat(b.lit("x"), 2, 3)));
  Matcher m(b.build(root));
  for (const char* s : {"abxx", "abxxx", "abcxx", "abddcddxxx"}) EXPECT_TRUE(m.accepts(s)) << s;
  for (const char* s : {"ab", "abx", "abxxxx", "abdxx", "bxx", "abcc"}) EXPECT_FALSE(m.accepts(s)) << s;
  EXPECT_TRUE(m.viable("abd"));
  EXPECT_FALSE(m.viable("abxxxx"));
  EXPECT_FALSE(m.viable("abdc"));
}

TEST(Grammar, RightRecursionKeepsStacksFlat) {
  GrammarBuilder b;
  const int32_t list = b.rule("list");  // list := "a" list | ε
  b.add(list, {b.byte('a'), GrammarBuilder::ref(list)});
  b.add(list, {});
  Matcher m(b.build(list));
  EXPECT_TRUE(m.accepts(std::string(10000, 'a')));
  EXPECT_LE(m.a.n_states(), 3u);  // one state for the whole loop
}

TEST(Grammar, BuildRejectsBrokenGrammars) {
  {
    GrammarBuilder b;
    const int32_t r = b.rule("r");  // r := r "a" | "b": left recursion
    b.add(r, {GrammarBuilder::ref(r), b.byte('a')});
    b.add(r, {b.byte('b')});
    EXPECT_THROW(b.build(r), Error);
  }
  {
    GrammarBuilder b;
    const int32_t r = b.rule("r"), n = b.rule("n");  // n nullable, r := n r "a" | "b": still left recursion
    b.add(n, {});
    b.add(r, {GrammarBuilder::ref(n), GrammarBuilder::ref(r), b.byte('a')});
    b.add(r, {b.byte('b')});
    EXPECT_THROW(b.build(r), Error);
  }
  {
    GrammarBuilder b;
    const int32_t r = b.rule("r");  // r := "a" r: no finite sentence
    b.add(r, {b.byte('a'), GrammarBuilder::ref(r)});
    EXPECT_THROW(b.build(r), Error);
  }
  {
    GrammarBuilder b;
    const int32_t r = b.rule("r"), empty = b.rule("empty");
    b.add(r, {GrammarBuilder::ref(empty)});
    EXPECT_THROW(b.build(r), Error);
  }
  GrammarBuilder b;
  EXPECT_THROW(b.bytes(ByteSet{}), Error);
  EXPECT_THROW(b.repeat(b.lit("a"), 3, 2), Error);
}

TEST(Grammar, Utf8CharAcceptsExactlyValidScalars) {
  GrammarBuilder b;
  ByteSet ascii;
  ascii.add_range('a', 'z');
  const int32_t root = b.rule("root");
  b.add(root, {b.star({b.utf8_char(ascii)})});
  Matcher m(b.build(root));
  EXPECT_TRUE(m.accepts("abc"));
  EXPECT_TRUE(m.accepts("héllowörld"));
  EXPECT_FALSE(m.accepts("hé llo"));  // ' ' is not in the ASCII set
  EXPECT_FALSE(m.accepts("A"));
  for (const char* s : {"é", "€", "中文", "𝄞", "\xF4\x8F\xBF\xBF"}) EXPECT_TRUE(m.accepts(s)) << s;
  for (const char* s : {"\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xFF", "\x80", "\xE4\xB8"})
    EXPECT_FALSE(m.accepts(s)) << s;
  EXPECT_TRUE(m.viable("\xE4\xB8"));  // a character in progress
}

TEST(Grammar, Utf8TextWithoutEqualsFind) {
  for (std::string forbidden : {std::string("</｜DSML｜parameter>"), std::string("abab"), std::string("｜DSML｜")}) {
    GrammarBuilder b;
    const int32_t root = b.rule("root");
    b.add(root, {b.utf8_text_without(forbidden)});
    Matcher m(b.build(root));
    std::mt19937 rng(7);
    const std::vector<std::string> atoms = {"a",         "b", "<", "/",        "｜",  "DSML",
                                            "parameter", ">", "x", "\xE4\xB8", "\xAD"};
    int positives = 0;
    for (int it = 0; it < 3000; ++it) {
      std::string s;
      const int n = static_cast<int>(rng() % 12);
      for (int k = 0; k < n; ++k) s += atoms[rng() % atoms.size()];
      if (rng() % 5 == 0) s.insert(rng() % (s.size() + 1), forbidden);
      const bool want = valid_utf8(s) && s.find(forbidden) == std::string::npos;
      positives += want;
      ASSERT_EQ(m.accepts(s), want) << "forbidden '" << forbidden << "', text '" << s << "'";
    }
    EXPECT_GT(positives, 300);
  }
}

TEST(VocabTrie, PreorderRangesListEveryTokenWithThePrefix) {
  std::vector<std::string> v = {"ab", "a", "abc", "b", "", "ab", "ba", "abd", "\xFF", "c"};
  VocabTrie t(v);
  EXPECT_EQ(t.n_vocab(), 10);
  // Every node: the tokens of its subtree are exactly those whose bytes start with the node's path.
  std::vector<std::string> path(t.max_depth() + 1);
  for (int32_t i = 0; i < t.n_nodes(); ++i) {
    path[t.depth(i)] = path[t.depth(i) - 1] + static_cast<char>(t.byte(i));
    const std::string& p = path[t.depth(i)];
    std::multiset<int32_t> got(t.tokens().begin() + t.first(i), t.tokens().begin() + t.first(t.end(i))), want;
    std::multiset<int32_t> own(t.tokens().begin() + t.first(i), t.tokens().begin() + t.first(i + 1)), want_own;
    for (int32_t id = 0; id < t.n_vocab(); ++id) {
      if (!v[id].empty() && v[id].rfind(p, 0) == 0) want.insert(id);
      if (v[id] == p) want_own.insert(id);
    }
    EXPECT_EQ(got, want) << p;
    EXPECT_EQ(own, want_own) << p;
    ByteSet below;
    for (const auto& s : v)
      if (s.size() > p.size() && s.rfind(p, 0) == 0)
        for (size_t k = p.size(); k < s.size(); ++k) below.add(static_cast<uint8_t>(s[k]));
    EXPECT_TRUE(below == t.sub_bytes(i)) << p;
  }
}

namespace {

// A small JSON-like grammar: value := object | array | string | number | "true" | "null", with whitespace.
Grammar json_like() {
  GrammarBuilder b;
  const int32_t value = b.rule("value");
  ByteSet sp;
  sp.add(' ');
  sp.add('\n');
  const auto ws = b.repeat({b.bytes(sp)}, 0, 3);
  ByteSet plain;
  plain.add_range(0x20, 0x7F);
  plain.remove('"');
  plain.remove('\\');
  const auto ch = b.choice({{b.utf8_char(plain)}, {b.byte('\\'), b.byte('n')}});
  const auto str = b.choice({GrammarBuilder::cat(b.byte('"'), b.star({ch}), b.byte('"'))});
  const auto num = b.choice(
      {{b.opt({b.byte('-')}), b.bytes(ByteSet::range('1', '9')), b.repeat({b.bytes(ByteSet::range('0', '9'))}, 0, 5)},
       {b.byte('0')}});
  const auto V = GrammarBuilder::ref(value);
  const Seq member = GrammarBuilder::cat(str, ws, b.byte(':'), ws, V, ws);
  const auto obj = b.choice({GrammarBuilder::cat(
      b.byte('{'), ws, b.opt(GrammarBuilder::cat(member, b.star(GrammarBuilder::cat(b.byte(','), ws, member)))),
      b.byte('}'))});
  const Seq item = GrammarBuilder::cat(V, ws);
  const auto arr = b.choice({GrammarBuilder::cat(
      b.byte('['), ws, b.opt(GrammarBuilder::cat(item, b.star(GrammarBuilder::cat(b.byte(','), ws, item)))),
      b.byte(']'))});
  for (Seq s : {Seq{obj}, Seq{arr}, Seq{str}, Seq{num}, b.lit("true"), b.lit("null")}) b.add(value, s);
  const int32_t root = b.rule("root");
  b.add(root, {ws, V, ws});
  return b.build(root);
}

std::shared_ptr<const VocabTrie> random_vocab(std::mt19937& rng, int n) {
  const std::vector<std::string> atoms = {"{",  "}",  "[", "]", "\"", ",", ":",  " ", "\n", "a",    "b",        "true",
                                          "nu", "ll", "0", "1", "9",  "-", "\\", "n", "é",  "\xE4", "\xB8\xAD", "中"};
  std::vector<std::string> v(n);
  for (int i = 0; i < n; ++i) {
    if (i % 97 == 0) continue;  // some ids have no bytes
    const int len = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < len; ++k) v[i] += atoms[rng() % atoms.size()];
  }
  for (int b = 0; b < 128; ++b) v.push_back(std::string(1, static_cast<char>(b)));  // every ASCII byte
  return std::make_shared<VocabTrie>(v);
}

}  // namespace

TEST(GrammarAutomaton, TrieMaskEqualsTokenByTokenCheck) {
  const Grammar g = json_like();
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    auto vocab = random_vocab(rng, 3000);
    GrammarAutomaton a(g, vocab);
    GrammarAutomaton reference(g, vocab);
    int32_t s = a.start();
    int32_t rs = reference.start();
    TokenMask mask;
    std::string text;
    for (int step = 0; step < 150; ++step) {
      a.mask(s, mask);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocab->n_vocab(); ++t) {
        const bool want = !vocab->token_bytes(t).empty() && reference.step_bytes(rs, vocab->token_bytes(t)) >= 0;
        ASSERT_EQ(mask.test(t), want) << "seed " << seed << " step " << step << " text '" << text << "' token '"
                                      << vocab->token_bytes(t) << "'";
        if (want) allowed.push_back(t);
      }
      if (allowed.empty()) {  // a complete sentence that nothing can extend: start another one
        ASSERT_TRUE(a.accepting(s) && !a.can_continue(s)) << text;
        s = a.start();
        rs = reference.start();
        text.clear();
        continue;
      }
      const int32_t t = allowed[rng() % allowed.size()];
      text += vocab->token_bytes(t);
      s = a.step_token(s, t);
      rs = reference.step_token(rs, t);
      ASSERT_GE(s, 0);
    }
    const auto st = a.stats();
    EXPECT_GT(st.subtrees_skipped, 0) << "the self-loop shortcut was never taken";
  }
}

TEST(GrammarAutomaton, MasksAreCachedPerState) {
  GrammarBuilder b;
  const int32_t root = b.rule("root");
  b.add(root, GrammarBuilder::cat(b.byte('"'), b.star({b.bytes(ByteSet::range('a', 'z'))}), b.byte('"')));
  auto vocab = std::make_shared<VocabTrie>(std::vector<std::string>{"\"", "ab", "c", "d\"", "A", "\"x"});
  GrammarAutomaton a(b.build(root), vocab);
  TokenMask m;
  int32_t s = a.step_token(a.start(), 0);
  for (int i = 0; i < 5; ++i) {
    a.mask(s, m);
    EXPECT_TRUE(m.test(0) && m.test(1) && m.test(2) && m.test(3));
    EXPECT_FALSE(m.test(4) || m.test(5));
    s = a.step_token(s, 1);
  }
  EXPECT_EQ(a.stats().masks_computed, 1);
  EXPECT_EQ(a.stats().mask_cache_hits, 4);
  s = a.step_token(s, 3);
  EXPECT_TRUE(a.accepting(s));
  EXPECT_FALSE(a.can_continue(s));
}

TEST(GrammarAutomaton, DroppingTheCachesKeepsTheCurrentState) {
  const Grammar g = json_like();
  std::mt19937 rng(5);
  auto vocab = random_vocab(rng, 500);
  GrammarAutomaton::Limits tiny;
  tiny.max_states = 4;
  tiny.max_masks = 2;
  GrammarAutomaton small(g, vocab, tiny), big(g, vocab);
  int32_t s1 = small.start(), s2 = big.start();
  TokenMask m1, m2;
  for (int step = 0; step < 80; ++step) {
    small.mask(s1, m1);
    big.mask(s2, m2);
    ASSERT_EQ(m1.bits, m2.bits) << step;
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < vocab->n_vocab(); ++t)
      if (m2.test(t)) allowed.push_back(t);
    if (allowed.empty()) {
      s1 = small.start();
      s2 = big.start();
      continue;
    }
    const int32_t t = allowed[rng() % allowed.size()];
    s1 = small.step_token(s1, t);
    s2 = big.step_token(s2, t);
    ASSERT_EQ(small.accepting(s1), big.accepting(s2));
  }
  EXPECT_GT(small.stats().resets, 0);
}

namespace {
// Reference: breadth-first search over bytes for the length of the shortest completion (-1: not within the cap).
int64_t bfs_completion_length(GrammarAutomaton& a, int32_t s, size_t cap = 20000) {
  std::vector<std::pair<int32_t, int64_t>> q{{s, 0}};
  std::set<int32_t> seen{s};
  for (size_t i = 0; i < q.size() && seen.size() < cap; ++i) {
    const auto [cur, d] = q[i];
    if (a.accepting(cur)) return d;
    for (int b = 0; b < 256; ++b) {
      const int32_t n = a.step(cur, static_cast<uint8_t>(b));
      if (n >= 0 && seen.insert(n).second) q.emplace_back(n, d + 1);
    }
  }
  return -1;
}
}  // namespace

TEST(GrammarAutomaton, ShortestCompletionIsMinimalAndCompletes) {
  const Grammar g = json_like();
  std::mt19937 rng(9);
  auto vocab = random_vocab(rng, 800);
  GrammarAutomaton a(g, vocab);
  int32_t s = a.start();
  TokenMask mask;
  int checked = 0;
  for (int step = 0; step < 120; ++step) {
    const int64_t n = a.min_completion_length(s);
    const auto c = a.shortest_completion(s);
    ASSERT_TRUE(c.has_value());
    ASSERT_EQ(static_cast<int64_t>(c->size()), n);
    const int32_t end = a.step_bytes(s, *c);
    ASSERT_GE(end, 0) << *c;
    EXPECT_TRUE(a.accepting(end)) << *c;
    if (const int64_t ref = bfs_completion_length(a, s); ref >= 0) {
      EXPECT_EQ(n, ref) << *c;
      ++checked;
    }
    a.mask(s, mask);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < vocab->n_vocab(); ++t)
      if (mask.test(t)) allowed.push_back(t);
    if (allowed.empty()) {
      s = a.start();
      continue;
    }
    s = a.step_token(s, allowed[rng() % allowed.size()]);
  }
  EXPECT_GT(checked, 60);
  EXPECT_EQ(a.min_completion_length(GrammarAutomaton::kDead), -1);
}
