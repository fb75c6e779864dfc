// The disk tier of the prefix cache (disk_cache.h): file format, directory index, writer thread, loads.
#include "engine/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/checksum.h"
#include "core/error.h"
#include "core/log.h"

namespace dsv4 {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'D', 'S', 'V', '4', 'K', 'V', 'C', '\n'};
constexpr uint32_t kBlockTokens = uint32_t(PrefixCache::kBlockTokens);

template <class T> void put(std::vector<unsigned char>& b, size_t off, T v) { std::memcpy(b.data() + off, &v, sizeof v); }
template <class T> T get(const std::vector<unsigned char>& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}

const char* suffix(DiskCache::Kind k) { return k == DiskCache::Kind::page ? ".page" : ".snap"; }
const char* kind_name(uint32_t k) { return k == 1 ? "page" : k == 2 ? "snapshot" : "unknown kind"; }

std::string hex(const BlockHash& h) { return fmt::format("{:016x}{:016x}", h.hi, h.lo); }

bool parse_hex(std::string_view s, uint64_t& v) {
  if (s.size() != 16) return false;
  v = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | uint64_t(d);
  }
  return true;
}

std::string errno_text(int e) { return std::strerror(e); }

// Write `a` then `b` to `path` (a new file). Empty on success, else why not.
std::string write_file(const fs::path& path, std::span<const unsigned char> a, std::span<const unsigned char> b) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return errno_text(errno);
  std::string err;
  for (std::span<const unsigned char> part : {a, b}) {
    size_t done = 0;
    while (err.empty() && done < part.size()) {
      const ssize_t n = ::write(fd, part.data() + done, part.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) err = n < 0 ? errno_text(errno) : "short write";
      else done += size_t(n);
    }
  }
  if (::close(fd) != 0 && err.empty()) err = errno_text(errno);
  return err;
}

// The whole file; false (errno kept) when it cannot be opened or read.
bool read_file(const fs::path& path, std::vector<unsigned char>& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return false;
  }
  out.resize(size_t(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += size_t(n);
  }
  ::close(fd);
  out.resize(done);
  return true;
}

}  // namespace

DiskCache::DiskCache(const DiskCacheOptions& o, StatePool& pool, uint64_t identity)
    : opts_(o), pool_(pool), identity_(identity) {
  opts_.queue_bytes = std::min(opts_.queue_bytes, opts_.max_bytes);
  for (Kind k : {Kind::page, Kind::snapshot}) {
    uint64_t n = 0;
    for (const Segment& s : segments(k, 0)) n += s.bytes;
    (k == Kind::page ? page_payload_ : snap_payload_) = n;
  }
  if (const std::string why = unusable_reason(opts_.dir); !why.empty()) {
    log::warn("disk cache: cannot use {} ({}): running without the disk tier of the prefix cache",
              opts_.dir.string(), why);
    return;
  }
  enabled_ = true;
  scan();
  log::info("disk cache: {}: {} files, {:.1f} MiB (limit {:.1f} MiB)", opts_.dir.string(), files_.size(),
            double(stats_.bytes) / double(1 << 20), double(opts_.max_bytes) / double(1 << 20));
  if (opts_.start_writer) writer_ = std::thread([this] { writer_loop(); });
}

