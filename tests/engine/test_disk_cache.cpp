// The disk tier of the prefix cache (engine/disk_cache.h): pages and snapshots round-trip through files and through
// the write queue exactly; the queue drops copies instead of waiting when the writer is behind; an EngineLoop on a
// cache directory finds the blocks of an earlier EngineLoop (a restart) and of blocks its small pool evicted, with
// outputs equal to cold runs and the expected cached tokens; a truncated, byte-flipped, wrong-version and
// wrong-model file is each detected, logged once, deleted and recomputed; the directory stays under its size
// limit; an unusable directory and failing writes (a full disk) give one log line and the engine keeps working.
#include <gtest/gtest.h>
#include <omp.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/checksum.h"
#include "engine/cache_identity.h"
#include "engine/disk_cache.h"
#include "engine/engine_loop.h"
#include "model/sequence.h"

using namespace dsv4;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<const Model> load(const std::string& name) {
  static const bool single = (omp_set_num_threads(1), true);  // tiny ops: no OpenMP fork/join on a loaded CI box
  (void)single;
  static std::map<std::string, std::shared_ptr<const Model>> cache;
  auto& m = cache[name];
  if (!m)
    m = Model::load(name == "demo" ? std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo"
                                   : std::string(DSV4_SOURCE_DIR) + "/tests/data/" + name);
  return m;
}

std::vector<int32_t> ids(int64_t n, int salt, int32_t vocab) {
  std::vector<int32_t> v{0};
  for (int64_t i = 1; i < n; ++i) v.push_back(int32_t(3 + (i * 131 + salt * 977 + (i * i) % 7) % (vocab - 3)));
  return v;
}

// Greedy tokens of one request run alone through the single-sequence path (no cache of any kind).
std::vector<int32_t> solo(const Model& m, const std::vector<int32_t>& prompt, int64_t n) {
  ModelSequence seq(m);
  std::vector<float> lg(static_cast<size_t>(m.n_vocab()));
  seq.append(prompt, lg);
  SamplingParams sp;
  sp.temperature = 0.0f;
  Sampler s(sp, m.n_vocab());
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = s.sample(lg);
    if (t == m.eos_id()) break;
    out.push_back(t);
    if (i + 1 < n) seq.append(std::span<const int32_t>(&out.back(), 1), lg);
  }
  return out;
}

EngineRequest greedy_req(std::vector<int32_t> prompt, int64_t n) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = n;
  r.sampling.temperature = 0.0f;
  return r;
}

EngineLoopOptions on_disk(const fs::path& dir, int64_t max_running = 2) {
  EngineLoopOptions o;
  o.max_running = max_running;
  o.batch_tokens = 512;
  o.start_thread = false;
  o.state_bytes = uint64_t(64) << 20;
  o.cache_dir = dir.string();
  return o;
}

struct Outcome {
  std::vector<int32_t> tokens;
  int64_t cached = -1;
  EngineLoop::Stats stats;
};

// One request through a fresh EngineLoop on `o` (destroyed afterwards: its cached blocks go to the disk).
Outcome run_once(std::shared_ptr<const Model> m, const EngineLoopOptions& o, const std::vector<int32_t>& prompt, int64_t n) {
  EngineLoop loop(m, o);
  auto s = loop.submit(greedy_req(prompt, n));
  loop.run_until_idle();
  const auto r = s->wait();
  return {r.tokens, r.cached_tokens, loop.stats()};
}

