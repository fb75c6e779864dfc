// A Grammar run as a lazily built deterministic byte automaton, with token masks over a vocabulary (VocabTrie).
//
// States: a state is a set of parse stacks. A stack lists grammar positions (Grammar::elems() indices) still to be
// matched, innermost last, always with a byte set on top after expansion (rule references are expanded into their
// alternatives; a reference in tail position is replaced, not pushed, so right recursion keeps the stack flat). The
// empty stack means "the bytes so far form a complete sentence". Sets are interned, so the states and their
// transitions form the subset construction of the grammar's pushdown automaton, built on demand: step(s, b) is
// computed once, then read from a 256-entry table of s. kDead (-1) is the empty set (the bytes cannot continue).
//
// Masks: mask(s) = the tokens whose whole byte string can follow from state s (not necessarily completing the
// sentence; the end-of-sequence token is the caller's business: allow it when accepting(s)). Computed by one
// preorder walk of the trie that follows step() byte by byte, skips the subtree of a node whose state is dead, and
// allows a whole subtree at once when the node's byte keeps the state unchanged and so does every byte below it
// (the state's self-loop set covers VocabTrie::sub_bytes). Computed masks are cached per state, so a state that
// recurs (a JSON string body, free text) costs one 16 KiB copy. Because every rule of a built Grammar is productive,
// any state other than kDead can be completed: a token the mask allows never leads to a dead end.
//
// Completions: min_completion_length(s) / shortest_completion(s) are what a caller needs to end a sentence within a
// byte budget (the server closes a structured answer before max_tokens runs out). They come from the grammar's
// minimal yields (a fixpoint over the rules, computed once): a stack needs the sum of the minimal yields of what is
// left in each of its frames, a state the least over its stacks; no search over states.
//
// Limits: past `max_states` states (about 1 KiB each) or `max_masks` cached masks (n_vocab / 8 bytes each: 16 KiB for
// V4; so at most about 20 MiB per automaton with the defaults) the caches are dropped at the next step_token() and
// rebuilt from the current state; state ids from before are then invalid (step_token returns the new id of its result;
// start() must be asked again).
//
// Thread safety: every public member locks an internal mutex.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sampling/grammar.h"
#include "sampling/vocab_trie.h"

namespace dsv4 {

class GrammarAutomaton {
 public:
  static constexpr int32_t kDead = -1;
  struct Limits {
    size_t max_states = 1 << 14;
    size_t max_masks = 256;
    size_t max_stacks = 4096;  // stacks in one state; more: dsv4::Error (grammar too ambiguous)
  };
  struct Stats {
    int64_t masks_computed = 0, mask_cache_hits = 0, nodes_visited = 0, subtrees_skipped = 0, resets = 0;
  };

  GrammarAutomaton(Grammar grammar, std::shared_ptr<const VocabTrie> vocab);
  GrammarAutomaton(Grammar grammar, std::shared_ptr<const VocabTrie> vocab, Limits limits);

  int32_t start();
  int32_t step(int32_t s, uint8_t b);
  int32_t step_bytes(int32_t s, std::string_view bytes);  // kDead as soon as a byte fails
  // Steps through the bytes of a vocabulary token; may first drop the caches (see Limits): use the returned id.
  int32_t step_token(int32_t s, int32_t token);
  bool accepting(int32_t s);
  // True if some byte can follow (false: only the end of the sentence is left).
  bool can_continue(int32_t s);
  // Writes the token mask of state s into out (resized to n_vocab).
  void mask(int32_t s, TokenMask& out);
  // Length of the shortest byte string that leads from s to a complete sentence (0 when s is accepting; -1 for kDead).
  // O(stack depth): the grammar's minimal yield lengths are precomputed per position.
  int64_t min_completion_length(int32_t s);
  // That string (each byte set contributes its lowest printable byte, else its lowest byte).
  std::optional<std::string> shortest_completion(int32_t s);
  // Clears from `mask` (a mask of s) every token after which the shortest completion would exceed max_len bytes;
  // returns how many were cleared.
  size_t restrict_to_completion(int32_t s, int64_t max_len, TokenMask& mask);

  const Grammar& grammar() const { return g_; }
  const VocabTrie& vocab() const { return *vocab_; }
  size_t n_states();
  Stats stats();

 private:
  int32_t intern(std::vector<std::vector<int32_t>>& stacks);
  int32_t trans(int32_t s, uint8_t b);
  int32_t compute_step(int32_t s, uint8_t b);
  void expand(std::vector<int32_t>& stack, std::vector<std::vector<int32_t>>& out) const;
  void advance(std::vector<int32_t> stack, std::vector<std::vector<int32_t>>& out) const;
  const ByteSet& self_loop(int32_t s);
  void compute_mask(int32_t s, TokenMask& out);
  void reset_keeping(int32_t& s);
  void min_yields();
  int64_t min_len_locked(int32_t s);
  void emit_min(int32_t pos, std::string& out) const;

  struct State {
    std::vector<int32_t> key;  // stacks flattened, each followed by -1; sorted, unique
    bool accepting = false;
    bool loop_known = false;
    ByteSet loop;  // bytes b with step(s, b) == s
    ByteSet tops;  // union of the top byte sets: the bytes that can follow
  };

  Grammar g_;
  std::shared_ptr<const VocabTrie> vocab_;
  Limits lim_;
  std::mutex mu_;
  std::vector<State> states_;
  std::vector<int32_t> trans_;  // [n_states * 256], -2 = not computed yet
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<int32_t, TokenMask> masks_;
  std::vector<int64_t> suffix_min_;  // per position: minimal yield of elems[pos .. end of its alternative)
  std::vector<int32_t> min_alt_;     // per rule: an alternative of minimal yield
  std::vector<int64_t> state_min_;   // per state: min_completion_length, -2 = not computed
  int32_t start_ = -2;
  std::vector<int32_t> walk_;  // mask walk: state per depth
  Stats stats_;
};

}  // namespace dsv4
