// Content hash of a 128-token block and its whole prefix (the prefix cache's key, engine/prefix_cache.h): a chain
// h_k = H(h_{k-1}, tokens of block k), h_{-1} = H(salt), so equal hashes mean equal prefixes (up to collisions of a
// 128-bit non-cryptographic hash; the cache also compares the block's tokens and its parent hash on every hit).
// The salt separates caches whose rows differ for the same tokens (model, numerics, state layout version).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

namespace dsv4 {

struct BlockHash {
  uint64_t hi = 0, lo = 0;
  friend bool operator==(const BlockHash& a, const BlockHash& b) { return a.hi == b.hi && a.lo == b.lo; }
  friend bool operator!=(const BlockHash& a, const BlockHash& b) { return !(a == b); }
};

// The chain's root (the parent of block 0).
BlockHash block_hash_root(uint64_t salt);
// The hash of a block of `tokens` whose parent (the prefix before it) hashes to `parent`.
BlockHash block_hash(const BlockHash& parent, std::span<const int32_t> tokens);

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return size_t(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};

}  // namespace dsv4
