// Cache identity of a model (cache_identity.h).
#include "engine/cache_identity.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "engine/disk_cache.h"
#include "model/state_layout.h"

namespace dsv4 {

namespace {

namespace fs = std::filesystem;

struct Chain {
  uint64_t h = 0x6473763443414348ull;  // "dsv4CACH"
  void add(const void* p, size_t n) { h = xxh64(p, n, h); }
  void add(const std::string& s) { add(s.data(), s.size()); }
  template <class T> void add_value(T v) { add(&v, sizeof v); }
};

// `n` bytes at `off` of an open file (fewer at the end).
void add_range(Chain& c, std::ifstream& f, uint64_t off, uint64_t n) {
  std::vector<char> buf(static_cast<size_t>(n));
  f.clear();
  f.seekg(std::streamoff(off));
  f.read(buf.data(), std::streamsize(n));
  c.add(buf.data(), size_t(f.gcount()));
}

void add_checkpoint(Chain& c, const fs::path& config_json) {
  std::error_code ec;
  if (!fs::is_regular_file(config_json, ec)) return;
  {
    std::ifstream f(config_json, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    c.add(text);
  }
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(config_json.parent_path(), ec))
    if (e.path().extension() == ".safetensors" && e.is_regular_file(ec)) shards.push_back(e.path());
  std::sort(shards.begin(), shards.end());
  for (const fs::path& p : shards) {
    const uint64_t size = fs::file_size(p, ec);
    c.add(p.filename().string());
    c.add_value(size);
    std::ifstream f(p, std::ios::binary);
    if (!f) continue;
    add_range(c, f, 0, std::min<uint64_t>(size, 64 << 10));
    if (size > (64 << 10)) {
      add_range(c, f, size / 2, std::min<uint64_t>(4096, size - size / 2));
      add_range(c, f, size - std::min<uint64_t>(size, 4096), std::min<uint64_t>(size, 4096));
    }
  }
}

}  // namespace

uint64_t cache_identity(const Model& m) {
  Chain c;
  const ModelConfig& cfg = m.config();
  c.add(cfg.model_type);
  c.add_value(cfg.vocab_size);
  c.add_value(cfg.hidden_size);
  c.add_value(cfg.num_hidden_layers);
  c.add_value(cfg.head_dim);
  c.add_value(cfg.sliding_window);
  for (int r : cfg.compress_ratios) c.add_value(r);
  add_checkpoint(c, fs::path(cfg.origin));
  c.add_value(int(m.numerics()));
  const StateLayout L = m.state_layout();
  c.add_value(StateLayout::kVersion);
  c.add(row_format_name(L.row_format));
  c.add_value(L.window);
  c.add_value(L.head_dim);
  c.add_value(L.index_head_dim);
  for (const StateLayout::Layer& ly : L.layers) {
    c.add_value(ly.ratio);
    c.add_value(ly.coff);
    c.add_value(ly.rows_per_page);
    c.add_value(ly.indexer);
  }
  c.add_value(int(m.backend().device().kind));
  // files of another disk format get other names: never looked up, aged out by the size bound (instead of one
  // rejection warning per file after an upgrade)
  c.add_value(DiskCache::kFormatVersion);
  return c.h;
}

}  // namespace dsv4
