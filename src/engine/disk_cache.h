// DiskCache: the disk tier of the prefix cache (--cache-dir DIR --cache-size BYTES). A PrefixCache::Tier
// (engine/prefix_cache.h): the page of a cached block (its compressed attention rows and indexer keys, every layer)
// and the boundary snapshot after a block (model/state_pool.h) are copied out of the pool when the RAM cache reuses
// them, written by a writer thread, and loaded back into the pool (Backend copies: CPU or device buffers alike) when
// a later request's prefix chain (engine/block_hash.h) names them — also by a new process on the same directory.
//
// Files: one per page (<hash>.page) and per snapshot (<hash>.snap), <hash> the block's chain hash as 32 hex digits;
// written to a temporary name and renamed, so a crash leaves no partial file under a final name. Format version 2
// (2: rows in the pool's row format, compact in reference numerics on the CPU; version-1 files are foreign),
// little-endian:
//     0  magic     8 bytes "DSV4KVC\n"
//     8  version   u32     kFormatVersion
//    12  kind      u32     1: page, 2: snapshot
//    16  identity  u64     cache_identity() of the model (engine/cache_identity.h): weights, numerics, layout, device
//    24  hash      2 x u64 hi, lo: the block's chain hash
//    40  parent    2 x u64 the parent block's chain hash (pages; 0 for snapshots)
//    56  n_tokens  u32     128 (pages: the block's tokens follow) or 0
//    60  reserved  u32     0
//    64  payload   u64     payload bytes (as the state layout says)
//    72  tokens    n_tokens x i32
//        payload   rows as stored in the pool (model/state_layout.h: kv_row / key_row, fp32 or compact; frontiers
//                  fp32), layer by layer. page: compressed rows [rows_per_page, kv_row], then indexer keys
//                  [rows_per_page, key_row]; snapshot: the ring [window, kv_row], then
//                  (ratio-4 layers) compressor frontier k, s [ratio, 2 head_dim] and indexer frontier k, s
//                  [ratio, 2 index_head_dim]
//   end-8  checksum u64    XXH64 of every byte before it (core/checksum.h)
// A file that is truncated, fails its checksum, has another magic, version, kind, identity, hash, size or tokens is
// never used: it is logged (one warning per file), deleted, and the state it held is recomputed.
//
// Writes never block the caller: keep_*() copies the rows to host memory and queues them (at most queue_bytes);
// when the writer is behind, the copy is dropped (counted). The writer keeps the directory's files under max_bytes by
// deleting the least recently used ones (reads count as use; on startup the files' modification times give the
// order) before it writes. A directory that cannot be created or written logs one warning and leaves the tier
// disabled; a write that fails (full disk, quota) logs one warning for the first failure, and the engine goes on
// without that file. Queued copies can be read back before they reach the disk.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/prefix_cache.h"
#include "model/state_pool.h"

namespace dsv4 {

struct DiskCacheOptions {
  std::filesystem::path dir;
  uint64_t max_bytes = uint64_t(16) << 30;   // the directory's files at most (--cache-size)
  uint64_t queue_bytes = uint64_t(256) << 20;  // copies waiting for the writer at most (capped to max_bytes)
  bool start_writer = true;                  // false: no thread; write_one() writes (tests)
};

class DiskCache final : public PrefixCache::Tier {
 public:
  static constexpr uint32_t kFormatVersion = 2;
  static constexpr size_t kHeaderBytes = 72;
  enum class Kind : uint32_t { page = 1, snapshot = 2 };

  // Creates the directory if needed and indexes the files in it (names and sizes: contents are checked when read);
  // deletes the oldest when they exceed max_bytes. `pool` (the rows' storage) and the model behind `identity` must
  // outlive the cache.
  DiskCache(const DiskCacheOptions& opts, StatePool& pool, uint64_t identity);
  // Why `dir` cannot hold the cache (created if missing, then a file created and removed there), or "" when it can.
  // The constructor runs without the disk tier in that case; `dsv4 serve` refuses such a --cache-dir up front.
  static std::string unusable_reason(const std::filesystem::path& dir);
  // Writes what is queued, then stops the writer.
  ~DiskCache() override;
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  // false: the directory is unusable (logged); every Tier call is a no-op / miss.
  bool enabled() const { return enabled_; }
  // Wait until every queued copy is written (or failed).
  void drain();
  // Manual mode: write the oldest queued copy; false when none is queued.
  bool write_one();

