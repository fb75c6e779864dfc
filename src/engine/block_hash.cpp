// Block hash chain (block_hash.h): two independently seeded 64-bit lanes, each a splitmix64-style mix per token.
#include "engine/block_hash.h"

namespace dsv4 {

namespace {

inline uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

}  // namespace

BlockHash block_hash_root(uint64_t salt) {
  return BlockHash{mix(salt ^ 0x243F6A8885A308D3ull), mix(salt + 0x13198A2E03707344ull)};
}

BlockHash block_hash(const BlockHash& parent, std::span<const int32_t> tokens) {
  uint64_t a = mix(parent.hi ^ 0xA4093822299F31D0ull), b = mix(parent.lo + 0x082EFA98EC4E6C89ull);
  for (int32_t t : tokens) {
    const uint64_t v = uint64_t(uint32_t(t));
    a = mix(a ^ (v + 0x9E3779B97F4A7C15ull));
    b = mix((b + v) * 0xD6E8FEB86659FD93ull);
  }
  a = mix(a ^ uint64_t(tokens.size()));
  b = mix(b + uint64_t(tokens.size()));
  return BlockHash{a, b};
}

}  // namespace dsv4
