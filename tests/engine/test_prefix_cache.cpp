// PrefixCache bookkeeping (engine/prefix_cache.h) without a model: the block hash chain, page refcounts, the match
// rule (longest cached chain ending in a snapshot, at most max_tokens), LRU eviction of pages (tail blocks first)
// and of snapshots (independently), duplicate blocks, and the accounting of available pages.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <unordered_map>

#include "engine/block_hash.h"
#include "engine/prefix_cache.h"

using namespace dsv4;

namespace {

constexpr int64_t B = PrefixCache::kBlockTokens;

std::vector<int32_t> toks(int64_t n, int salt) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t((i * 131 + salt * 977) % 5000);
  return v;
}

// Register the full blocks of `t` with freshly allocated pages; returns the pages and hashes.
struct Registered {
  std::vector<int32_t> pages;
  std::vector<BlockHash> hashes;
};
Registered register_blocks(PrefixCache& c, const std::vector<int32_t>& t) {
  Registered r;
  BlockHash parent = c.root();
  for (int64_t k = 0; (k + 1) * B <= int64_t(t.size()); ++k) {
    auto blk = std::span<const int32_t>(t.data() + k * B, size_t(B));
    const BlockHash h = block_hash(parent, blk);
    const auto p = c.alloc_page();
    EXPECT_TRUE(p.has_value());
    EXPECT_TRUE(c.insert_block(h, parent, blk, *p));
    r.pages.push_back(*p);
    r.hashes.push_back(h);
    parent = h;
  }
  return r;
}

void snap(PrefixCache& c, const BlockHash& h) {
  const auto s = c.alloc_snapshot();
  ASSERT_TRUE(s.has_value());
  ASSERT_TRUE(c.attach_snapshot(h, *s));
}

}  // namespace

TEST(BlockHash, ChainDependsOnContentAndWholePrefix) {
  const BlockHash r = block_hash_root(1);
  const auto a = toks(128, 1), b = toks(128, 2);
  EXPECT_EQ(block_hash(r, a), block_hash(r, a));
  EXPECT_NE(block_hash(r, a), block_hash(r, b));
  EXPECT_NE(block_hash(block_hash(r, a), b), block_hash(block_hash(r, b), b));  // same block, other prefix
  EXPECT_NE(block_hash(r, a), block_hash(block_hash_root(2), a));               // other salt
  auto c = a;
  c[127] += 1;
  EXPECT_NE(block_hash(r, a), block_hash(r, c));
}

TEST(PrefixCache, PagesAreRefcountedAndBounded) {
  PrefixCache c({4, 0, 0});
  std::vector<int32_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(*c.alloc_page());
  EXPECT_FALSE(c.alloc_page().has_value());
  EXPECT_EQ(c.pages_available(), 0);
  EXPECT_EQ(c.pages_referenced(), 4);
  c.release_page(got[2]);
  EXPECT_EQ(c.pages_available(), 1);
  EXPECT_EQ(*c.alloc_page(), got[2]);
  EXPECT_THROW(c.release_page(99), std::exception);
}

TEST(PrefixCache, MatchIsTheLongestChainEndingInASnapshot) {
  PrefixCache c({8, 4, 7});
  const auto t = toks(5 * B + 10, 3);
  const Registered r = register_blocks(c, t);
  ASSERT_EQ(r.pages.size(), 5u);
  EXPECT_EQ(c.match(t, int64_t(t.size()) - 1).n_blocks, 0);  // no snapshot anywhere: no hit
  snap(c, r.hashes[1]);
  auto m = c.match(t, int64_t(t.size()) - 1);
  EXPECT_EQ(m.n_blocks, 2);
  EXPECT_EQ(m.pages, std::vector<int32_t>(r.pages.begin(), r.pages.begin() + 2));
  snap(c, r.hashes[3]);
  EXPECT_EQ(c.match(t, int64_t(t.size()) - 1).n_blocks, 4);
  EXPECT_EQ(c.match(t, 4 * B - 1).n_blocks, 2);              // max_tokens: 4 blocks would leave nothing to compute
  EXPECT_EQ(c.match(t, 4 * B).n_blocks, 4);
  // a prompt that differs inside block 2 reuses blocks 0-1 only
  auto u = t;
  u[size_t(2 * B + 5)] ^= 1;
  EXPECT_EQ(c.match(u, int64_t(u.size()) - 1).n_blocks, 2);
  // a different first block: nothing
  auto w = t;
  w[0] ^= 1;
  EXPECT_EQ(c.match(w, int64_t(w.size()) - 1).n_blocks, 0);
  // shorter prompts sharing the prefix (lengths 127 ... 513 with the len - 1 rule)
  for (auto [len, want] : std::vector<std::pair<int64_t, int64_t>>{{127, 0}, {128, 0}, {129, 0}, {257, 2}, {513, 4}}) {
    std::vector<int32_t> p(t.begin(), t.begin() + len);
    EXPECT_EQ(c.match(p, len - 1).n_blocks, want) << "length " << len;
  }
}