std::string DiskCache::unusable_reason(const fs::path& dir) {
  std::error_code ec;
  if (dir.empty()) return "no directory given";
  if (fs::create_directories(dir, ec); ec) return ec.message();
  if (!fs::is_directory(dir, ec)) return "not a directory";
  const fs::path probe = dir / fmt::format(".probe.{}.tmp", ::getpid());  // can files be created there?
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_text(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

DiskCache::~DiskCache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  std::unique_lock<std::mutex> lock(mu_);
  while (!queue_.empty()) write_front(lock);  // manual mode: what is left
}

fs::path DiskCache::path_of(const BlockHash& h, Kind k) const { return opts_.dir / (hex(h) + suffix(k)); }

void DiskCache::scan() {
  struct Found {
    Key key;
    uint64_t bytes;
    fs::file_time_type mtime;
  };
  std::vector<Found> found;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& e : fs::directory_iterator(opts_.dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    const std::string name = e.path().filename().string();
    const auto mtime = e.last_write_time(ec);
    if (name.size() > 4 && name.ends_with(".tmp")) {  // a write that never finished (crash); not ours if recent
      if (!ec && now - mtime > std::chrono::hours(1)) fs::remove(e.path(), ec);
      continue;
    }
    Key k;
    if (name.size() != 37) continue;
    if (name.ends_with(".page")) k.kind = Kind::page;
    else if (name.ends_with(".snap")) k.kind = Kind::snapshot;
    else continue;
    if (!parse_hex(std::string_view(name).substr(0, 16), k.hash.hi) ||
        !parse_hex(std::string_view(name).substr(16, 16), k.hash.lo))
      continue;
    found.push_back({k, uint64_t(e.file_size(ec)), mtime});
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  for (const Found& f : found) {
    lru_.push_back(f.key);
    files_[f.key] = File{f.bytes, std::prev(lru_.end())};
    stats_.bytes += f.bytes;
  }
  while (stats_.bytes > opts_.max_bytes && !lru_.empty()) {  // the limit was lowered since
    const Key k = lru_.front();
    lru_.pop_front();
    stats_.bytes -= files_.at(k).bytes;
    files_.erase(k);
    fs::remove(path_of(k.hash, k.kind), ec);
    ++stats_.evicted;
  }
}

std::vector<DiskCache::Segment> DiskCache::segments(Kind kind, int64_t id) {
  const StateLayout& L = pool_.layout();
  std::vector<Segment> out;
  const int64_t KV = L.kv_row.words(), K = L.key_row.words();  // stored row widths (4-byte words)
  auto add = [&](Buffer& b, int64_t rows, int64_t width) {
    if (b && rows > 0) out.push_back({b.as<float>() + id * rows * width, size_t(rows * width) * 4});
  };
  for (size_t l = 0; l < L.layers.size(); ++l) {
    const StateLayout::Layer& ly = L.layers[l];
    StatePool::LayerBuffers& b = pool_.layer(int(l));
    if (kind == Kind::page) {
      if (ly.ratio > 0) add(b.comp, ly.rows_per_page, KV);
      if (ly.indexer) add(b.keys, ly.rows_per_page, K);
    } else {
      add(b.snap_ring, L.window, KV);
      if (ly.coff == 2) {
        add(b.snap_cmp_k, ly.ratio, ly.coff * L.head_dim);
        add(b.snap_cmp_s, ly.ratio, ly.coff * L.head_dim);
        add(b.snap_idx_k, ly.ratio, ly.coff * L.index_head_dim);
        add(b.snap_idx_s, ly.ratio, ly.coff * L.index_head_dim);
      }
    }
  }
  return out;
}

// ---- writes ---------------------------------------------------------------------------------------------------------

void DiskCache::keep_page(const BlockHash& hash, const BlockHash& parent, std::span<const int32_t> tokens, int32_t page,
                          bool wait) {
  keep(Key{hash, Kind::page}, parent, tokens, page, wait);
}

void DiskCache::keep_snapshot(const BlockHash& hash, int64_t snapshot, bool wait) {
  keep(Key{hash, Kind::snapshot}, BlockHash{}, {}, snapshot, wait);
}

void DiskCache::keep(const Key& key, const BlockHash& parent, std::span<const int32_t> tokens, int64_t id, bool wait) {
  if (!enabled_) return;
  const size_t head = kHeaderBytes + tokens.size() * 4, n = head + payload_bytes(key.kind);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (files_.count(key) || pending_.count(key)) return;  // kept already
    if (n + 8 > opts_.max_bytes) return;
    if (queued_bytes_ + n > opts_.queue_bytes) {
      if (!wait) {
        ++stats_.dropped;
        return;
      }
      if (writer_.joinable()) cv_.wait(lock, [&] { return queued_bytes_ + n <= opts_.queue_bytes || queue_.empty(); });
      else
        while (!queue_.empty()) write_front(lock);
    }
  }
  auto item = std::make_shared<Pending>();
  item->key = key;
  std::vector<unsigned char>& b = item->bytes;
  b.assign(n, 0);
  std::memcpy(b.data(), kMagic, 8);
  put<uint32_t>(b, 8, kFormatVersion);
  put<uint32_t>(b, 12, uint32_t(key.kind));
  put<uint64_t>(b, 16, identity_);
  put<uint64_t>(b, 24, key.hash.hi);
  put<uint64_t>(b, 32, key.hash.lo);
  put<uint64_t>(b, 40, parent.hi);
  put<uint64_t>(b, 48, parent.lo);
  put<uint32_t>(b, 56, uint32_t(tokens.size()));
  put<uint64_t>(b, 64, payload_bytes(key.kind));
  if (!tokens.empty()) std::memcpy(b.data() + kHeaderBytes, tokens.data(), tokens.size() * 4);
  try {
    size_t off = head;
    for (const Segment& s : segments(key.kind, id)) {
      pool_.backend()->copy_to_host(b.data() + off, s.rows, s.bytes);
      off += s.bytes;
    }
  } catch (const Error& e) {
    log::warn("disk cache: copying state out of the pool failed: {}", e.what());
    return;
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (pending_.count(key)) return;
    pending_[key] = item;
    queue_.push_back(item);
    queued_bytes_ += n;
    stats_.queued_bytes = queued_bytes_;
    if (wait && !writer_.joinable()) write_front(lock);
  }
  cv_.notify_all();
}

void DiskCache::writer_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, everything written
    write_front(lock);
  }
}

