// RopeCache (model/rope_cache.h) against RopeTable::cos_sin, bitwise: across chunk edges and the cache's bound,
// cold and cached, on the calling thread and on the pool, from several threads at once.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/bitwise_equal.h"
#include "core/error.h"
#include "loader/config.h"
#include "model/rope_cache.h"

namespace dsv4::test {
namespace {

ModelConfig flash() {
  return load_config(std::string(DSV4_SOURCE_DIR) + "/tests/data/configs/deepseek-v4-flash-config.json");
}

// Rows of positions pos from the cache, cold then cached, against RopeTable::cos_sin one position at a time.
void expect_rows(const RopeTable& t, const RopeCache& c, const std::vector<int64_t>& pos, const std::string& what) {
  std::vector<float> want(pos.size() * size_t(t.rd()));
  for (size_t i = 0; i < pos.size(); ++i) t.cos_sin(pos[i], want.data() + i * size_t(t.rd()));
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<float> got(want.size(), -7.0f);
    c.cos_sin(pos, got.data());
    expect_bitwise_equal(got, want, what + (pass ? " (cached)" : " (cold)"));
  }
}

TEST(RopeCache, RowsAreRopeTableRowsBitwise) {
  const ModelConfig cfg = flash();
  for (int ratio : {0, 4}) {
    const RopeTable t = RopeTable::for_ratio(cfg, ratio);
    const int64_t K = RopeCache::kChunk, M = RopeCache::kMaxCached;
    // a short call (the calling thread) over chunk edges, the bound and far beyond it, unordered, repeated
    expect_rows(t, RopeCache(t, cfg.max_position_embeddings),
                {0, 1, K - 1, K, K + 1, 5 * K + 17, M - 1, M, M + 1, 1048575, 3, K, 0, M - 1}, "short call");
    // a long call (on the pool): a prefill chunk across the bound
    std::vector<int64_t> pos(3000);
    std::iota(pos.begin(), pos.end(), M - 1000);
    expect_rows(t, RopeCache(t, cfg.max_position_embeddings), pos, "long call");
    // a smaller bound (the model's max_position_embeddings) and an empty cache (every row computed)
    std::iota(pos.begin(), pos.end(), int64_t(0));
    const RopeCache small(t, 1500);
    EXPECT_EQ(small.cached_limit(), 1500);
    expect_rows(t, small, pos, "bound 1500");
    expect_rows(t, RopeCache(t, 0), pos, "bound 0");
    expect_rows(t, RopeCache(), {}, "default");
  }
}

TEST(RopeCache, ConcurrentFirstUsesGiveTheSameRows) {
  const ModelConfig cfg = flash();
  const RopeTable t = RopeTable::for_ratio(cfg, 4);
  const RopeCache c(t, cfg.max_position_embeddings);
  std::vector<int64_t> pos(4096);
  std::iota(pos.begin(), pos.end(), int64_t(3000));
  std::vector<float> want(pos.size() * 64);
  for (size_t i = 0; i < pos.size(); ++i) t.cos_sin(pos[i], want.data() + i * 64);
  std::vector<std::vector<float>> got(4, std::vector<float>(want.size()));
  std::vector<std::thread> th;
  for (size_t k = 0; k < got.size(); ++k) th.emplace_back([&, k] { c.cos_sin(pos, got[k].data()); });
  for (auto& x : th) x.join();
  for (size_t k = 0; k < got.size(); ++k) expect_bitwise_equal(got[k], want, "thread " + std::to_string(k));
}

TEST(RopeCache, NegativePositionIsAnError) {
  const RopeCache c(RopeTable::for_ratio(flash(), 0), 4096);
  std::vector<float> out(64 * 2);
  const std::vector<int64_t> pos{5, -1};
  EXPECT_THROW(c.cos_sin(pos, out.data()), Error);
}

}  // namespace
}  // namespace dsv4::test