TEST(PrefixCache, AcquireSharesPagesAndIdlePagesAreEvictedTailFirst) {
  PrefixCache c({6, 6, 7});
  const auto a = toks(3 * B, 4), b = toks(3 * B, 5);
  const Registered ra = register_blocks(c, a);
  for (const auto& h : ra.hashes) snap(c, h);
  // a second sequence shares a's first 2 blocks
  auto m = c.match(a, 2 * B);
  ASSERT_EQ(m.n_blocks, 2);
  c.acquire(m);
  EXPECT_EQ(c.refcount(ra.pages[0]), 2);
  c.release_pages(m.pages);
  EXPECT_EQ(c.refcount(ra.pages[0]), 1);
  // a finishes: its pages become idle (still matchable)
  c.release_pages(ra.pages);
  EXPECT_EQ(c.pages_referenced(), 0);
  EXPECT_EQ(c.pages_available(), 6);
  EXPECT_EQ(c.match(a, int64_t(a.size())).n_blocks, 3);
  // b takes the 3 free pages, then one more page evicts a's TAIL block (released first)
  const Registered rb = register_blocks(c, b);
  const auto p = c.alloc_page();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(*p, ra.pages[2]);
  EXPECT_FALSE(c.contains(ra.hashes[2]));
  EXPECT_TRUE(c.contains(ra.hashes[1]));
  EXPECT_EQ(c.match(a, int64_t(a.size())).n_blocks, 2);   // the evicted block's snapshot went with it
  EXPECT_EQ(c.stats().evicted_pages, 1);
  // acquiring a match takes its idle pages out of the available count
  auto m2 = c.match(a, int64_t(a.size()));
  EXPECT_EQ(c.idle_pages_in(m2), 2);
  c.acquire(m2);
  EXPECT_EQ(c.pages_available(), 0);
  EXPECT_FALSE(c.alloc_page().has_value());
  (void)rb;
}

TEST(PrefixCache, SnapshotsAreEvictedLeastRecentlyUsedFirst) {
  PrefixCache c({8, 2, 7});
  const auto a = toks(4 * B, 6);
  const Registered r = register_blocks(c, a);
  snap(c, r.hashes[0]);
  snap(c, r.hashes[1]);
  EXPECT_EQ(c.snapshots_available(), 2);
  // use block 0's snapshot (a hit of one block): block 1's is now the least recently used
  auto m = c.match(std::vector<int32_t>(a.begin(), a.begin() + B + 1), B);
  ASSERT_EQ(m.n_blocks, 1);
  c.acquire(m);
  c.release_pages(m.pages);
  const auto s = c.alloc_snapshot();
  ASSERT_TRUE(s.has_value());
  EXPECT_FALSE(c.has_snapshot(r.hashes[1]));
  EXPECT_TRUE(c.has_snapshot(r.hashes[0]));
  EXPECT_TRUE(c.contains(r.hashes[1]));  // the block itself stays
  EXPECT_TRUE(c.attach_snapshot(r.hashes[3], *s));
  EXPECT_EQ(c.match(a, int64_t(a.size())).n_blocks, 4);
  // attaching to a block that has one (or is not cached) gives the snapshot back
  const auto s2 = c.alloc_snapshot();  // evicts block 0's (LRU now)
  ASSERT_TRUE(s2.has_value());
  EXPECT_FALSE(c.attach_snapshot(r.hashes[3], *s2));
  EXPECT_EQ(c.snapshots_available(), 2);  // s2 back in the free list + block 3's
  EXPECT_EQ(c.snapshot_of(r.hashes[3]), *s);
  c.free_snapshot(*s);                    // detach
  EXPECT_FALSE(c.has_snapshot(r.hashes[3]));
}

