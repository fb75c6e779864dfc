#include "sampling/grammar_automaton.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace dsv4 {

namespace {
constexpr int32_t kUnknown = -2;
using Kind = Grammar::Kind;
}  // namespace

GrammarAutomaton::GrammarAutomaton(Grammar grammar, std::shared_ptr<const VocabTrie> vocab)
    : GrammarAutomaton(std::move(grammar), std::move(vocab), Limits{}) {}

GrammarAutomaton::GrammarAutomaton(Grammar grammar, std::shared_ptr<const VocabTrie> vocab, Limits limits)
    : g_(std::move(grammar)), vocab_(std::move(vocab)), lim_(limits) {
  if (!vocab_) fail("grammar automaton: no vocabulary");
  min_yields();
}

// Expands rule references on top of `stack` until a byte set is on top (or the stack is empty); appends the
// resulting stacks to out.
void GrammarAutomaton::expand(std::vector<int32_t>& stack, std::vector<std::vector<int32_t>>& out) const {
  if (stack.empty()) {
    out.push_back(stack);
    return;
  }
  const int32_t pos = stack.back();
  const Grammar::Elem& e = g_.elems()[pos];
  if (e.kind == Kind::kBytes) {
    out.push_back(stack);
    return;
  }
  // A rule reference: continue after it (tail position: nothing to return to), then each alternative.
  std::vector<int32_t> base = stack;
  base.pop_back();
  if (g_.elems()[pos + 1].kind != Kind::kEnd) base.push_back(pos + 1);
  for (int32_t alt : g_.alternatives(e.arg)) {
    std::vector<int32_t> s = base;
    if (g_.elems()[alt].kind != Kind::kEnd) s.push_back(alt);
    expand(s, out);
    if (out.size() > lim_.max_stacks)
      fail("grammar: more than {} parse stacks at once (the grammar is too ambiguous)", lim_.max_stacks);
  }
}

// The byte set on top of `stack` matched: move past it and expand.
void GrammarAutomaton::advance(std::vector<int32_t> stack, std::vector<std::vector<int32_t>>& out) const {
  const int32_t pos = stack.back();
  stack.pop_back();
  if (g_.elems()[pos + 1].kind != Kind::kEnd) stack.push_back(pos + 1);
  expand(stack, out);
}

int32_t GrammarAutomaton::intern(std::vector<std::vector<int32_t>>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  State st;
  for (const auto& s : stacks) {
    st.key.insert(st.key.end(), s.begin(), s.end());
    st.key.push_back(-1);
    if (s.empty())
      st.accepting = true;
    else
      st.tops |= g_.sets()[g_.elems()[s.back()].arg];
  }
  std::string k(reinterpret_cast<const char*>(st.key.data()), st.key.size() * sizeof(int32_t));
  auto [it, fresh] = ids_.emplace(std::move(k), static_cast<int32_t>(states_.size()));
  if (fresh) {
    states_.push_back(std::move(st));
    trans_.resize(states_.size() * 256, kUnknown);
    state_min_.push_back(-2);
  }
  return it->second;
}

int32_t GrammarAutomaton::compute_step(int32_t s, uint8_t b) {
  if (!states_[s].tops.has(b)) return kDead;
  std::vector<std::vector<int32_t>> next;
  const std::vector<int32_t> key = states_[s].key;  // copy: intern() may grow states_
  std::vector<int32_t> stack;
  for (int32_t x : key) {
    if (x >= 0) {
      stack.push_back(x);
      continue;
    }
    if (!stack.empty() && g_.sets()[g_.elems()[stack.back()].arg].has(b)) advance(stack, next);
    stack.clear();
  }
  if (next.empty()) return kDead;
  return intern(next);
}

int32_t GrammarAutomaton::trans(int32_t s, uint8_t b) {
  int32_t& t = trans_[static_cast<size_t>(s) * 256 + b];
  if (t != kUnknown) return t;
  const int32_t r = compute_step(s, b);
  trans_[static_cast<size_t>(s) * 256 + b] = r;  // (t may dangle: trans_ can grow in compute_step)
  return r;
}

const ByteSet& GrammarAutomaton::self_loop(int32_t s) {
  if (!states_[s].loop_known) {
    ByteSet loop;
    const ByteSet tops = states_[s].tops;
    for (int b = 0; b < 256; ++b)
      if (tops.has(static_cast<uint8_t>(b)) && trans(s, static_cast<uint8_t>(b)) == s)
        loop.add(static_cast<uint8_t>(b));
    states_[s].loop = loop;
    states_[s].loop_known = true;
  }
  return states_[s].loop;
}

