// Context-free grammar over bytes: the intermediate form of constrained decoding (structured output, tool calls).
//
// A grammar is a list of rules; a rule is a list of alternatives; an alternative is a sequence of symbols, each
// either a byte set (matches one input byte in the set) or a reference to a rule. An empty alternative matches the
// empty string. The language is that of the root rule. Grammars are written with GrammarBuilder (which also has the
// usual combinators: literals, optional, repetition with bounds, valid UTF-8 characters, "any UTF-8 text that does
// not contain S"), then checked and compiled by GrammarBuilder::build(), which throws dsv4::Error when
//   - a referenced rule has no alternative, a byte set is empty, or a rule derives no finite string (unproductive);
//   - a rule can reach itself without consuming a byte (left recursion: the stack matcher could not run it).
// Every prefix the matcher accepts can therefore be completed to a sentence (GrammarAutomaton relies on it).
//
// Compiled layout (read by GrammarAutomaton): the alternatives are runs of Elem in one flat array, each ended by a
// kEnd element; a parse position is an index into that array. Rule 0.. are in creation order; root() is the start.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

// A set of byte values (256 bits).
struct ByteSet {
  std::array<uint64_t, 4> w{};
  bool has(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { w[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  void remove(uint8_t b) { w[b >> 6] &= ~(uint64_t{1} << (b & 63)); }
  bool empty() const { return !(w[0] | w[1] | w[2] | w[3]); }
  bool subset_of(const ByteSet& o) const {
    return !((w[0] & ~o.w[0]) | (w[1] & ~o.w[1]) | (w[2] & ~o.w[2]) | (w[3] & ~o.w[3]));
  }
  ByteSet& operator|=(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) w[i] |= o.w[i];
    return *this;
  }
  bool operator==(const ByteSet& o) const { return w == o.w; }
  static ByteSet of(uint8_t b) {
    ByteSet s;
    s.add(b);
    return s;
  }
  static ByteSet range(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.add_range(lo, hi);
    return s;
  }
};

class Grammar {
 public:
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  struct Elem {
    Kind kind;
    int32_t arg;  // kBytes: index into sets(); kRule: rule id; kEnd: the rule the alternative belongs to
  };

  const std::vector<ByteSet>& sets() const { return sets_; }
  const std::vector<Elem>& elems() const { return elems_; }
  // Start positions (indices into elems()) of the alternatives of rule r.
  const std::vector<int32_t>& alternatives(int32_t r) const { return alts_[r]; }
  const std::string& rule_name(int32_t r) const { return names_[r]; }
  int32_t n_rules() const { return static_cast<int32_t>(alts_.size()); }
  int32_t root() const { return root_; }
  // The grammar in a readable EBNF-like notation (tests, debugging).
  std::string to_string() const;

 private:
  friend class GrammarBuilder;
  std::vector<ByteSet> sets_;
  std::vector<Elem> elems_;
  std::vector<std::vector<int32_t>> alts_;
  std::vector<std::string> names_;
  int32_t root_ = 0;
};

class GrammarBuilder {
 public:
  struct Sym {
    bool rule;   // false: byte set
    int32_t id;  // rule id or byte-set id
  };
  using Seq = std::vector<Sym>;

  // A new rule without alternatives (add them with add(); a rule may reference itself or later rules).
  int32_t rule(std::string_view name);
  // Adds an alternative to rule r.
  void add(int32_t r, Seq alternative);
  static Sym ref(int32_t r) { return Sym{true, r}; }

  Sym bytes(const ByteSet& s);  // one byte in s (sets are de-duplicated)
  Sym byte(uint8_t b) { return bytes(ByteSet::of(b)); }
  Seq lit(std::string_view s);  // exactly these bytes

  // Combinators; each makes a new rule and returns a reference to it.
  Sym choice(std::vector<Seq> alternatives, std::string_view name = "choice");
  Sym opt(Seq body);                               // body | ε
  Sym star(Seq body);                              // body*  (right recursion, constant stack)
  Sym plus(Seq body);                              // body+
  Sym repeat(Seq body, int64_t min, int64_t max);  // body{min,max}; max < 0: unbounded
  // One valid UTF-8 encoded scalar value (no overlongs, no surrogates); `ascii` is the set of allowed bytes < 0x80.
  Sym utf8_char(const ByteSet& ascii);
  // Any valid UTF-8 text (possibly empty) that does not contain `forbidden` (non-empty, valid UTF-8) anywhere.
  Sym utf8_text_without(std::string_view forbidden);

  // Concatenation.
  template <typename... S>
  static Seq cat(S&&... parts) {
    Seq out;
    (append(out, std::forward<S>(parts)), ...);
    return out;
  }

  int32_t n_rules() const { return static_cast<int32_t>(rules_.size()); }
  // Checks and compiles (see the top of this file); throws dsv4::Error naming the rule at fault.
  Grammar build(int32_t root) const;

 private:
  static void append(Seq& out, const Seq& s) { out.insert(out.end(), s.begin(), s.end()); }
  static void append(Seq& out, Sym s) { out.push_back(s); }

  struct RuleDef {
    std::string name;
    std::vector<Seq> alts;
  };
  std::vector<RuleDef> rules_;
  std::vector<ByteSet> sets_;
  int32_t utf8_multi_ = -1;  // shared rule: the multi-byte UTF-8 characters
};

}  // namespace dsv4