TEST(PrefixCache, DuplicateBlocksStayPrivate) {
  PrefixCache c({4, 0, 7});
  const auto a = toks(B, 7);
  const BlockHash h = block_hash(c.root(), a);
  const int32_t p1 = *c.alloc_page(), p2 = *c.alloc_page();
  EXPECT_TRUE(c.insert_block(h, c.root(), a, p1));
  EXPECT_FALSE(c.insert_block(h, c.root(), a, p2));  // computed twice concurrently: the second stays uncached
  c.release_page(p2);
  EXPECT_EQ(c.stats().pages_free, 3);  // p2 went back free, not idle
  c.release_page(p1);
  EXPECT_EQ(c.stats().pages_idle, 1);
}

namespace {

// A lower tier that remembers what it was given (the disk tier's contract without files).
struct FakeTier : PrefixCache::Tier {
  struct Page {
    BlockHash parent;
    std::vector<int32_t> tokens;
  };
  std::unordered_map<BlockHash, Page, BlockHashHasher> pages;
  std::unordered_map<BlockHash, int, BlockHashHasher> snaps;
  std::vector<BlockHash> bad;           // loads of these fail
  std::vector<BlockHash> kept_order;    // keep_page calls, in order
  int64_t page_loads = 0, snap_loads = 0;
  void keep_page(const BlockHash& h, const BlockHash& parent, std::span<const int32_t> t, int32_t, bool) override {
    kept_order.push_back(h);
    pages[h] = {parent, std::vector<int32_t>(t.begin(), t.end())};
  }
  void keep_snapshot(const BlockHash& h, int64_t, bool) override { snaps[h] = 1; }
  bool has_page(const BlockHash& h) const override { return pages.count(h) != 0; }
  bool has_snapshot(const BlockHash& h) const override { return snaps.count(h) != 0; }
  bool load_page(const BlockHash& h, const BlockHash& parent, std::span<const int32_t> t, int32_t) override {
    if (std::find(bad.begin(), bad.end(), h) != bad.end()) return false;
    auto it = pages.find(h);
    if (it == pages.end() || it->second.parent != parent || !std::equal(t.begin(), t.end(), it->second.tokens.begin()))
      return false;
    ++page_loads;
    return true;
  }
  bool load_snapshot(const BlockHash& h, int64_t) override {
    if (std::find(bad.begin(), bad.end(), h) != bad.end() || !snaps.count(h)) return false;
    ++snap_loads;
    return true;
  }
};

}  // namespace

TEST(PrefixCacheTier, EvictedBlocksGoToTheTierAndFillBringsThemBack) {
  PrefixCache c({4, 2, 7});
  FakeTier tier;
  c.set_tier(&tier);
  const auto t = toks(3 * B + 10, 1);
  Registered r = register_blocks(c, t);
  snap(c, r.hashes[0]);
  snap(c, r.hashes[2]);
  c.release_pages(r.pages);
  EXPECT_EQ(c.match(t, int64_t(t.size()) - 1).n_blocks, 3);
  EXPECT_EQ(c.fill(t, int64_t(t.size()) - 1), 0);  // nothing missing here: no load
  // another sequence takes every page: the three blocks (and their snapshots) are offered before reuse
  std::vector<int32_t> held;
  for (int i = 0; i < 4; ++i) held.push_back(*c.alloc_page());
  EXPECT_EQ(tier.pages.size(), 3u);
  EXPECT_EQ(tier.snaps.size(), 2u);
  c.release_pages(held);
  EXPECT_EQ(c.match(t, int64_t(t.size()) - 1).n_blocks, 0);
  EXPECT_EQ(c.fill(t, int64_t(t.size()) - 1), 3);
  EXPECT_EQ(tier.snap_loads, 1);  // only the last block's snapshot is needed
  const auto m = c.match(t, int64_t(t.size()) - 1);
  EXPECT_EQ(m.n_blocks, 3);
  EXPECT_EQ(c.stats().tier_pages_loaded, 3);
  EXPECT_EQ(c.stats().tier_snapshots_loaded, 1);
  EXPECT_EQ(c.pages_referenced(), 0);  // the loaded pages are cached-idle, nobody holds them
  // max_tokens bounds what is loaded like match(): one block
  PrefixCache d({4, 2, 7});
  d.set_tier(&tier);
  EXPECT_EQ(d.fill(t, 2 * B - 1), 1);
  EXPECT_EQ(d.match(t, 2 * B - 1).n_blocks, 1);
}

