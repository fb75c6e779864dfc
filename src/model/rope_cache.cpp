// RoPE rows kept per position (see rope_cache.h).
#include "model/rope_cache.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/parallel.h"
#include "core/error.h"

namespace dsv4 {
namespace {

// fn(i) for i in [0, n), each computing one row: on the pool when there are many (each row by one thread, so the
// rows do not depend on the thread count), else on the calling thread.
template <class Fn>
void compute_rows(int64_t n, Fn&& fn) {
  constexpr int64_t kParallelMin = 256;
  if (n >= kParallelMin) {
    parallel_for(n, fn);
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

}  // namespace

RopeCache::RopeCache(RopeTable table, int64_t limit)
    : table_(std::move(table)), n_cached_(std::clamp<int64_t>(limit, 0, kMaxCached)), chunks_(new Chunks) {
  const size_t n = size_t((n_cached_ + kChunk - 1) / kChunk);
  chunks_->ready = std::make_unique<std::atomic<bool>[]>(n);
  for (size_t c = 0; c < n; ++c) chunks_->ready[c].store(false, std::memory_order_relaxed);
  chunks_->rows = std::make_unique<std::unique_ptr<float[]>[]>(n);
}

void RopeCache::fill_missing(std::span<const int64_t> pos) const {
  std::vector<int64_t> missing;
  for (int64_t p : pos)
    if (p < n_cached_ && !chunks_->ready[size_t(p / kChunk)].load(std::memory_order_acquire) &&
        (missing.empty() || missing.back() != p / kChunk))
      missing.push_back(p / kChunk);
  if (missing.empty()) return;
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());

  std::lock_guard<std::mutex> lock(chunks_->fill);
  std::erase_if(missing, [&](int64_t c) { return chunks_->ready[size_t(c)].load(std::memory_order_acquire); });
  const size_t rd = size_t(table_.rd());
  for (int64_t c : missing) chunks_->rows[size_t(c)] = std::make_unique<float[]>(size_t(kChunk) * rd);
  compute_rows(int64_t(missing.size()) * kChunk, [&](int64_t i) {
    const int64_t c = missing[size_t(i / kChunk)], r = i % kChunk;
    table_.cos_sin(c * kChunk + r, chunks_->rows[size_t(c)].get() + size_t(r) * rd);
  });
  for (int64_t c : missing) chunks_->ready[size_t(c)].store(true, std::memory_order_release);
}

void RopeCache::cos_sin(std::span<const int64_t> pos, float* out) const {
  for (int64_t p : pos)
    if (p < 0) fail("rope: negative position {}", p);
  fill_missing(pos);
  // kept rows are copied (a copy is not worth a parallel region), the others computed
  const size_t rd = size_t(table_.rd());
  std::vector<size_t> beyond;
  for (size_t t = 0; t < pos.size(); ++t) {
    const int64_t p = pos[t];
    if (p < n_cached_)
      std::memcpy(out + t * rd, chunks_->rows[size_t(p / kChunk)].get() + size_t(p % kChunk) * rd, rd * sizeof(float));
    else
      beyond.push_back(t);
  }
  compute_rows(int64_t(beyond.size()), [&](int64_t i) {
    const size_t t = beyond[size_t(i)];
    table_.cos_sin(pos[t], out + t * rd);
  });
}

}  // namespace dsv4