void GrammarAutomaton::compute_mask(int32_t s, TokenMask& out) {
  const VocabTrie& v = *vocab_;
  out.reset(v.n_vocab());
  walk_.assign(static_cast<size_t>(v.max_depth()) + 1, kDead);
  walk_[0] = s;
  const auto& toks = v.tokens();
  const int32_t n = v.n_nodes();
  int64_t visited = 0, skipped = 0;
  for (int32_t i = 0; i < n;) {
    ++visited;
    const int32_t p = walk_[v.depth(i) - 1];
    const int32_t t = trans(p, v.byte(i));
    if (t == kDead) {
      i = v.end(i);
      continue;
    }
    if (t == p && v.sub_bytes(i).subset_of(self_loop(p))) {
      for (int32_t k = v.first(i), e = v.first(v.end(i)); k < e; ++k) out.set(toks[k]);
      ++skipped;
      i = v.end(i);
      continue;
    }
    walk_[v.depth(i)] = t;
    for (int32_t k = v.first(i), e = v.first(i + 1); k < e; ++k) out.set(toks[k]);
    ++i;
  }
  stats_.nodes_visited += visited;
  stats_.subtrees_skipped += skipped;
  ++stats_.masks_computed;
}

void GrammarAutomaton::reset_keeping(int32_t& s) {
  std::vector<std::vector<int32_t>> stacks;
  std::vector<int32_t> cur;
  const std::vector<int32_t> key = s >= 0 ? states_[s].key : std::vector<int32_t>{};
  for (int32_t x : key) {
    if (x >= 0) {
      cur.push_back(x);
    } else {
      stacks.push_back(cur);
      cur.clear();
    }
  }
  states_.clear();
  trans_.clear();
  state_min_.clear();
  ids_.clear();
  masks_.clear();
  start_ = kUnknown;
  ++stats_.resets;
  if (s >= 0) s = intern(stacks);
}

int32_t GrammarAutomaton::start() {
  std::lock_guard lk(mu_);
  if (start_ == kUnknown) {
    std::vector<int32_t> stack;
    std::vector<std::vector<int32_t>> out;
    // The root rule as if referenced from a one-element sequence: push each alternative.
    for (int32_t alt : g_.alternatives(g_.root())) {
      stack.clear();
      if (g_.elems()[alt].kind != Kind::kEnd) stack.push_back(alt);
      expand(stack, out);
    }
    start_ = intern(out);
  }
  return start_;
}

int32_t GrammarAutomaton::step(int32_t s, uint8_t b) {
  std::lock_guard lk(mu_);
  if (s < 0) return kDead;
  return trans(s, b);
}

int32_t GrammarAutomaton::step_bytes(int32_t s, std::string_view bytes) {
  std::lock_guard lk(mu_);
  for (char c : bytes) {
    if (s < 0) return kDead;
    s = trans(s, static_cast<uint8_t>(c));
  }
  return s;
}

int32_t GrammarAutomaton::step_token(int32_t s, int32_t token) {
  std::lock_guard lk(mu_);
  if (s < 0) return kDead;
  if (token < 0 || token >= vocab_->n_vocab()) fail("grammar: token {} outside the vocabulary", token);
  if (states_.size() > lim_.max_states || masks_.size() > lim_.max_masks) reset_keeping(s);
  for (char c : vocab_->token_bytes(token)) {
    s = trans(s, static_cast<uint8_t>(c));
    if (s < 0) return kDead;
  }
  return vocab_->token_bytes(token).empty() ? kDead : s;
}

bool GrammarAutomaton::accepting(int32_t s) {
  std::lock_guard lk(mu_);
  return s >= 0 && states_[s].accepting;
}

bool GrammarAutomaton::can_continue(int32_t s) {
  std::lock_guard lk(mu_);
  return s >= 0 && !states_[s].tops.empty();
}

void GrammarAutomaton::mask(int32_t s, TokenMask& out) {
  std::lock_guard lk(mu_);
  if (s < 0) {
    out.reset(vocab_->n_vocab());
    return;
  }
  auto it = masks_.find(s);
  if (it != masks_.end()) {
    ++stats_.mask_cache_hits;
    out = it->second;
    return;
  }
  compute_mask(s, out);
  masks_.emplace(s, out);
}