// A fresh directory per test, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() / fmt::format("dsv4-disk-{}-{}-{}", t->name(), ::getpid(), counter()++);
    fs::remove_all(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

// Everything logged while alive (warnings and up), through spdlog's default logger.
struct CaptureLog {
  std::ostringstream out;
  std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
  CaptureLog() {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
    auto lg = std::make_shared<spdlog::logger>("capture", sink);
    lg->set_level(spdlog::level::warn);
    lg->set_pattern("%l %v");
    spdlog::set_default_logger(lg);
  }
  ~CaptureLog() { spdlog::set_default_logger(saved); }
  int lines_with(const std::string& needle) const {
    std::istringstream in(out.str());
    int n = 0;
    for (std::string l; std::getline(in, l);) n += l.find(needle) != std::string::npos ? 1 : 0;
    return n;
  }
};

// The chain hashes of the full blocks of `tokens` as the engine's prefix cache names them.
std::vector<BlockHash> chain(const Model& m, const std::vector<int32_t>& tokens) {
  std::vector<BlockHash> out;
  BlockHash h = block_hash_root(cache_identity(m));
  for (size_t k = 0; (k + 1) * 128 <= tokens.size(); ++k) {
    h = block_hash(h, std::span<const int32_t>(tokens.data() + k * 128, 128));
    out.push_back(h);
  }
  return out;
}

fs::path file_of(const fs::path& dir, const BlockHash& h, const char* suffix) {
  return dir / fmt::format("{:016x}{:016x}{}", h.hi, h.lo, suffix);
}

std::vector<unsigned char> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void write_bytes(const fs::path& p, const std::vector<unsigned char>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

uint64_t dir_bytes(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.file_size();
  return n;
}

// Fill pool rows [page or snapshot `id`] of every buffer that `kind` covers with values derived from `seed`.
std::vector<float> pattern(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(int(i * 31 + size_t(seed) * 7) % 1000) * 0.25f - 100.0f;
  return v;
}

}  // namespace

TEST(DiskCache, PagesAndSnapshotsRoundTripThroughTheQueueAndTheFiles) {
  auto m = load("demo");
  StatePool pool = m->make_pool({1, 4, 3});
  TempDir dir;
  DiskCacheOptions o;
  o.dir = dir.path;
  o.start_writer = false;
  DiskCache dc(o, pool, 77);
  ASSERT_TRUE(dc.enabled());
  const StateLayout& L = pool.layout();
  // page 0 and snapshot 0 with known rows
  int seed = 1;
  for (int l = 0; l < int(L.layers.size()); ++l) {
    auto& b = pool.layer(l);
    for (Buffer* x : {&b.comp, &b.keys}) {
      if (!*x) continue;
      const size_t per = x->bytes() / 4 / 4;  // 4 pages
      const auto v = pattern(per, seed++);
      std::memcpy(x->as<float>(), v.data(), per * 4);
    }
    for (Buffer* x : {&b.snap_ring, &b.snap_cmp_k, &b.snap_cmp_s, &b.snap_idx_k, &b.snap_idx_s}) {
      if (!*x) continue;
      const size_t per = x->bytes() / 4 / 3;  // 3 snapshots
      const auto v = pattern(per, seed++);
      std::memcpy(x->as<float>(), v.data(), per * 4);
    }
  }
  auto same = [&](int page_a, int page_b, int snap_a, int snap_b) {
    for (int l = 0; l < int(L.layers.size()); ++l) {
      auto& b = pool.layer(l);
      for (Buffer* x : {&b.comp, &b.keys}) {
        if (!*x) continue;
        const size_t per = x->bytes() / 4 / 4;
        if (page_b >= 0 && std::memcmp(x->as<float>() + page_a * per, x->as<float>() + page_b * per, per * 4) != 0)
          return false;
      }
      for (Buffer* x : {&b.snap_ring, &b.snap_cmp_k, &b.snap_cmp_s, &b.snap_idx_k, &b.snap_idx_s}) {
        if (!*x) continue;
        const size_t per = x->bytes() / 4 / 3;
        if (snap_b >= 0 && std::memcmp(x->as<float>() + snap_a * per, x->as<float>() + snap_b * per, per * 4) != 0)
          return false;
      }
    }
    return true;
  };
  const std::vector<int32_t> toks = ids(128, 3, m->n_vocab());
  const BlockHash h{1, 2}, parent{3, 4};
  dc.keep_page(h, parent, toks, 0, false);
  dc.keep_snapshot(h, 0, false);
  EXPECT_TRUE(dc.has_page(h));
  EXPECT_TRUE(dc.has_snapshot(h));
  EXPECT_FALSE(dc.has_page(parent));
  ASSERT_FALSE(same(0, 1, 0, 1));
  // from the queue (nothing written yet)
  EXPECT_EQ(dc.stats().files, 0);
  ASSERT_TRUE(dc.load_page(h, parent, toks, 1));
  ASSERT_TRUE(dc.load_snapshot(h, 1));
  EXPECT_TRUE(same(0, 1, 0, 1));
  // from the files
  while (dc.write_one()) {
  }
  EXPECT_EQ(dc.stats().files, 2);
  EXPECT_TRUE(fs::exists(dc.path_of(h, DiskCache::Kind::page)));
  EXPECT_EQ(fs::file_size(dc.path_of(h, DiskCache::Kind::page)),
            DiskCache::kHeaderBytes + 128 * 4 + L.page_bytes + 8);
  EXPECT_EQ(fs::file_size(dc.path_of(h, DiskCache::Kind::snapshot)), DiskCache::kHeaderBytes + L.snapshot_bytes + 8);
  ASSERT_TRUE(dc.load_page(h, parent, toks, 2));
  ASSERT_TRUE(dc.load_snapshot(h, 2));
  EXPECT_TRUE(same(0, 2, 0, 2));
  // other tokens or another parent under the same name: not used
  std::vector<int32_t> other = toks;
  other[5] ^= 1;
  CaptureLog log;
  EXPECT_FALSE(dc.load_page(h, parent, other, 3));
  EXPECT_EQ(dc.stats().rejected, 1);
  EXPECT_EQ(log.lines_with("other tokens"), 1);
  EXPECT_FALSE(dc.has_page(h));  // deleted
  EXPECT_FALSE(fs::exists(dc.path_of(h, DiskCache::Kind::page)));
}

TEST(DiskCache, QueueDropsCopiesWhenTheWriterIsBehindInsteadOfWaiting) {
  auto m = load("demo");
  StatePool pool = m->make_pool({1, 8, 1});
  TempDir dir;
  const uint64_t file = DiskCache::kHeaderBytes + 128 * 4 + pool.layout().page_bytes;
  DiskCacheOptions o;
  o.dir = dir.path;
  o.start_writer = false;  // a writer that never catches up unless asked
  o.queue_bytes = file * 5 / 2;
  DiskCache dc(o, pool, 77);
  const std::vector<int32_t> toks = ids(128, 3, m->n_vocab());
  for (uint64_t i = 0; i < 6; ++i) dc.keep_page(BlockHash{10, i}, BlockHash{}, toks, int32_t(i), false);
  auto st = dc.stats();
  EXPECT_EQ(st.dropped, 4);
  EXPECT_EQ(st.queued_bytes, 2 * file);
  EXPECT_TRUE(dc.has_page(BlockHash{10, 0}));
  EXPECT_TRUE(dc.has_page(BlockHash{10, 1}));
  EXPECT_FALSE(dc.has_page(BlockHash{10, 2}));
  dc.keep_page(BlockHash{10, 0}, BlockHash{}, toks, 0, false);  // queued already: neither queued again nor dropped
  EXPECT_EQ(dc.stats().dropped, 4);
  ASSERT_TRUE(dc.write_one());
  dc.keep_page(BlockHash{10, 2}, BlockHash{}, toks, 2, false);  // room again
  EXPECT_TRUE(dc.has_page(BlockHash{10, 2}));
  // a waiting keep (shutdown flush) writes instead of dropping
  dc.keep_page(BlockHash{10, 3}, BlockHash{}, toks, 3, true);
  dc.drain();
  st = dc.stats();
  EXPECT_EQ(st.dropped, 4);
  EXPECT_EQ(st.files, 4);
  EXPECT_EQ(st.writes, 4);
  EXPECT_EQ(st.queued_bytes, 0u);
}

TEST(DiskCache, RestartKeepsHitsWithOutputsEqualToColdRuns) {
  for (const char* name : {"tiny-a", "demo"}) {
    auto m = load(name);
    TempDir dir;
    const auto p = ids(300, 1, m->n_vocab());
    const auto want = solo(*m, p, 5);
    const Outcome a = run_once(m, on_disk(dir.path), p, 5);
    EXPECT_EQ(a.cached, 0) << name;
    EXPECT_EQ(a.tokens, want) << name;
    // the shutdown wrote both blocks and their snapshots
    const auto hs = chain(*m, p);
    ASSERT_EQ(hs.size(), 2u);
    for (const auto& h : hs) {
      EXPECT_TRUE(fs::exists(file_of(dir.path, h, ".page"))) << name;
      EXPECT_TRUE(fs::exists(file_of(dir.path, h, ".snap"))) << name;
    }
    // a new loop on the same directory: the whole 256-token prefix comes from the disk
    const Outcome b = run_once(m, on_disk(dir.path), p, 5);
    EXPECT_EQ(b.cached, 256) << name;
    EXPECT_EQ(b.tokens, want) << name;
    EXPECT_EQ(b.stats.disk.pages_loaded, 2) << name;
    EXPECT_EQ(b.stats.disk.snapshots_loaded, 1) << name;
    EXPECT_EQ(b.stats.disk.rejected, 0) << name;
    // a prompt that shares 200 tokens: one block (and the snapshot at 128)
    auto q = std::vector<int32_t>(p.begin(), p.begin() + 200);
    const auto tail = ids(60, 9, m->n_vocab());
    q.insert(q.end(), tail.begin() + 1, tail.end());
    const Outcome c = run_once(m, on_disk(dir.path), q, 5);
    EXPECT_EQ(c.cached, 128) << name;
    EXPECT_EQ(c.tokens, solo(*m, q, 5)) << name;
  }
}

TEST(DiskCache, BlocksEvictedFromASmallPoolAreReadBackFromDisk) {
  auto m = load("demo");
  TempDir dir;
  EngineLoopOptions o = on_disk(dir.path, 1);
  o.n_pages = 4;
  o.n_snapshots = 3;
  EngineLoop loop(m, o);
  const auto x = ids(300, 1, m->n_vocab());
  auto r = loop.submit(greedy_req(x, 4));
  loop.run_until_idle();
  EXPECT_EQ(r->wait().cached_tokens, 0);
  for (int i = 0; i < 3; ++i) {  // other prompts take every page and snapshot: x's blocks are evicted
    auto y = loop.submit(greedy_req(ids(400, 10 + i, m->n_vocab()), 2));
    loop.run_until_idle();
    EXPECT_EQ(y->wait().cached_tokens, 0);
  }
  EXPECT_GT(loop.stats().cache.evicted_pages, 0);
  EXPECT_EQ(loop.stats().disk.pages_loaded, 0);
  r = loop.submit(greedy_req(x, 6));
  loop.run_until_idle();
  const auto res = r->wait();
  EXPECT_EQ(res.cached_tokens, 256);
  EXPECT_EQ(res.tokens, solo(*m, x, 6));
  const auto st = loop.stats();
  EXPECT_EQ(st.disk.pages_loaded, 2);
  EXPECT_EQ(st.disk.snapshots_loaded, 1);
  EXPECT_EQ(st.cache.tier_pages_loaded, 2);
  EXPECT_EQ(st.cache.tier_snapshots_loaded, 1);
}

namespace {

// Outcome p once (its blocks go to disk), damage one file, run p again: the damage is detected and logged once, the
// file deleted, the output equals a cold run with `cached` tokens reused; a third run hits everything again (the
// recomputed state was written back).
void damaged_file_is_recomputed(const char* suffix, int block, const std::function<void(std::vector<unsigned char>&)>& damage,
                                int64_t cached, const std::string& reason) {
  auto m = load("demo");
  TempDir dir;
  const auto p = ids(300, 1, m->n_vocab());
  const auto want = solo(*m, p, 5);
  run_once(m, on_disk(dir.path), p, 5);
  const fs::path f = file_of(dir.path, chain(*m, p)[size_t(block)], suffix);
  auto bytes = read_bytes(f);
  ASSERT_GT(bytes.size(), 100u);
  damage(bytes);
  write_bytes(f, bytes);
  {
    CaptureLog log;
    const Outcome b = run_once(m, on_disk(dir.path), p, 5);
    EXPECT_EQ(b.cached, cached) << reason;
    EXPECT_EQ(b.tokens, want) << reason;
    EXPECT_EQ(b.stats.disk.rejected, 1) << reason;
    EXPECT_EQ(log.lines_with("disk cache"), 1) << log.out.str();
    EXPECT_EQ(log.lines_with(reason), 1) << log.out.str();
    EXPECT_EQ(log.lines_with(f.filename().string()), 1) << log.out.str();
  }
  const Outcome c = run_once(m, on_disk(dir.path), p, 5);
  EXPECT_EQ(c.cached, 256) << reason;
  EXPECT_EQ(c.tokens, want) << reason;
  EXPECT_EQ(c.stats.disk.rejected, 0) << reason;
}

void put_u32(std::vector<unsigned char>& b, size_t off, uint32_t v) { std::memcpy(b.data() + off, &v, 4); }

}  // namespace

TEST(DiskCache, TruncatedFileIsDetectedAndRecomputed) {
  // block 1's page cut in half: block 0 and the snapshot at 128 are still used
  damaged_file_is_recomputed(".page", 1, [](auto& b) { b.resize(b.size() / 2); }, 128, "truncated");
}

TEST(DiskCache, FlippedByteIsDetectedAndRecomputed) {
  // one payload byte of block 0's page: nothing before it, so nothing is reused
  damaged_file_is_recomputed(".page", 0, [](auto& b) { b[b.size() / 2] ^= 0x10; }, 0, "checksum mismatch");
  // one byte of the snapshot at 256 (its checksum field): the snapshot at 128 is used instead
  damaged_file_is_recomputed(".snap", 1, [](auto& b) { b[b.size() - 3] ^= 0x01; }, 128, "checksum mismatch");
}

TEST(DiskCache, WrongVersionIsDetectedAndRecomputed) {
  damaged_file_is_recomputed(".snap", 1, [](auto& b) { put_u32(b, 8, DiskCache::kFormatVersion + 1); }, 128,
                             "format version " + std::to_string(DiskCache::kFormatVersion + 1));
}

TEST(DiskCache, FileOfAnotherModelIsDetectedAndRecomputed) {
  // the identity field rewritten, checksum made valid again: only the identity check can catch it
  damaged_file_is_recomputed(
      ".page", 0,
      [](auto& b) {
        b[16] ^= 0xff;
        const uint64_t sum = xxh64(b.data(), b.size() - 8);
        std::memcpy(b.data() + b.size() - 8, &sum, 8);
      },
      0, "another model");
  // a file that is no cache file at all
  damaged_file_is_recomputed(".page", 0, [](auto& b) { b.assign(200, 'x'); }, 0, "not a dsv4 prefix-cache file");
}

TEST(DiskCache, DirectoryStaysUnderItsSizeLimit) {
  auto m = load("demo");
  TempDir dir;
  const StateLayout L = m->state_layout();  // the engine's pool: compact rows on the CPU in reference numerics
  ASSERT_EQ(L.row_format, RowFormat::compact);
  const uint64_t page_file = DiskCache::kHeaderBytes + 128 * 4 + L.page_bytes + 8;
  const uint64_t snap_file = DiskCache::kHeaderBytes + L.snapshot_bytes + 8;
  EngineLoopOptions o = on_disk(dir.path, 1);
  o.n_pages = 4;
  o.n_snapshots = 2;
  o.cache_size = 3 * page_file + 2 * snap_file;
  std::vector<std::vector<int32_t>> prompts;
  {
    EngineLoop loop(m, o);
    for (int i = 0; i < 8; ++i) {
      prompts.push_back(ids(300, 20 + i, m->n_vocab()));
      auto r = loop.submit(greedy_req(prompts.back(), 2));
      loop.run_until_idle();
      EXPECT_EQ(r->wait().tokens, solo(*m, prompts.back(), 2)) << i;
    }
  }
  EXPECT_LE(dir_bytes(dir.path), o.cache_size);
  EXPECT_GE(dir_bytes(dir.path), page_file);
  // the files carry the pool's compact rows: exactly the compact sizes, below the fp32 layout's
  const StateLayout F = StateLayout::of(m->config());
  int n_files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    const std::string ext = e.path().extension().string();
    if (ext == ".page") EXPECT_EQ(e.file_size(), page_file);
    else if (ext == ".snap") EXPECT_EQ(e.file_size(), snap_file);
    else continue;
    ++n_files;
  }
  EXPECT_GT(n_files, 0);
  EXPECT_LT(L.page_bytes, F.page_bytes);
  EXPECT_LT(L.snapshot_bytes, F.snapshot_bytes);
  // the newest blocks are the ones kept: the last prompt hits, the first does not
  const Outcome last = run_once(m, o, prompts.back(), 2);
  EXPECT_EQ(last.cached, 256);
  EXPECT_EQ(last.tokens, solo(*m, prompts.back(), 2));
  const Outcome first = run_once(m, o, prompts.front(), 2);
  EXPECT_EQ(first.cached, 0);
  EXPECT_LE(dir_bytes(dir.path), o.cache_size);
  // a lower limit on restart deletes the oldest files right away
  EngineLoopOptions smaller = o;
  smaller.cache_size = page_file;
  {
    EngineLoop loop(m, smaller);
    loop.step();  // publishes the stats
    EXPECT_LE(dir_bytes(dir.path), smaller.cache_size);
    EXPECT_GT(loop.stats().disk.evicted, 0);
  }
}

