// PrefixCache bookkeeping (engine/prefix_cache.h) without a model: the block hash chain, page refcounts, the match
// rule (longest cached chain ending in a snapshot, at most max_tokens), LRU eviction of pages (tail blocks first)
// and of snapshots (independently), duplicate blocks, and the accounting of available pages.
#include <gtest/gtest.h>

#include <numeric>

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
