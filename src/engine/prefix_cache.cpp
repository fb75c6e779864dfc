// Prefix cache bookkeeping (prefix_cache.h).
#include "engine/prefix_cache.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

PrefixCache::PrefixCache(const Options& o) : root_(block_hash_root(o.salt)) {
  if (o.n_pages < 0 || o.n_snapshots < 0) fail("prefix cache: negative page or snapshot count");
  ref_.assign(size_t(o.n_pages), 0);
  page_block_.resize(size_t(o.n_pages));
  idle_it_.resize(size_t(o.n_pages));
  in_idle_.assign(size_t(o.n_pages), 0);
  for (int64_t p = 0; p < o.n_pages; ++p) free_pages_.push_back(int32_t(p));
  snap_block_.resize(size_t(o.n_snapshots));
  snap_it_.resize(size_t(o.n_snapshots));
  for (int64_t s = o.n_snapshots - 1; s >= 0; --s) free_snaps_.push_back(s);  // back: next to hand out (0 first)
}

// ---- pages ----------------------------------------------------------------------------------------------------------

std::optional<int32_t> PrefixCache::alloc_page() {
  int32_t p = -1;
  if (!free_pages_.empty()) {
    p = free_pages_.front();
    free_pages_.pop_front();
  } else if (!idle_pages_.empty()) {
    p = idle_pages_.front();
    idle_pages_.pop_front();
    in_idle_[size_t(p)] = 0;
    if (page_block_[size_t(p)]) {
      if (tier_) offer(*page_block_[size_t(p)], false);
      drop_block(*page_block_[size_t(p)]);
    }
    ++evicted_pages_;
  } else {
    return std::nullopt;
  }
  ref_[size_t(p)] = 1;
  ++n_referenced_;
  return p;
}

void PrefixCache::release_page(int32_t p) {
  if (p < 0 || p >= int32_t(ref_.size()) || ref_[size_t(p)] <= 0) fail("internal: release of page {} not held", p);
  if (--ref_[size_t(p)] > 0) return;
  --n_referenced_;
  if (page_block_[size_t(p)]) {
    idle_pages_.push_back(p);
    idle_it_[size_t(p)] = std::prev(idle_pages_.end());
    in_idle_[size_t(p)] = 1;
  } else {
    free_pages_.push_back(p);
  }
}

void PrefixCache::release_pages(std::span<const int32_t> pages) {
  for (size_t i = pages.size(); i-- > 0;) release_page(pages[i]);
}

void PrefixCache::ref_page(int32_t p) {
  if (ref_[size_t(p)]++ > 0) return;
  ++n_referenced_;
  if (in_idle_[size_t(p)]) {
    idle_pages_.erase(idle_it_[size_t(p)]);
    in_idle_[size_t(p)] = 0;
  }
}

// ---- blocks ---------------------------------------------------------------------------------------------------------

bool PrefixCache::insert_block(const BlockHash& hash, const BlockHash& parent, std::span<const int32_t> tokens,
                               int32_t page) {
  if (page < 0 || page >= int32_t(ref_.size()) || ref_[size_t(page)] <= 0)
    fail("internal: insert_block with page {} not held", page);
  if (int64_t(tokens.size()) != kBlockTokens) fail("internal: a cached block holds {} tokens", kBlockTokens);
  if (blocks_.count(hash) || page_block_[size_t(page)]) return false;
  Block b;
  b.parent = parent;
  b.tokens.assign(tokens.begin(), tokens.end());
  b.page = page;
  blocks_.emplace(hash, std::move(b));
  page_block_[size_t(page)] = hash;
  return true;
}

bool PrefixCache::has_snapshot(const BlockHash& hash) const {
  auto it = blocks_.find(hash);
  return it != blocks_.end() && it->second.snapshot >= 0;
}

int64_t PrefixCache::snapshot_of(const BlockHash& hash) const {
  auto it = blocks_.find(hash);
  return it == blocks_.end() ? -1 : it->second.snapshot;
}

void PrefixCache::drop_block(const BlockHash& h) {
  auto it = blocks_.find(h);
  if (it == blocks_.end()) return;
  if (it->second.snapshot >= 0) {
    const int64_t s = it->second.snapshot;
    idle_snaps_.erase(snap_it_[size_t(s)]);
    snap_block_[size_t(s)].reset();
    free_snaps_.push_back(s);
  }
  page_block_[size_t(it->second.page)].reset();
  blocks_.erase(it);
}

