// Checksums of stored files (the prefix cache's disk tier, engine/disk_cache.h): XXH64, the 64-bit hash of the
// xxHash family, computed by Debian's libxxhash (package libxxhash-dev, used header-only).
#pragma once
#include <cstddef>
#include <cstdint>

namespace dsv4 {

uint64_t xxh64(const void* data, size_t bytes, uint64_t seed = 0);

}  // namespace dsv4