void GrammarAutomaton::min_yields() {
  // rule_min[r] = min over alternatives of the sum of their symbols' minimal yields (a byte set yields 1 byte);
  // a fixpoint from "infinite", finite everywhere because every rule of a built grammar is productive.
  constexpr int64_t kInf = int64_t{1} << 60;
  const auto& el = g_.elems();
  std::vector<int64_t> rule_min(g_.n_rules(), kInf);
  min_alt_.assign(g_.n_rules(), 0);
  auto seq_min = [&](int32_t p) {
    int64_t n = 0;
    for (; el[p].kind != Kind::kEnd; ++p) n = std::min(kInf, n + (el[p].kind == Kind::kBytes ? 1 : rule_min[el[p].arg]));
    return n;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < g_.n_rules(); ++r) {
      const auto& alts = g_.alternatives(r);
      for (size_t a = 0; a < alts.size(); ++a) {
        const int64_t n = seq_min(alts[a]);
        if (n < rule_min[r]) {
          rule_min[r] = n;
          min_alt_[r] = static_cast<int32_t>(a);
          changed = true;
        }
      }
    }
  }
  suffix_min_.assign(el.size() + 1, 0);
  for (size_t p = el.size(); p-- > 0;) {
    if (el[p].kind == Kind::kEnd) {
      suffix_min_[p] = 0;
      continue;
    }
    suffix_min_[p] = std::min(kInf, suffix_min_[p + 1] + (el[p].kind == Kind::kBytes ? 1 : rule_min[el[p].arg]));
  }
}

void GrammarAutomaton::emit_min(int32_t p, std::string& out) const {
  const auto& el = g_.elems();
  for (; el[p].kind != Kind::kEnd; ++p) {
    if (el[p].kind == Kind::kRule) {
      emit_min(g_.alternatives(el[p].arg)[min_alt_[el[p].arg]], out);
      continue;
    }
    const ByteSet& set = g_.sets()[el[p].arg];
    int pick = -1;
    for (int b = 0x21; b < 0x7F && pick < 0; ++b)
      if (set.has(static_cast<uint8_t>(b))) pick = b;
    for (int b = 0; b < 256 && pick < 0; ++b)
      if (set.has(static_cast<uint8_t>(b))) pick = b;
    out += static_cast<char>(pick);
  }
}

int64_t GrammarAutomaton::min_len_locked(int32_t s) {
  if (s < 0) return -1;
  if (state_min_[s] != -2) return state_min_[s];
  int64_t best = -1, cur = 0;
  for (int32_t x : states_[s].key) {
    if (x >= 0) {
      cur += suffix_min_[x];
      continue;
    }
    if (best < 0 || cur < best) best = cur;
    cur = 0;
  }
  state_min_[s] = best;
  return best;
}

int64_t GrammarAutomaton::min_completion_length(int32_t s) {
  std::lock_guard lk(mu_);
  return min_len_locked(s);
}

size_t GrammarAutomaton::restrict_to_completion(int32_t s, int64_t max_len, TokenMask& mask) {
  std::lock_guard lk(mu_);
  size_t cleared = 0;
  for (size_t w = 0; w < mask.bits.size(); ++w)
    for (uint64_t bits = mask.bits[w]; bits; bits &= bits - 1) {
      const int32_t t = static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
      if (t >= vocab_->n_vocab()) continue;
      int32_t st = s;
      for (char c : vocab_->token_bytes(t)) {
        st = trans(st, static_cast<uint8_t>(c));
        if (st < 0) break;
      }
      if (st < 0 || min_len_locked(st) > max_len) {
        mask.clear(t);
        ++cleared;
      }
    }
  return cleared;
}

std::optional<std::string> GrammarAutomaton::shortest_completion(int32_t s) {
  std::lock_guard lk(mu_);
  if (s < 0) return std::nullopt;
  // The stack of least total; its frames from the innermost (last) to the outermost.
  std::vector<int32_t> best, stack;
  int64_t best_len = -1, cur = 0;
  for (int32_t x : states_[s].key) {
    if (x >= 0) {
      stack.push_back(x);
      cur += suffix_min_[x];
      continue;
    }
    if (best_len < 0 || cur < best_len) {
      best_len = cur;
      best = stack;
    }
    stack.clear();
    cur = 0;
  }
  std::string out;
  for (size_t i = best.size(); i-- > 0;) emit_min(best[i], out);
  return out;
}

size_t GrammarAutomaton::n_states() {
  std::lock_guard lk(mu_);
  return states_.size();
}

GrammarAutomaton::Stats GrammarAutomaton::stats() {
  std::lock_guard lk(mu_);
  return stats_;
}

}  // namespace dsv4
