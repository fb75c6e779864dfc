// The CPU ops over compact state rows (format/row_format.h, ops.h KvRows::stored / PagedRows::stored): rows the
// reference simulation produces (fp8_sim / hadamard + fp4_sim, bf16 rope part) encode exactly, and sparse attention
// and the indexer read compact rows with results bitwise equal to reading the fp32 rows, at several thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu_backend.h"
#include "core/error.h"
#include "format/numeric.h"
#include "format/row_format.h"

namespace dsv4 {
namespace {

const Ops& ops() { return cpu_backend().ops(); }

// Rows as the model writes them in reference numerics: bf16 values (norm + rope outputs), nope part FP8-simulated.
std::vector<float> simulated_kv(int64_t n, int64_t dim, int64_t rope, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(size_t(n * dim));
  for (int64_t r = 0; r < n; ++r) {
    // magnitudes from 1e-7 (below the simulation's 1e-4 amax floor) to 1e6, one per row
    const float mag = std::pow(10.0f, float(int(r % 14) - 7));
    std::normal_distribution<float> d(0.0f, mag);
    for (int64_t i = 0; i < dim; ++i) x[size_t(r * dim + i)] = round_to_bf16(d(rng));
    if (r % 5 == 0) x[size_t(r * dim + 3)] = -0.0f;
  }
  ops().fp8_sim(x.data(), n, dim, dim - rope, 64);
  return x;
}

std::vector<float> simulated_keys(int64_t n, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(size_t(n * dim));
  for (int64_t r = 0; r < n; ++r) {
    const float mag = std::pow(10.0f, float(int(r % 12) - 6));
    std::normal_distribution<float> d(0.0f, mag);
    for (int64_t i = 0; i < dim; ++i) x[size_t(r * dim + i)] = round_to_bf16(d(rng));
  }
  ops().hadamard(x.data(), n, dim, true);
  ops().fp4_sim(x.data(), n, dim);
  return x;
}

std::vector<float> decoded(const RowCodec& c, const std::vector<float>& st, int64_t n) {
  std::vector<float> y(size_t(n * c.dim));
  for (int64_t r = 0; r < n; ++r) decode_row(c, st.data() + r * c.words(), y.data() + r * c.dim);
  return y;
}

TEST(CompactRows, SimulatedRowsEncodeExactly) {
  for (auto [dim, rope] : {std::pair<int64_t, int64_t>{512, 64}, {128, 64}}) {
    const RowCodec c = RowCodec::kv_fp8(dim, rope);
    const int64_t n = 300;
    const std::vector<float> x = simulated_kv(n, dim, rope, uint32_t(dim));
    std::vector<float> st(size_t(n * c.words()));
    ops().encode_rows(x.data(), n, c, st.data());
    const std::vector<float> y = decoded(c, st, n);
    ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << "dim " << dim;
    for (int64_t r = 0; r < n; ++r) EXPECT_TRUE(encode_row(c, x.data() + r * dim, st.data())) << r;
  }
  const RowCodec k = RowCodec::key_fp4(128);
  const int64_t n = 300;
  const std::vector<float> x = simulated_keys(n, 128, 3);
  std::vector<float> st(size_t(n * k.words()));
  ops().encode_rows(x.data(), n, k, st.data());
  const std::vector<float> y = decoded(k, st, n);
  ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0);
}

TEST(CompactRows, UnsimulatedRowsAreNotExact) {
  const RowCodec c = RowCodec::kv_fp8(128, 64);
  std::mt19937 rng(1);
  std::normal_distribution<float> d;
  std::vector<float> x(128);
  for (float& v : x) v = d(rng);  // fp32, not FP8-simulated
  std::vector<float> st(size_t(c.words()));
  EXPECT_FALSE(encode_row(c, x.data(), st.data()));
}

// sparse_attention over compact rows equals it over the fp32 rows, bitwise, for 1-3 threads. `local`: each token's
// candidates drawn from a window that slides with the token (rows shared by consecutive tokens, as in a prefill).
void check_sparse_attention_compact(int64_t dim, int64_t rope, int64_t H, int64_t n, int64_t n_ring, int64_t n_comp,
                                    int64_t KW, int64_t KC, bool local) {
  const RowCodec c = RowCodec::kv_fp8(dim, rope);
  const std::vector<float> ring = simulated_kv(n_ring, dim, rope, 11), comp = simulated_kv(n_comp, dim, rope, 12),
                           fresh = simulated_kv(n, dim, rope, 13);
  std::vector<float> ring_c(size_t(n_ring * c.words())), comp_c(size_t(n_comp * c.words()));
  ops().encode_rows(ring.data(), n_ring, c, ring_c.data());
  ops().encode_rows(comp.data(), n_comp, c, comp_c.data());
  std::mt19937 rng(14);
  std::vector<float> q(size_t(n * H * dim));
  std::normal_distribution<float> d(0.0f, 0.05f);
  for (float& v : q) v = round_to_bf16(d(rng));
  std::vector<int32_t> widx(size_t(n * KW)), cidx(size_t(n * KC));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < KW; ++j)
      widx[size_t(t * KW + j)] = rng() % 7 == 0 ? -1
                                 : local         ? int32_t((t * 3 + rng() % KW) % (n_ring + n))
                                                 : int32_t(rng() % (n_ring + n));
    for (int64_t j = 0; j < KC; ++j)
      cidx[size_t(t * KC + j)] = rng() % 5 == 0 ? -1
                                 : local         ? int32_t((t * 2 + rng() % KC) % n_comp)
                                                 : int32_t(rng() % n_comp);
  }
  std::vector<float> sink(size_t(H), 0.25f);
  const KvRows f32{ring.data(), n_ring, fresh.data(), n, comp.data(), n_comp, dim};
  const KvRows packed{ring_c.data(), n_ring, fresh.data(), n, comp_c.data(), n_comp, dim, c};
  for (bool bf : {true, false}) {
    std::vector<float> a(size_t(n * H * dim)), b(a.size());
    ops().sparse_attention(q.data(), n, H, f32, widx.data(), KW, cidx.data(), KC, sink.data(), 0.04f, bf, a.data());
    const int saved = omp_get_max_threads();
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::fill(b.begin(), b.end(), -1.0f);
      ops().sparse_attention(q.data(), n, H, packed, widx.data(), KW, cidx.data(), KC, sink.data(), 0.04f, bf,
                             b.data());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "bf16 " << bf << " threads " << threads;
    }
    omp_set_num_threads(saved);
    float amax = 0;
    for (float v : a) amax = std::max(amax, std::fabs(v));
    EXPECT_GT(amax, 0.0f);  // the comparison is not between two zero outputs
  }
}

