// The fused ops of the decode step (ops.h: norm_rope_fp8, rope_hadamard_fp4, frontier_update, sparse_attention_rope)
// against the op sequences they stand for on the CPU backend: bitwise equal (tests/gpu/test_ops_fused.cpp and
// test_ops_attention.cpp check the CUDA kernels against the same sequences).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu_backend.h"
#include "format/numeric.h"

namespace dsv4 {
namespace {

const Ops& ops() { return cpu_backend().ops(); }

std::vector<float> randv(size_t n, uint32_t seed, float scale, bool bf16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16 ? round_to_bf16(d(rng)) : d(rng);
  return v;
}

// [n, rd/2, 2] (cos, sin) of angles that differ per row and pair.
std::vector<float> cos_sin(int64_t n, int64_t rd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> a(-3.0f, 3.0f);
  std::vector<float> cs(size_t(n * rd));
  for (int64_t i = 0; i < n * rd / 2; ++i) {
    const float t = a(rng);
    cs[size_t(2 * i)] = std::cos(t);
    cs[size_t(2 * i + 1)] = std::sin(t);
  }
  return cs;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(OpsFused, NormRopeFp8IsRmsnormRopeFp8Sim) {
  // the window KV rows (V4-Flash: 512 wide, 64 rope dims) and odd shapes (a partial FP8 block, no weight)
  struct Case {
    int64_t dim, rd;
    bool weight;
  };
  for (const Case& c : {Case{512, 64, true}, Case{96, 32, true}, Case{200, 8, false}})
    for (int64_t n : {1, 3})
      for (bool bf16 : {false, true}) {
        const auto x = randv(size_t(n * c.dim), 10 + uint32_t(n + c.dim), 3.0f, bf16);
        const auto w = randv(size_t(c.dim), 11, 1.0f, false);
        const auto cs = cos_sin(n, c.rd, 12);
        const float* wp = c.weight ? w.data() : nullptr;
        auto ref = x, got = x;
        ops().rmsnorm(ref.data(), n, c.dim, wp, 1e-6f, bf16, ref.data());
        ops().rope(ref.data(), n, 1, c.dim, c.rd, cs.data(), false, bf16);
        if (bf16) ops().fp8_sim(ref.data(), n, c.dim, c.dim - c.rd, 64);
        ops().norm_rope_fp8(got.data(), n, c.dim, wp, 1e-6f, c.rd, cs.data(), bf16);
        EXPECT_TRUE(same_bits(ref, got)) << "dim " << c.dim << " n " << n << " bf16 " << bf16;
        EXPECT_FALSE(same_bits(x, got));  // (it did something)
        // with the ring update: the rows (in reverse order) to rows 2r + 1 of a store, the rest untouched
        std::vector<int32_t> src(static_cast<size_t>(n)), dst(static_cast<size_t>(n));
        for (int64_t r = 0; r < n; ++r) src[size_t(r)] = int32_t(n - 1 - r), dst[size_t(r)] = int32_t(2 * r + 1);
        const auto store0 = randv(size_t(2 * n * c.dim), 13, 1.0f, false);
        auto ref_store = store0, got_store = store0;
        ops().scatter_rows(ref.data(), src.data(), ref_store.data(), dst.data(), n, c.dim);
        auto got2 = x;
        ops().norm_rope_fp8(got2.data(), n, c.dim, wp, 1e-6f, c.rd, cs.data(), bf16, src.data(), got_store.data(),
                            dst.data(), n);
        EXPECT_TRUE(same_bits(ref, got2));
        EXPECT_TRUE(same_bits(ref_store, got_store));
        EXPECT_FALSE(same_bits(store0, got_store));
      }
}

TEST(OpsFused, RopeHadamardFp4IsRopeHadamardFp4Sim) {
  // the indexer's query heads (V4-Flash: 64 heads x 128, 64 rope dims) and its compressed keys (one head)
  for (int64_t heads : {1, 3})
    for (int64_t n : {1, 2}) {
      const int64_t dim = 128, rd = 64;
      const auto x = randv(size_t(n * heads * dim), 20 + uint32_t(n * heads), 2.0f, true);
      const auto cs = cos_sin(n, rd, 21);
      auto ref = x, got = x;
      ops().rope(ref.data(), n, heads, dim, rd, cs.data(), false, true);
      ops().hadamard(ref.data(), n * heads, dim, true);
      ops().fp4_sim(ref.data(), n * heads, dim);
      ops().rope_hadamard_fp4(got.data(), n, heads, dim, rd, cs.data());
      EXPECT_TRUE(same_bits(ref, got)) << "heads " << heads << " n " << n;
      EXPECT_FALSE(same_bits(x, got));
    }
}

TEST(OpsFused, SparseAttentionRopeIsAttentionThenRope) {
  // 2 tokens x 3 heads x 32 dims over 4 ring rows + the 2 fresh rows + 3 compressed rows, 8 rope dims
  const int64_t n = 2, H = 3, D = 32, rd = 8, n_ring = 4, n_comp = 3;
  for (bool bf16 : {false, true}) {
    const auto q = randv(size_t(n * H * D), 40, 1.0f, bf16), ring = randv(size_t(n_ring * D), 41, 1.0f, bf16);
    const auto fresh = randv(size_t(n * D), 42, 1.0f, bf16), comp = randv(size_t(n_comp * D), 43, 1.0f, bf16);
    const auto sink = randv(size_t(H), 44, 1.0f, false);
    const auto cs = cos_sin(n, rd, 45);
    const std::vector<int32_t> win{1, 2, 3, 4, -1, 2, 3, 4, 5, -1};  // [n, 5]: ring rows, then fresh (4 + t)
    const std::vector<int32_t> cidx{0, 2, -1, 1};                      // [n, 2]
    KvRows kv{ring.data(), n_ring, fresh.data(), n, comp.data(), n_comp, D};
    std::vector<float> ref(size_t(n * H * D)), got(ref.size(), -1.0f);
    ops().sparse_attention(q.data(), n, H, kv, win.data(), 5, cidx.data(), 2, sink.data(), 0.2f, bf16, ref.data());
    ops().rope(ref.data(), n, H, D, rd, cs.data(), true, bf16);
    ops().sparse_attention_rope(q.data(), n, H, kv, win.data(), 5, cidx.data(), 2, sink.data(), 0.2f, bf16, rd,
                                cs.data(), got.data());
    EXPECT_TRUE(same_bits(ref, got)) << "bf16 " << bf16;
  }
}

// A frontier update whose sources include rows it overwrites, in both orders (a destination written before it is
// read as a source, and after), with and without the ape add: equal to add_rows + gather + scatter.
TEST(OpsFused, FrontierUpdateIsGatherThenScatter) {
  const int64_t n_tok = 2, dim = 12, n_state = 16, n_ape = 4;
  const auto kv = randv(size_t(n_tok * dim), 30, 1.0f, false);
  const auto score = randv(size_t(n_tok * dim), 31, 1.0f, false);
  const auto sk = randv(size_t(n_state * dim), 32, 1.0f, false);
  const auto ss = randv(size_t(n_state * dim), 33, 1.0f, false);
  const auto ape = randv(size_t(n_ape * dim), 34, 1.0f, false);
  const std::vector<int32_t> ape_row{3, 1};
  // state index space: j < n_tok = step row j, else state row j - n_tok
  const std::vector<int32_t> idx{0, int32_t(n_tok + 4), int32_t(n_tok + 5), 1, int32_t(n_tok + 0)};
  const std::vector<int32_t> dst{4, 0, 1, 5, 9};
  const int64_t n = int64_t(idx.size());
  std::vector<int32_t> iota(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) iota[size_t(i)] = int32_t(i);
  for (bool with_ape : {false, true}) {
    auto rs = score, rk_state = sk, rs_state = ss;
    if (with_ape) ops().add_rows(rs.data(), n_tok, dim, ape.data(), ape_row.data());
    std::vector<float> tk(size_t(n * dim)), ts(size_t(n * dim));
    ops().gather_rows(kv.data(), n_tok, rk_state.data(), idx.data(), n, dim, tk.data());
    ops().gather_rows(rs.data(), n_tok, rs_state.data(), idx.data(), n, dim, ts.data());
    ops().scatter_rows(tk.data(), iota.data(), rk_state.data(), dst.data(), n, dim);
    ops().scatter_rows(ts.data(), iota.data(), rs_state.data(), dst.data(), n, dim);

    auto gs = score, gk_state = sk, gs_state = ss;
    ops().frontier_update(kv.data(), gs.data(), n_tok, with_ape ? ape.data() : nullptr, ape_row.data(),
                          gk_state.data(), gs_state.data(), idx.data(), dst.data(), n, dim);
    EXPECT_TRUE(same_bits(rk_state, gk_state)) << "with_ape " << with_ape;
    EXPECT_TRUE(same_bits(rs_state, gs_state)) << "with_ape " << with_ape;
    EXPECT_TRUE(same_bits(rs, gs)) << "with_ape " << with_ape;  // score itself: + ape exactly when asked
    // the old row 4 reached row 0 (read before row 4 was overwritten by step row 0)
    EXPECT_EQ(0, std::memcmp(gk_state.data(), sk.data() + 4 * dim, size_t(dim) * 4));
    EXPECT_EQ(0, std::memcmp(gk_state.data() + 4 * dim, kv.data(), size_t(dim) * 4));
  }
}

}  // namespace
}  // namespace dsv4