  // The file of a block's page / snapshot (whether or not it exists).
  std::filesystem::path path_of(const BlockHash& hash, Kind kind) const;

  struct Stats {
    int64_t files = 0;              // in the directory (indexed)
    uint64_t bytes = 0;             // their size (+ the file being written)
    int64_t writes = 0, write_errors = 0, dropped = 0;  // dropped: the writer was behind
    int64_t pages_loaded = 0, snapshots_loaded = 0;
    int64_t rejected = 0;           // invalid files detected (and deleted)
    int64_t evicted = 0;            // files deleted to stay under max_bytes
    uint64_t queued_bytes = 0;
  };
  Stats stats() const;

  // PrefixCache::Tier
  void keep_page(const BlockHash& hash, const BlockHash& parent, std::span<const int32_t> tokens, int32_t page,
                 bool wait) override;
  void keep_snapshot(const BlockHash& hash, int64_t snapshot, bool wait) override;
  bool has_page(const BlockHash& hash) const override;
  bool has_snapshot(const BlockHash& hash) const override;
  bool load_page(const BlockHash& hash, const BlockHash& parent, std::span<const int32_t> tokens,
                 int32_t page) override;
  bool load_snapshot(const BlockHash& hash, int64_t snapshot) override;

 private:
  struct Key {
    BlockHash hash;
    Kind kind = Kind::page;
    friend bool operator==(const Key& a, const Key& b) { return a.hash == b.hash && a.kind == b.kind; }
  };
  struct KeyHasher {
    size_t operator()(const Key& k) const { return BlockHashHasher{}(k.hash) ^ size_t(k.kind); }
  };
  struct File {
    uint64_t bytes = 0;
    std::list<Key>::iterator lru;
  };
  struct Pending {
    Key key;
    std::vector<unsigned char> bytes;  // the file without its checksum
  };
  // A run of fp32 rows of the pool (device memory) that the payload holds, in payload order.
  struct Segment {
    float* rows;
    size_t bytes;
  };

  std::vector<Segment> segments(Kind kind, int64_t id);
  uint64_t payload_bytes(Kind kind) const { return kind == Kind::page ? page_payload_ : snap_payload_; }
  void keep(const Key& key, const BlockHash& parent, std::span<const int32_t> tokens, int64_t id, bool wait);
  bool load(const Key& key, const BlockHash& parent, std::span<const int32_t> tokens, int64_t id);
  // Why `file` (the whole file, checksum included when `checked`) is not a valid copy of `key`, or empty.
  std::string invalid(const std::vector<unsigned char>& file, const Key& key, const BlockHash& parent,
                      std::span<const int32_t> tokens, bool checked) const;
  void scan();
  void writer_loop();
  void write_front(std::unique_lock<std::mutex>& lock);  // mu_ held

  DiskCacheOptions opts_;
  StatePool& pool_;
  const uint64_t identity_;
  bool enabled_ = false;
  uint64_t page_payload_ = 0, snap_payload_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // queue / room / drained
  std::unordered_map<Key, File, KeyHasher> files_;
  std::list<Key> lru_;          // front: least recently used
  std::deque<std::shared_ptr<Pending>> queue_;
  std::unordered_map<Key, std::shared_ptr<Pending>, KeyHasher> pending_;  // queued or being written
  uint64_t queued_bytes_ = 0;
  int64_t writing_ = 0;
  bool stop_ = false, write_error_logged_ = false;
  uint64_t tmp_counter_ = 0;
  Stats stats_;
  std::thread writer_;
};

}  // namespace dsv4