TEST(CompactRows, SparseAttentionReadsCompactRowsBitwise) {
  check_sparse_attention_compact(512, 64, 8, 5, 40, 70, 48, 64, false);
}

// Row ids far above the candidate count (the decoded-row cache's slots collide within a token) and rows shared
// between consecutive tokens (cache hits), with duplicates.
TEST(CompactRows, SparseAttentionCompactRowCacheCollisions) {
  check_sparse_attention_compact(128, 64, 4, 40, 500, 300, 16, 16, false);
  check_sparse_attention_compact(128, 64, 4, 40, 500, 300, 16, 16, true);
}

TEST(CompactRows, IndexerReadsCompactKeysBitwise) {
  const int64_t dim = 128, H = 4, n = 6, pr = 8, n_pages = 5;
  const RowCodec c = RowCodec::key_fp4(dim);
  const std::vector<float> keys = simulated_keys(n_pages * pr, dim, 21);
  std::vector<float> keys_c(size_t(n_pages * pr * c.words()));
  ops().encode_rows(keys.data(), n_pages * pr, c, keys_c.data());
  std::mt19937 rng(22);
  std::normal_distribution<float> d;
  std::vector<float> q(size_t(n * H * dim)), w(size_t(n * H));
  for (float& v : q) v = round_to_bf16(d(rng));
  for (float& v : w) v = round_to_bf16(d(rng));
  const std::vector<int32_t> pages{4, 0, 2, 1, 3}, table{0, 0, 0, 2, 2, 2};
  const std::vector<int32_t> nv{40, 17, 1, 24, 9, 0};
  PagedRows a;
  a.rows = keys.data();
  a.pages = pages.data();
  a.table = table.data();
  a.page_rows = pr;
  PagedRows b = a;
  b.rows = keys_c.data();
  b.stored = c;
  for (bool bf : {true, false}) {
    std::vector<int32_t> sa(size_t(n * 10)), sb(sa.size());
    ops().indexer_topk(q.data(), n, H, dim, a, nv.data(), 40, w.data(), 10, bf, sa.data());
    ops().indexer_topk(q.data(), n, H, dim, b, nv.data(), 40, w.data(), 10, bf, sb.data());
    EXPECT_EQ(sa, sb) << "bf16 " << bf;
    EXPECT_NE(sa[0], -1);
  }
}

#ifndef NDEBUG
TEST(CompactRows, DebugBuildsRefuseInexactRows) {
  const RowCodec c = RowCodec::key_fp4(128);
  std::vector<float> x(128, 0.3f), st(size_t(c.words()));
  EXPECT_THROW(ops().encode_rows(x.data(), 1, c, st.data()), Error);
}
#endif

}  // namespace
}  // namespace dsv4
