// PrefixCache: the host-side bookkeeping of a StatePool's pages and snapshots (model/state_pool.h) — which page
// belongs to whom, which full 128-token blocks are cached and reusable by any later sequence, and which block ends
// carry a boundary snapshot. No device memory is touched here; the engine moves the state (restore_snapshot) and the
// forward step fills pages and snapshots (model/batch.h).
//
// Pages: refcounted (one reference per sequence whose page table holds the page). A page is free (never used, or
// released while uncached), referenced, or cached-idle (refcount 0 but holding a registered block: still matchable,
// evicted least recently used first when a page is needed). Releasing a sequence's pages from its last block to its
// first puts its tail blocks first in eviction order (leaves first).
// Blocks: block k of a sequence is keyed by its chain hash (engine/block_hash.h); an entry records the page, the
// parent hash and the block's tokens (verified on every match), and optionally the snapshot of the state right after
// the block (position 128 (k + 1)). Only one page per hash is cached; a sequence that computed the same block
// concurrently keeps its own page private.
// Snapshots: owned by the caller from alloc_snapshot() until attach_snapshot() hands them to a cached block; attached
// snapshots are evicted least recently used first (independently of pages), and go with their block's page.
// Match rule: the longest chain of cached blocks 0..k-1 whose last block has a snapshot, 128 k <= max_tokens (the
// caller passes prompt length - 1, so at least one token is computed and yields the next-token logits).
// Lower tier (optional, engine/disk_cache.h): a cached block's page or an attached snapshot that is about to be
// reused is offered to the tier first (it copies the rows out of the pool), and fill() brings blocks and snapshots
// that only the tier holds back into pages and snapshots here, so that match() finds them.
#pragma once
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/block_hash.h"

namespace dsv4 {

class PrefixCache {
 public:
  static constexpr int64_t kBlockTokens = 128;

  struct Options {
    int64_t n_pages = 0;
    int64_t n_snapshots = 0;
    uint64_t salt = 0;           // block_hash_root(salt): model / numerics / layout identity
  };
  explicit PrefixCache(const Options& o);

  // Storage below this cache (the disk tier). Calls come from the thread that uses the cache.
  class Tier {
   public:
    virtual ~Tier() = default;
    // The page of cached block `hash` / the snapshot attached to it is about to be reused: keep a copy if wanted
    // (read it from the pool now). `wait` false: never block (drop the copy when behind); true: shutdown flush.
    virtual void keep_page(const BlockHash& hash, const BlockHash& parent, std::span<const int32_t> tokens,
                           int32_t page, bool wait) = 0;
    virtual void keep_snapshot(const BlockHash& hash, int64_t snapshot, bool wait) = 0;
    virtual bool has_page(const BlockHash& hash) const = 0;
    virtual bool has_snapshot(const BlockHash& hash) const = 0;
    // Write the kept rows of block `hash` (whose parent and tokens must match) into `page` / the kept snapshot
    // after it into `snapshot`. false when there is no usable copy (missing, invalid: then it is forgotten).
    virtual bool load_page(const BlockHash& hash, const BlockHash& parent, std::span<const int32_t> tokens,
                           int32_t page) = 0;
    virtual bool load_snapshot(const BlockHash& hash, int64_t snapshot) = 0;
  };
  // Not owned; nullptr: none.
  void set_tier(Tier* tier) { tier_ = tier; }
  // Bring the longest reusable prefix of `tokens` (the match rule, 128 k <= max_tokens) that this cache and the tier
  // hold together into this cache, when it is longer than what match() finds here alone: the tier's blocks go into
  // free or evicted pages (cached-idle afterwards), the tier's snapshot after the last block into a snapshot. Uses
  // only pages and snapshots that nobody references. Returns the blocks loaded from the tier.
  int64_t fill(std::span<const int32_t> tokens, int64_t max_tokens);
  // Offer every cached block (with its snapshot) to the tier, least recently used first (shutdown).
  void flush_to_tier();

  // ---- pages ----
  // A page for a sequence (refcount 1): a free page first, else the least recently used cached-idle page (its block
  // and snapshot leave the cache). nullopt when every page is referenced.
  std::optional<int32_t> alloc_page();
  // Drop one reference; at 0 a cached page becomes cached-idle (most recently used), an uncached one free.
  void release_page(int32_t page);
  // Release a whole page table, last page first.
  void release_pages(std::span<const int32_t> pages);
  int64_t n_pages() const { return int64_t(ref_.size()); }
  // Pages alloc_page() can still return (free + cached-idle).
  int64_t pages_available() const { return int64_t(free_pages_.size() + idle_pages_.size()); }
  int64_t pages_referenced() const { return n_referenced_; }
  int32_t refcount(int32_t page) const { return ref_[size_t(page)]; }