PrefixCache::Match PrefixCache::match(std::span<const int32_t> tokens, int64_t max_tokens) const {
  Match m;
  BlockHash parent = root_;
  std::vector<int32_t> pages;
  std::vector<BlockHash> hashes;
  for (int64_t k = 0; (k + 1) * kBlockTokens <= std::min<int64_t>(max_tokens, int64_t(tokens.size())); ++k) {
    const auto blk = tokens.subspan(size_t(k * kBlockTokens), size_t(kBlockTokens));
    const BlockHash h = block_hash(parent, blk);
    auto it = blocks_.find(h);
    if (it == blocks_.end() || it->second.parent != parent || !std::equal(blk.begin(), blk.end(), it->second.tokens.begin()))
      break;
    pages.push_back(it->second.page);
    hashes.push_back(h);
    if (it->second.snapshot >= 0) {
      m.n_blocks = k + 1;
      m.snapshot = it->second.snapshot;
    }
    parent = h;
  }
  m.pages.assign(pages.begin(), pages.begin() + m.n_blocks);
  m.hashes.assign(hashes.begin(), hashes.begin() + m.n_blocks);
  return m;
}

int64_t PrefixCache::idle_pages_in(const Match& m) const {
  int64_t n = 0;
  for (int32_t p : m.pages) n += in_idle_[size_t(p)] ? 1 : 0;
  return n;
}

void PrefixCache::acquire(const Match& m) {
  for (int32_t p : m.pages) ref_page(p);
  if (m.snapshot >= 0) touch_snapshot(m.snapshot);
}

// ---- lower tier -----------------------------------------------------------------------------------------------------

void PrefixCache::offer(const BlockHash& h, bool wait) {
  auto it = blocks_.find(h);
  if (it == blocks_.end()) return;
  const Block& b = it->second;
  tier_->keep_page(h, b.parent, b.tokens, b.page, wait);
  if (b.snapshot >= 0) tier_->keep_snapshot(h, b.snapshot, wait);
}

int64_t PrefixCache::fill(std::span<const int32_t> tokens, int64_t max_tokens) {
  if (!tier_) return 0;
  const int64_t n_blocks = std::min<int64_t>(max_tokens, int64_t(tokens.size())) / kBlockTokens;
  auto block_tokens = [&](int64_t k) { return tokens.subspan(size_t(k * kBlockTokens), size_t(kBlockTokens)); };
  // the chain as far as this cache or the tier holds it; what match() finds here alone; the best end with a snapshot
  std::vector<BlockHash> hashes;
  std::vector<char> here;
  int64_t here_best = 0, best = 0;
  bool all_here = true;
  BlockHash parent = root_;
  for (int64_t k = 0; k < n_blocks; ++k) {
    const auto blk = block_tokens(k);
    const BlockHash h = block_hash(parent, blk);
    auto it = blocks_.find(h);
    const bool in = it != blocks_.end() && it->second.parent == parent &&
                    std::equal(blk.begin(), blk.end(), it->second.tokens.begin());
    if (!in && (it != blocks_.end() || !tier_->has_page(h))) break;  // missing, or a colliding entry here
    all_here = all_here && in;
    const bool snap_here = in && it->second.snapshot >= 0;
    if (snap_here && all_here) here_best = k + 1;
    if (snap_here || tier_->has_snapshot(h)) best = k + 1;
    hashes.push_back(h);
    here.push_back(in);
    parent = h;
  }
  if (best <= here_best) return 0;
  // pin the blocks cached here first (loading allocates pages, which may evict idle ones), then load the others
  std::vector<int32_t> pinned(size_t(best), -1);  // page of block k, while pinned
  for (int64_t k = 0; k < best; ++k)
    if (here[size_t(k)]) {
      pinned[size_t(k)] = blocks_.at(hashes[size_t(k)]).page;
      ref_page(pinned[size_t(k)]);
    }
  int64_t reached = 0, loaded = 0;
  for (; reached < best; ++reached) {
    const int64_t k = reached;
    if (here[size_t(k)]) continue;
    const auto p = alloc_page();
    if (!p) break;
    const BlockHash par = k == 0 ? root_ : hashes[size_t(k - 1)];
    if (!tier_->load_page(hashes[size_t(k)], par, block_tokens(k), *p)) {
      release_page(*p);
      break;
    }
    insert_block(hashes[size_t(k)], par, block_tokens(k), *p);
    pinned[size_t(k)] = *p;
    ++loaded;
  }
  // the snapshot after the longest loaded chain that has one (here or in the tier)
  for (int64_t e = reached; e > here_best; --e) {
    const BlockHash& h = hashes[size_t(e - 1)];
    if (blocks_.at(h).snapshot >= 0) break;
    if (!tier_->has_snapshot(h)) continue;
    const auto s = alloc_snapshot();
    if (!s) break;
    if (tier_->load_snapshot(h, *s)) {
      attach_snapshot(h, *s);
      ++tier_snaps_;
      break;
    }
    free_snapshot(*s);
  }
  for (size_t k = pinned.size(); k-- > 0;)  // last block first (leaves first in eviction order)
    if (pinned[k] >= 0) release_page(pinned[k]);
  tier_pages_ += loaded;
  return loaded;
}

