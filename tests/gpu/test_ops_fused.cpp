// CUDA: the fused ops of the decode step (src/backend/cuda/k_fused.cu: norm_rope_fp8, rope_hadamard_fp4,
// frontier_update) against the CUDA op sequences they stand for, bitwise (every element's bits), at V4-Flash decode
// shapes (the one-kernel paths) and at shapes that take the fallbacks; rope_hadamard_fp4 and frontier_update also
// bitwise against the CPU backend (their parts are bitwise there; rmsnorm's sum order differs from the CPU's, so
// norm_rope_fp8 is compared with the CUDA sequence only). One printed line per check.
#include <cstring>
#include <random>

#include "gpu_test_util.h"

namespace dsv4::test::gpu {
namespace {
namespace fz {

const Ops& cops() { return cpu().ops(); }
const Ops& gops() { return cuda()->ops(); }
Backend& dev() { return *cuda(); }

// [n, rd/2, 2] (cos, sin) of random positions.
std::vector<float> cos_sin(int64_t n, int64_t rd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pos(0, 100000);
  std::vector<float> cs(size_t(n * rd));
  for (int64_t t = 0; t < n; ++t) {
    const int p = pos(rng);
    for (int64_t i = 0; i < rd / 2; ++i) {
      const float a = float(double(p) * std::pow(10000.0, -2.0 * double(i) / double(rd)));
      cs[size_t(t * rd + 2 * i)] = std::cos(a);
      cs[size_t(t * rd + 2 * i + 1)] = std::sin(a);
    }
  }
  return cs;
}

void expect_same(const char* op, const std::string& shape, const std::vector<float>& ref,
                 const std::vector<float>& got) {
  size_t nd = 0;
  for (size_t i = 0; i < std::min(ref.size(), got.size()); ++i) nd += std::memcmp(&ref[i], &got[i], 4) != 0;
  const bool ok = nd == 0 && ref.size() == got.size();
  std::printf("[%s] %s: bitwise, %zu/%zu elements differ %s\n", op, shape.c_str(), nd, ref.size(), ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_TRUE(ok) << op << " " << shape << ": " << nd << " elements differ";
}

template <class F>
std::vector<float> on_gpu(const std::vector<float>& x, F&& f) {
  Buffer b = to_device(dev(), x);
  f(b.as<float>());
  return to_host<float>(dev(), b, x.size());
}

}  // namespace fz
using namespace fz;

TEST(GpuOpsFused, NormRopeFp8IsRmsnormRopeFp8Sim) {
  DSV4_REQUIRE_GPU();
  struct Case {
    int64_t dim, rd;
    const char* what;
  };
  // window KV rows (one kernel); a row wider than a warp's 1024 floats and an odd width (the three kernels)
  const Case cases[] = {{512, 64, "kv rows"}, {2048, 64, "wide: fallback"}, {198, 8, "odd: fallback"}};
  for (const Case& c : cases)
    for (int64_t n : {int64_t(1), int64_t(8), int64_t(300)})
      for (bool bf16 : {false, true}) {
        const auto x = randn(size_t(n * c.dim), 100 + uint32_t(n + c.dim), 3.0f, bf16);
        const auto w = randn(size_t(c.dim), 101, 1.0f, false);
        Buffer dw = to_device(dev(), w), dcs = to_device(dev(), cos_sin(n, c.rd, 102 + uint32_t(n)));
        const auto seq = on_gpu(x, [&](float* p) {
          gops().rmsnorm(p, n, c.dim, dw.as<float>(), 1e-6f, bf16, p);
          gops().rope(p, n, 1, c.dim, c.rd, dcs.as<float>(), false, bf16);
          if (bf16) gops().fp8_sim(p, n, c.dim, c.dim - c.rd, 64);
        });
        const auto one = on_gpu(x, [&](float* p) {
          gops().norm_rope_fp8(p, n, c.dim, dw.as<float>(), 1e-6f, c.rd, dcs.as<float>(), bf16);
        });
        const std::string shape = strf("n=%lld dim=%lld rd=%lld %s (%s)", (long long)n, (long long)c.dim,
                                       (long long)c.rd, bf16 ? "reference" : "dense", c.what);
        expect_same("norm_rope_fp8", shape + " vs rmsnorm + rope + fp8_sim", seq, one);
        // with the ring update (rows in reverse order to rows 2r + 1 of a store: inside the kernel for <= 64 rows)
        std::vector<int32_t> src(static_cast<size_t>(n)), dst(static_cast<size_t>(n));
        for (int64_t r = 0; r < n; ++r) src[size_t(r)] = int32_t(n - 1 - r), dst[size_t(r)] = int32_t(2 * r + 1);
        Buffer dsrc = to_device(dev(), src), ddst = to_device(dev(), dst);
        const auto store0 = randn(size_t(2 * n * c.dim), 103, 1.0f);
        Buffer st1 = to_device(dev(), store0), st2 = to_device(dev(), store0);
        const auto seq_s = on_gpu(seq, [&](float* p) {
          gops().scatter_rows(p, dsrc.as<int32_t>(), st1.as<float>(), ddst.as<int32_t>(), n, c.dim);
        });
        const auto one_s = on_gpu(x, [&](float* p) {
          gops().norm_rope_fp8(p, n, c.dim, dw.as<float>(), 1e-6f, c.rd, dcs.as<float>(), bf16, dsrc.as<int32_t>(),
                               st2.as<float>(), ddst.as<int32_t>(), n);
        });
        expect_same("norm_rope_fp8", shape + " + store vs the ops + scatter_rows: rows", seq_s, one_s);
        expect_same("norm_rope_fp8", shape + " + store vs the ops + scatter_rows: store",
                    to_host<float>(dev(), st1, store0.size()), to_host<float>(dev(), st2, store0.size()));
      }
}

TEST(GpuOpsFused, RopeHadamardFp4IsRopeHadamardFp4Sim) {
  DSV4_REQUIRE_GPU();
  struct Case {
    int64_t heads, dim, rd;
  };
  // indexer queries (64 x 128) and keys (1 x 128): one kernel; 32-wide heads: the three kernels
  const Case cases[] = {{64, 128, 64}, {1, 128, 64}, {4, 32, 16}};
  for (const Case& c : cases)
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(300)}) {
      const auto x = randn(size_t(n * c.heads * c.dim), 110 + uint32_t(n + c.heads), 2.0f, true);
      const auto cs = cos_sin(n, c.rd, 111 + uint32_t(n));
      Buffer dcs = to_device(dev(), cs);
      const auto seq = on_gpu(x, [&](float* p) {
        gops().rope(p, n, c.heads, c.dim, c.rd, dcs.as<float>(), false, true);
        gops().hadamard(p, n * c.heads, c.dim, true);
        gops().fp4_sim(p, n * c.heads, c.dim);
      });
      const auto one =
          on_gpu(x, [&](float* p) { gops().rope_hadamard_fp4(p, n, c.heads, c.dim, c.rd, dcs.as<float>()); });
      auto ref = x;
      cops().rope_hadamard_fp4(ref.data(), n, c.heads, c.dim, c.rd, cs.data());
      const std::string shape =
          strf("n=%lld heads=%lld dim=%lld rd=%lld", (long long)n, (long long)c.heads, (long long)c.dim, (long long)c.rd);
      expect_same("rope_hadamard_fp4", shape + " vs rope + hadamard + fp4_sim (CUDA)", seq, one);
      expect_same("rope_hadamard_fp4", shape + " vs the CPU", ref, one);
    }
}

// Frontier updates as a decode step makes them (a window completing: rows shift inside the frontier while the step's
// row lands) for 1 and 8 sequences, and a prefill-sized one (fallback), with and without the ape add; state rows of
// V4-Flash widths (attention compressor 2 x 512, indexer 2 x 128, HCA 512).
TEST(GpuOpsFused, FrontierUpdateIsGatherThenScatter) {
  DSV4_REQUIRE_GPU();
  struct Case {
    int64_t n_tok, nr, dim, n_upd;  // n_upd rows per sequence (one sequence per step row, n_tok sequences)
  };
  const Case cases[] = {{1, 8, 1024, 4}, {8, 8, 256, 4}, {1, 128, 512, 1}, {3, 8, 1024, 8}, {5, 8, 64, 8},
                        {40, 8, 100, 8}};  // (the last two: more than 32 rows, the fallback)
  for (const Case& c : cases)
    for (bool with_ape : {false, true}) {
      const int64_t n_state = c.n_tok * c.nr, n_ape = 4;
      const auto kv = randn(size_t(c.n_tok * c.dim), 120, 1.0f), score = randn(size_t(c.n_tok * c.dim), 121, 1.0f);
      const auto sk = randn(size_t(n_state * c.dim), 122, 1.0f), ss = randn(size_t(n_state * c.dim), 123, 1.0f);
      const auto ape = randn(size_t(n_ape * c.dim), 124, 1.0f);
      std::vector<int32_t> ape_row(size_t(c.n_tok)), idx, dst;
      for (int64_t t = 0; t < c.n_tok; ++t) {
        ape_row[size_t(t)] = int32_t((t * 3 + 1) % n_ape);
        // sequence t: row j < n_upd - 1 of its frontier takes old row j + half (a shift), the last changed row the
        // step's row t (it overwrites a row the shift reads)
        const int64_t base = t * c.nr, half = c.nr / 2;
        for (int64_t j = 0; j + 1 < c.n_upd; ++j) {
          idx.push_back(int32_t(c.n_tok + base + (j + half) % c.nr));
          dst.push_back(int32_t(base + j));
        }
        idx.push_back(int32_t(t));
        dst.push_back(int32_t(base + (c.n_upd - 1 <= half ? half : c.n_upd - 1)));
      }
      const int64_t n = int64_t(idx.size());
      std::vector<int32_t> iota(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) iota[size_t(i)] = int32_t(i);
      Buffer d_kv = to_device(dev(), kv), d_ape = to_device(dev(), ape), d_row = to_device(dev(), ape_row);
      Buffer d_idx = to_device(dev(), idx), d_dst = to_device(dev(), dst), d_iota = to_device(dev(), iota);
      // the sequence on CUDA
      Buffer s1 = to_device(dev(), score), k1 = to_device(dev(), sk), q1 = to_device(dev(), ss);
      Buffer tk = out_buffer<float>(dev(), size_t(n * c.dim)), ts = out_buffer<float>(dev(), size_t(n * c.dim));
      if (with_ape) gops().add_rows(s1.as<float>(), c.n_tok, c.dim, d_ape.as<float>(), d_row.as<int32_t>());
      gops().gather_rows(d_kv.as<float>(), c.n_tok, k1.as<float>(), d_idx.as<int32_t>(), n, c.dim, tk.as<float>());
      gops().gather_rows(s1.as<float>(), c.n_tok, q1.as<float>(), d_idx.as<int32_t>(), n, c.dim, ts.as<float>());
      gops().scatter_rows(tk.as<float>(), d_iota.as<int32_t>(), k1.as<float>(), d_dst.as<int32_t>(), n, c.dim);
      gops().scatter_rows(ts.as<float>(), d_iota.as<int32_t>(), q1.as<float>(), d_dst.as<int32_t>(), n, c.dim);
      // the fused op on CUDA
      Buffer s2 = to_device(dev(), score), k2 = to_device(dev(), sk), q2 = to_device(dev(), ss);
      gops().frontier_update(d_kv.as<float>(), s2.as<float>(), c.n_tok, with_ape ? d_ape.as<float>() : nullptr,
                             d_row.as<int32_t>(), k2.as<float>(), q2.as<float>(), d_idx.as<int32_t>(),
                             d_dst.as<int32_t>(), n, c.dim);
      // the fused op on the CPU
      auto s3 = score, k3 = sk, q3 = ss;
      cops().frontier_update(kv.data(), s3.data(), c.n_tok, with_ape ? ape.data() : nullptr, ape_row.data(),
                             k3.data(), q3.data(), idx.data(), dst.data(), n, c.dim);
      const std::string shape = strf("n_tok=%lld rows=%lld dim=%lld %s", (long long)c.n_tok, (long long)n,
                                     (long long)c.dim, with_ape ? "+ ape" : "no ape");
      const size_t ns = size_t(n_state * c.dim), nt = size_t(c.n_tok * c.dim);
      expect_same("frontier_update", shape + ": state kv vs gather + scatter",
                  to_host<float>(dev(), k1, ns), to_host<float>(dev(), k2, ns));
      expect_same("frontier_update", shape + ": state score vs gather + scatter",
                  to_host<float>(dev(), q1, ns), to_host<float>(dev(), q2, ns));
      expect_same("frontier_update", shape + ": score vs add_rows",
                  to_host<float>(dev(), s1, nt), to_host<float>(dev(), s2, nt));
      expect_same("frontier_update", shape + ": state kv vs the CPU", k3, to_host<float>(dev(), k2, ns));
      expect_same("frontier_update", shape + ": state score vs the CPU", q3, to_host<float>(dev(), q2, ns));
    }
}

}  // namespace
}  // namespace dsv4::test::gpu
