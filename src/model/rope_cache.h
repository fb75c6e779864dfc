// RoPE (cos, sin) rows kept per position (spec §4.7). Every step's plan carries the rows of its tokens' positions
// for both RoPE kinds (model/step_plan.h); computing them (rd/2 sincos per position and kind) was the largest part
// of building the plan of a long prefill, and a server sees the same positions again and again. Rows of positions
// below a bound are computed once, a chunk of kChunk positions at a time when a position of the chunk is first
// asked for, and copied from then on; rows beyond the bound are computed per call. Either way they are the rows of
// RopeTable::cos_sin, bit for bit (the same function computes them, one row per position, whichever thread runs
// it). Thread-safe: lanes build their plans concurrently.
//
// Memory: rd floats per cached position, at most kMaxCached positions (V4-Flash, rd 64: 32 MiB per kind).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>

#include "model/rope.h"

namespace dsv4 {

class RopeCache {
 public:
  static constexpr int64_t kChunk = 1024;                  // positions per chunk (256 KiB at rd 64)
  static constexpr int64_t kMaxCached = int64_t(1) << 17;  // positions kept at most

  RopeCache() = default;
  // Rows of positions < min(limit, kMaxCached) are kept (limit: the model's max_position_embeddings).
  RopeCache(RopeTable table, int64_t limit);

  const RopeTable& table() const { return table_; }
  int rd() const { return table_.rd(); }
  int64_t cached_limit() const { return n_cached_; }  // positions below this are kept once computed
  // out[n, rd]: the (cos, sin) rows of positions pos[0..n). A negative position is an error.
  void cos_sin(std::span<const int64_t> pos, float* out) const;

 private:
  struct Chunks {
    std::mutex fill;                                // held while chunks are computed
    std::unique_ptr<std::atomic<bool>[]> ready;     // [n] rows computed (set after them, read before them)
    std::unique_ptr<std::unique_ptr<float[]>[]> rows;  // [n] each [kChunk, rd], allocated when computed
  };
  void fill_missing(std::span<const int64_t> pos) const;  // computes the chunks of pos that are not ready

  RopeTable table_;
  int64_t n_cached_ = 0;
  std::unique_ptr<Chunks> chunks_;
};

}  // namespace dsv4