void PrefixCache::flush_to_tier() {
  if (!tier_) return;
  for (int32_t p : idle_pages_) offer(*page_block_[size_t(p)], true);
  for (size_t p = 0; p < ref_.size(); ++p)
    if (ref_[p] > 0 && page_block_[p]) offer(*page_block_[p], true);
}

// ---- snapshots ------------------------------------------------------------------------------------------------------

void PrefixCache::touch_snapshot(int64_t s) {
  if (!snap_block_[size_t(s)]) return;
  idle_snaps_.erase(snap_it_[size_t(s)]);
  idle_snaps_.push_back(s);
  snap_it_[size_t(s)] = std::prev(idle_snaps_.end());
}

std::optional<int64_t> PrefixCache::alloc_snapshot() {
  if (!free_snaps_.empty()) {
    const int64_t s = free_snaps_.back();
    free_snaps_.pop_back();
    return s;
  }
  if (idle_snaps_.empty()) return std::nullopt;
  const int64_t s = idle_snaps_.front();
  idle_snaps_.pop_front();
  if (tier_) tier_->keep_snapshot(*snap_block_[size_t(s)], s, false);
  auto it = blocks_.find(*snap_block_[size_t(s)]);
  if (it != blocks_.end()) it->second.snapshot = -1;
  snap_block_[size_t(s)].reset();
  ++evicted_snaps_;
  return s;
}

bool PrefixCache::attach_snapshot(const BlockHash& hash, int64_t s) {
  if (s < 0 || s >= int64_t(snap_block_.size()) || snap_block_[size_t(s)])
    fail("internal: attach of snapshot {} not owned", s);
  auto it = blocks_.find(hash);
  if (it == blocks_.end() || it->second.snapshot >= 0) {
    free_snaps_.push_back(s);
    return false;
  }
  it->second.snapshot = s;
  snap_block_[size_t(s)] = hash;
  idle_snaps_.push_back(s);
  snap_it_[size_t(s)] = std::prev(idle_snaps_.end());
  return true;
}

void PrefixCache::free_snapshot(int64_t s) {
  if (s < 0 || s >= int64_t(snap_block_.size())) fail("internal: snapshot {} outside the cache", s);
  if (snap_block_[size_t(s)]) {
    auto it = blocks_.find(*snap_block_[size_t(s)]);
    if (it != blocks_.end()) it->second.snapshot = -1;
    idle_snaps_.erase(snap_it_[size_t(s)]);
    snap_block_[size_t(s)].reset();
  }
  free_snaps_.push_back(s);
}

PrefixCache::Stats PrefixCache::stats() const {
  Stats s;
  s.cached_blocks = int64_t(blocks_.size());
  s.pages_referenced = n_referenced_;
  s.pages_idle = int64_t(idle_pages_.size());
  s.pages_free = int64_t(free_pages_.size());
  s.snapshots_attached = int64_t(idle_snaps_.size());
  s.snapshots_free = int64_t(free_snaps_.size());
  s.evicted_pages = evicted_pages_;
  s.evicted_snapshots = evicted_snaps_;
  s.tier_pages_loaded = tier_pages_;
  s.tier_snapshots_loaded = tier_snaps_;
  return s;
}

}  // namespace dsv4