TEST(PrefixCacheTier, FillKeepsTheChainCachedHereAndUsesOnlyUnreferencedPages) {
  PrefixCache c({4, 2, 7});
  FakeTier tier;
  c.set_tier(&tier);
  const auto t = toks(3 * B + 10, 2);
  Registered r = register_blocks(c, t);
  snap(c, r.hashes[2]);
  // block 2 goes to the tier, blocks 0 and 1 stay cached-idle here
  c.release_page(r.pages[2]);
  const int32_t other = *c.alloc_page();  // the free page
  (void)other;
  const int32_t evicted = *c.alloc_page();  // evicts block 2 (the least recently used idle page)
  EXPECT_EQ(evicted, r.pages[2]);
  EXPECT_TRUE(tier.has_page(r.hashes[2]));
  EXPECT_TRUE(tier.has_snapshot(r.hashes[2]));
  c.release_page(r.pages[1]);
  c.release_page(r.pages[0]);
  EXPECT_EQ(c.match(t, int64_t(t.size()) - 1).n_blocks, 0);
  // every page is referenced or holds the chain: the load has nowhere to go, and must not evict block 0 or 1
  EXPECT_EQ(c.fill(t, int64_t(t.size()) - 1), 0);
  EXPECT_TRUE(c.contains(r.hashes[0]));
  EXPECT_TRUE(c.contains(r.hashes[1]));
  // one page free again: block 2 and its snapshot come back
  c.release_page(evicted);
  EXPECT_EQ(c.fill(t, int64_t(t.size()) - 1), 1);
  EXPECT_EQ(c.match(t, int64_t(t.size()) - 1).n_blocks, 3);
  EXPECT_EQ(c.pages_referenced(), 1);  // `other` only
}

TEST(PrefixCacheTier, AFailedLoadFallsBackToTheLongestUsablePrefix) {
  PrefixCache c({4, 2, 7});
  FakeTier tier;
  c.set_tier(&tier);
  const auto t = toks(3 * B + 10, 3);
  Registered r = register_blocks(c, t);
  snap(c, r.hashes[0]);
  snap(c, r.hashes[2]);
  c.flush_to_tier();  // every block, least recently used first (all referenced here: in page order)
  EXPECT_EQ(tier.pages.size(), 3u);
  EXPECT_EQ(tier.snaps.size(), 2u);
  PrefixCache d({4, 2, 7});
  d.set_tier(&tier);
  tier.bad = {r.hashes[2]};  // block 2's page is unusable: block 0's snapshot is the best end
  EXPECT_EQ(d.fill(t, int64_t(t.size()) - 1), 2);
  EXPECT_EQ(d.match(t, int64_t(t.size()) - 1).n_blocks, 1);
  PrefixCache e({4, 2, 7});
  e.set_tier(&tier);
  tier.bad = {r.hashes[0]};  // block 0 unusable: nothing
  EXPECT_EQ(e.fill(t, int64_t(t.size()) - 1), 0);
  EXPECT_EQ(e.match(t, int64_t(t.size()) - 1).n_blocks, 0);
  EXPECT_EQ(e.pages_available(), 4);
}
