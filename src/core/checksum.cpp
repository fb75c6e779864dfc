// XXH64 from Debian's libxxhash (header-only use: XXH_INLINE_ALL, nothing to link).
#include "core/checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace dsv4 {

uint64_t xxh64(const void* data, size_t bytes, uint64_t seed) { return XXH64(data, bytes, seed); }

}  // namespace dsv4