bool DiskCache::write_one() {
  std::unique_lock<std::mutex> lock(mu_);
  if (queue_.empty()) return false;
  write_front(lock);
  return true;
}

void DiskCache::drain() {
  if (!writer_.joinable()) {
    while (write_one()) {
    }
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && writing_ == 0; });
}

void DiskCache::write_front(std::unique_lock<std::mutex>& lock) {
  std::shared_ptr<Pending> item = queue_.front();
  queue_.pop_front();
  const uint64_t n = item->bytes.size() + 8;
  // make room: least recently used files first (a file of the same key is replaced)
  std::vector<Key> victims;
  if (auto it = files_.find(item->key); it != files_.end()) {
    stats_.bytes -= it->second.bytes;
    lru_.erase(it->second.lru);
    files_.erase(it);
  }
  while (stats_.bytes + n > opts_.max_bytes && !lru_.empty()) {
    const Key k = lru_.front();
    lru_.pop_front();
    stats_.bytes -= files_.at(k).bytes;
    files_.erase(k);
    victims.push_back(k);
  }
  stats_.bytes += n;  // reserved while writing
  stats_.evicted += int64_t(victims.size());
  ++writing_;
  const fs::path final_path = path_of(item->key.hash, item->key.kind);
  const fs::path tmp = opts_.dir / fmt::format("{}.{}.{}.tmp", final_path.filename().string(), ::getpid(),
                                                tmp_counter_++);
  lock.unlock();
  std::error_code ec;
  for (const Key& k : victims) fs::remove(path_of(k.hash, k.kind), ec);
  const uint64_t sum = xxh64(item->bytes.data(), item->bytes.size());
  unsigned char tail[8];
  std::memcpy(tail, &sum, 8);
  std::string err = write_file(tmp, item->bytes, tail);
  if (err.empty() && ::rename(tmp.c_str(), final_path.c_str()) != 0) err = errno_text(errno);
  if (!err.empty()) ::unlink(tmp.c_str());
  lock.lock();
  --writing_;
  pending_.erase(item->key);
  queued_bytes_ -= item->bytes.size();
  stats_.queued_bytes = queued_bytes_;
  if (err.empty()) {
    lru_.push_back(item->key);
    files_[item->key] = File{n, std::prev(lru_.end())};
    ++stats_.writes;
  } else {
    stats_.bytes -= n;
    ++stats_.write_errors;
    if (!write_error_logged_) {
      write_error_logged_ = true;
      log::warn("disk cache: cannot write {}: {} (the state stays in memory only; further write failures are counted, "
                "not logged)",
                final_path.string(), err);
    }
  }
  cv_.notify_all();
}

// ---- reads ----------------------------------------------------------------------------------------------------------

bool DiskCache::has_page(const BlockHash& hash) const {
  if (!enabled_) return false;
  const Key k{hash, Kind::page};
  std::lock_guard<std::mutex> lock(mu_);
  return files_.count(k) || pending_.count(k);
}

bool DiskCache::has_snapshot(const BlockHash& hash) const {
  if (!enabled_) return false;
  const Key k{hash, Kind::snapshot};
  std::lock_guard<std::mutex> lock(mu_);
  return files_.count(k) || pending_.count(k);
}

bool DiskCache::load_page(const BlockHash& hash, const BlockHash& parent, std::span<const int32_t> tokens,
                          int32_t page) {
  return load(Key{hash, Kind::page}, parent, tokens, page);
}

bool DiskCache::load_snapshot(const BlockHash& hash, int64_t snapshot) {
  return load(Key{hash, Kind::snapshot}, BlockHash{}, {}, snapshot);
}