  // ---- blocks ----
  BlockHash root() const { return root_; }
  // Register the full block held by `page` (referenced by the caller) under `hash` (parent `parent`, 128 tokens).
  // false when the hash is already cached (the page stays uncached).
  bool insert_block(const BlockHash& hash, const BlockHash& parent, std::span<const int32_t> tokens, int32_t page);
  bool contains(const BlockHash& hash) const { return blocks_.count(hash) != 0; }
  bool has_snapshot(const BlockHash& hash) const;
  // The snapshot attached to the cached block `hash`, or -1.
  int64_t snapshot_of(const BlockHash& hash) const;

  struct Match {
    int64_t n_blocks = 0;              // reusable blocks (tokens: 128 * n_blocks)
    std::vector<int32_t> pages;        // their pages, in order
    std::vector<BlockHash> hashes;     // their chain hashes
    int64_t snapshot = -1;             // the snapshot after the last one (-1 when n_blocks == 0)
  };
  // The longest reusable prefix of `tokens` with 128 * n_blocks <= max_tokens (see the match rule above).
  Match match(std::span<const int32_t> tokens, int64_t max_tokens) const;
  // Take a match: every page gets one more reference (leaving the idle list) and the snapshot becomes the most
  // recently used. Call right after match(), before any other page or snapshot operation.
  void acquire(const Match& m);
  // Pages of `m` that are cached-idle now (acquiring the match takes them out of pages_available()).
  int64_t idle_pages_in(const Match& m) const;

  // ---- snapshots ----
  // A snapshot id owned by the caller: a free one, else the least recently used attached one (detached from its
  // block). nullopt when there are none (n_snapshots == 0 or all owned by callers).
  std::optional<int64_t> alloc_snapshot();
  // Hand `snap` to the cached block `hash` as the state after it. false (and `snap` is freed) when the block is not
  // cached or already has a snapshot.
  bool attach_snapshot(const BlockHash& hash, int64_t snap);
  // Give back a snapshot the caller owns, or detach and free the one attached to a block.
  void free_snapshot(int64_t snap);
  int64_t n_snapshots() const { return int64_t(snap_block_.size()); }
  int64_t snapshots_attached() const { return int64_t(idle_snaps_.size()); }
  int64_t snapshots_available() const { return int64_t(free_snaps_.size() + idle_snaps_.size()); }

  struct Stats {
    int64_t cached_blocks = 0, pages_referenced = 0, pages_idle = 0, pages_free = 0;
    int64_t snapshots_attached = 0, snapshots_free = 0;
    int64_t evicted_pages = 0, evicted_snapshots = 0;
    int64_t tier_pages_loaded = 0, tier_snapshots_loaded = 0;  // fill()
  };
  Stats stats() const;

 private:
  struct Block {
    BlockHash parent;
    std::vector<int32_t> tokens;
    int32_t page = -1;
    int64_t snapshot = -1;
  };
  void drop_block(const BlockHash& h);  // the block of an evicted page
  void touch_snapshot(int64_t snap);
  void offer(const BlockHash& h, bool wait);  // the block's page and snapshot to the tier
  void ref_page(int32_t page);

  BlockHash root_;
  std::vector<int32_t> ref_;                         // [n_pages] refcounts
  std::vector<std::optional<BlockHash>> page_block_; // [n_pages] the block a page caches
  std::list<int32_t> free_pages_;                    // front: next to hand out
  std::list<int32_t> idle_pages_;                    // front: least recently used
  std::vector<std::list<int32_t>::iterator> idle_it_;
  std::vector<char> in_idle_;
  int64_t n_referenced_ = 0;
  std::unordered_map<BlockHash, Block, BlockHashHasher> blocks_;
  std::vector<std::optional<BlockHash>> snap_block_; // [n_snapshots] the block a snapshot is attached to
  std::vector<int64_t> free_snaps_;
  std::list<int64_t> idle_snaps_;                    // attached snapshots, front: least recently used
  std::vector<std::list<int64_t>::iterator> snap_it_;
  int64_t evicted_pages_ = 0, evicted_snaps_ = 0;
  Tier* tier_ = nullptr;
  int64_t tier_pages_ = 0, tier_snaps_ = 0;
};

}  // namespace dsv4
