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
    if (page_block_[size_t(p)]) drop_block(*page_block_[size_t(p)]);
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
  for (int32_t p : m.pages) {
    if (ref_[size_t(p)]++ == 0) {
      ++n_referenced_;
      if (in_idle_[size_t(p)]) {
        idle_pages_.erase(idle_it_[size_t(p)]);
        in_idle_[size_t(p)] = 0;
      }
    }
  }
  if (m.snapshot >= 0) touch_snapshot(m.snapshot);
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
  return s;
}

}  // namespace dsv4
