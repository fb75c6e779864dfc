#include "tokenizer/bpe_model.h"

#include <queue>

#include "core/error.h"

namespace dsv4 {

BpeModel::BpeModel(BpeModel&& o) noexcept
    : bytes_to_id_(std::move(o.bytes_to_id_)), merges_(std::move(o.merges_)), cache_(std::move(o.cache_)) {
  std::copy(std::begin(o.byte_id_), std::end(o.byte_id_), byte_id_);
}

BpeModel& BpeModel::operator=(BpeModel&& o) noexcept {
  bytes_to_id_ = std::move(o.bytes_to_id_);
  merges_ = std::move(o.merges_);
  cache_ = std::move(o.cache_);
  std::copy(std::begin(o.byte_id_), std::end(o.byte_id_), byte_id_);
  return *this;
}

void BpeModel::add_token(std::string bytes, int32_t id) {
  if (!bytes_to_id_.emplace(std::move(bytes), id).second) fail("tokenizer vocab: duplicate token for id {}", id);
}

void BpeModel::reserve(size_t n_tokens, size_t n_merges) {
  bytes_to_id_.reserve(n_tokens);
  merges_.reserve(n_merges);
}

std::optional<int32_t> BpeModel::token_id(std::string_view bytes) const {
  const auto it = bytes_to_id_.find(bytes);
  if (it == bytes_to_id_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::add_merge(std::string_view left, std::string_view right) {
  const auto a = bytes_to_id_.find(left);
  const auto b = bytes_to_id_.find(right);
  const size_t rank = merges_.size();
  if (a == bytes_to_id_.end() || b == bytes_to_id_.end()) fail("tokenizer merges[{}]: token not in vocab", rank);
  std::string joined(left);
  joined += right;
  const auto c = bytes_to_id_.find(joined);
  if (c == bytes_to_id_.end()) fail("tokenizer merges[{}]: merged token not in vocab", rank);
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a->second)) << 32) | static_cast<uint32_t>(b->second);
  merges_.emplace(key, MergeValue{static_cast<int32_t>(rank), c->second});  // first (lowest) rank wins, like HF
}

void BpeModel::finalize() {
  for (int b = 0; b < 256; ++b) {
    const auto it = bytes_to_id_.find(std::string(1, static_cast<char>(b)));
    if (it == bytes_to_id_.end()) fail("tokenizer vocab: byte 0x{:02X} has no token", b);
    byte_id_[b] = it->second;
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  const int n = static_cast<int>(word.size());
  std::vector<Sym> syms(n);
  for (int i = 0; i < n; ++i)
    syms[i] = Sym{byte_id_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1, true};
  struct Cand {
    int32_t rank, pos, new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto lookup = [&](int32_t a, int32_t b) -> const MergeValue* {
    const auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::vector<Cand> heap_storage;
  heap_storage.reserve(n);
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> queue(std::greater<Cand>(), std::move(heap_storage));
  for (int i = 0; i + 1 < n; ++i)
    if (const MergeValue* m = lookup(syms[i].id, syms[i + 1].id)) queue.push(Cand{m->rank, i, m->new_id});
  while (!queue.empty()) {
    const Cand top = queue.top();
    queue.pop();
    Sym& cur = syms[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    const int32_t next_pos = cur.next;
    const MergeValue* m = lookup(cur.id, syms[next_pos].id);
    if (!m || m->new_id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.next = syms[next_pos].next;
    syms[next_pos].alive = false;
    if (cur.next >= 0) syms[cur.next].prev = top.pos;
    if (cur.prev >= 0)
      if (const MergeValue* pm = lookup(syms[cur.prev].id, cur.id)) queue.push(Cand{pm->rank, cur.prev, pm->new_id});
    if (cur.next >= 0)
      if (const MergeValue* nm = lookup(cur.id, syms[cur.next].id)) queue.push(Cand{nm->rank, top.pos, nm->new_id});
  }
  for (int i = 0; i >= 0; i = syms[i].next) ids.push_back(syms[i].id);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace dsv4