std::string DiskCache::invalid(const std::vector<unsigned char>& f, const Key& key, const BlockHash& parent,
                               std::span<const int32_t> tokens, bool checked) const {
  const size_t tail = checked ? 8 : 0;
  if (f.size() < kHeaderBytes + tail) return fmt::format("truncated ({} bytes)", f.size());
  if (std::memcmp(f.data(), kMagic, 8) != 0) return "not a dsv4 prefix-cache file";
  if (const uint32_t v = get<uint32_t>(f, 8); v != kFormatVersion)
    return fmt::format("format version {} (this build reads version {})", v, kFormatVersion);
  if (const uint32_t k = get<uint32_t>(f, 12); k != uint32_t(key.kind))
    return fmt::format("holds a {}, not a {}", kind_name(k), kind_name(uint32_t(key.kind)));
  if (get<uint64_t>(f, 16) != identity_)
    return "written for another model, numerics, state layout or device";
  const BlockHash h{get<uint64_t>(f, 24), get<uint64_t>(f, 32)};
  if (h != key.hash) return fmt::format("holds block {}, not {}", hex(h), hex(key.hash));
  const uint32_t n_tok = get<uint32_t>(f, 56);
  const uint64_t payload = get<uint64_t>(f, 64);
  const uint32_t want_tok = key.kind == Kind::page ? kBlockTokens : 0;
  if (n_tok != want_tok || payload != payload_bytes(key.kind))
    return fmt::format("holds {} tokens and {} payload bytes, the state layout wants {} and {}", n_tok, payload,
                       want_tok, payload_bytes(key.kind));
  const uint64_t want = kHeaderBytes + uint64_t(n_tok) * 4 + payload + tail;
  if (f.size() < want) return fmt::format("truncated ({} of {} bytes)", f.size(), want);
  if (f.size() > want) return fmt::format("{} bytes longer than its header says", f.size() - want);
  if (checked && xxh64(f.data(), f.size() - 8) != get<uint64_t>(f, f.size() - 8)) return "checksum mismatch (corrupted)";
  if (key.kind == Kind::page) {
    const BlockHash par{get<uint64_t>(f, 40), get<uint64_t>(f, 48)};
    if (par != parent || tokens.size() != n_tok ||
        std::memcmp(f.data() + kHeaderBytes, tokens.data(), tokens.size() * 4) != 0)
      return "holds other tokens than the block it is named after";
  }
  return {};
}

bool DiskCache::load(const Key& key, const BlockHash& parent, std::span<const int32_t> tokens, int64_t id) {
  if (!enabled_) return false;
  std::shared_ptr<Pending> queued;
  fs::path path = path_of(key.hash, key.kind);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto p = pending_.find(key); p != pending_.end()) {
      queued = p->second;
    } else if (auto f = files_.find(key); f != files_.end()) {
      lru_.splice(lru_.end(), lru_, f->second.lru);  // most recently used
    } else {
      return false;
    }
  }
  std::vector<unsigned char> file;
  const std::vector<unsigned char>* data = queued ? &queued->bytes : &file;
  if (!queued && !read_file(path, file)) {  // deleted meanwhile (evicted by the writer, or by hand)
    std::lock_guard<std::mutex> lock(mu_);
    if (auto f = files_.find(key); f != files_.end()) {
      stats_.bytes -= f->second.bytes;
      lru_.erase(f->second.lru);
      files_.erase(f);
    }
    return false;
  }
  if (const std::string why = invalid(*data, key, parent, tokens, !queued); !why.empty()) {
    if (queued) return false;  // our own copy of other tokens (a hash collision): not used, nothing to delete
    log::warn("disk cache: {}: {}; not used, deleted (the state is recomputed)", path.string(), why);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto f = files_.find(key); f != files_.end()) {
      stats_.bytes -= f->second.bytes;
      lru_.erase(f->second.lru);
      files_.erase(f);
    }
    ::unlink(path.c_str());
    ++stats_.rejected;
    return false;
  }
  if (!queued) ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // the use survives a restart (LRU order)
  try {
    size_t off = kHeaderBytes + tokens.size() * 4;
    for (const Segment& s : segments(key.kind, id)) {
      pool_.backend()->copy_to_device(s.rows, data->data() + off, s.bytes);
      off += s.bytes;
    }
    pool_.backend()->synchronize();  // the host bytes go out of scope
  } catch (const Error& e) {
    log::warn("disk cache: copying state into the pool failed: {}", e.what());
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++(key.kind == Kind::page ? stats_.pages_loaded : stats_.snapshots_loaded);
  return true;
}

DiskCache::Stats DiskCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.files = int64_t(files_.size());
  return s;
}

}  // namespace dsv4