TEST(DiskCache, UnusableDirectoryLogsOnceAndTheEngineKeepsWorking) {
  auto m = load("demo");
  TempDir dir;
  fs::create_directories(dir.path);
  write_bytes(dir.path / "file", {1, 2, 3});
  CaptureLog log;
  const auto p = ids(300, 1, m->n_vocab());
  const Outcome a = run_once(m, on_disk(dir.path / "file" / "sub"), p, 5);
  EXPECT_EQ(a.tokens, solo(*m, p, 5));
  EXPECT_EQ(log.lines_with("disk cache"), 1) << log.out.str();
  EXPECT_EQ(log.lines_with("running without the disk tier"), 1) << log.out.str();
  EXPECT_EQ(a.stats.disk.files, 0);
}

TEST(DiskCache, FailingWritesLogOnceAndTheEngineKeepsWorking) {
  auto m = load("demo");
  TempDir dir;
  const auto p = ids(300, 1, m->n_vocab());
  const auto want = solo(*m, p, 5);
  // files may not grow beyond 4 KiB (a full disk or quota, as far as write() is concerned: EFBIG)
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto prev = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  Outcome a, b;
  {
    CaptureLog log;
    EngineLoopOptions o = on_disk(dir.path, 1);
    o.n_pages = 4;
    o.n_snapshots = 3;
    {
      EngineLoop loop(m, o);
      for (int i = 0; i < 3; ++i) {  // evictions: writes during the run, and the shutdown flush
        auto r = loop.submit(greedy_req(i == 0 ? p : ids(400, 10 + i, m->n_vocab()), 5));
        loop.run_until_idle();
        if (i == 0) a.tokens = r->wait().tokens;
      }
    }
    b = run_once(m, o, p, 5);
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, prev);
    EXPECT_EQ(log.lines_with("disk cache"), 2) << log.out.str();  // one per EngineLoop (two processes' worth)
    EXPECT_EQ(log.lines_with("cannot write"), 2) << log.out.str();
  }
  EXPECT_EQ(a.tokens, want);
  EXPECT_EQ(b.tokens, want);
  EXPECT_EQ(b.cached, 0);
  for (const auto& e : fs::directory_iterator(dir.path)) ADD_FAILURE() << "left behind: " << e.path();
}

TEST(DiskCache, ThreadedLoopsKeepHitsAcrossARestart) {
  auto m = load("demo");
  TempDir dir;
  EngineLoopOptions o = on_disk(dir.path);
  o.start_thread = true;
  const auto p = ids(300, 4, m->n_vocab());
  const auto want = solo(*m, p, 4);
  for (int run = 0; run < 2; ++run) {
    EngineLoop loop(m, o);
    const auto r = loop.submit(greedy_req(p, 4))->wait();
    EXPECT_EQ(r.tokens, want) << run;
    EXPECT_EQ(r.cached_tokens, run == 0 ? 0 : 256) << run;
  }
}
