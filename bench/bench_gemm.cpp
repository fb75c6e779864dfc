// GEMM kernel throughput on V4-Flash shapes with random weights in the official formats.
//   Gemv/<fmt>/<threads>: decode (1 token); bytes/s = weight bytes streamed (several weight copies are cycled so they
//                         come from memory, not the caches).
//   Gemm/<fmt>/<n_tok>:   prefill-shaped product on all threads; items/s = tokens, plus GFLOP/s.
// Weights: fp4 = routed expert w1 [2048, 4096] (I8 packed E2M1 + E8M0 per 32); fp8 = shared w1 [2048, 4096]
// (E4M3 + E8M0 128x128); bf16 = [4096, 4096] (the lm head's format). Reference numerics (act_quant + bf16 out) for
// fp8/fp4, fp32 dense for bf16. Per-core rates: run with Gemv/.../1 and look at the CPU-time based bytes/s.
// Usage: bench_gemm [google-benchmark flags], e.g. --benchmark_filter=Gemv
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "backend/gemm.h"
#include "format/numeric.h"

namespace {

using dsv4::GemmFormat;
using dsv4::GemmWeight;

struct Bank {  // n_copies independent weights of one shape
  std::vector<std::vector<uint8_t>> w, s;
  std::vector<GemmWeight> g;
  size_t bytes_each = 0;
};

Bank make_bank(GemmFormat fmt, int64_t rows, int64_t cols, int copies) {
  Bank b;
  std::mt19937_64 rng(rows * 31 + cols);
  for (int c = 0; c < copies; ++c) {
    std::vector<uint8_t> w, s;
    size_t wb = 0, sb = 0;
    switch (fmt) {
      case GemmFormat::fp4: wb = rows * cols / 2, sb = rows * (cols / 32); break;
      case GemmFormat::fp8: wb = rows * cols, sb = ((rows + 127) / 128) * ((cols + 127) / 128); break;
      case GemmFormat::bf16: wb = 2 * rows * cols; break;
      case GemmFormat::f32: wb = 4 * rows * cols; break;
    }
    w.resize(wb);
    for (size_t i = 0; i < wb; i += 8) {
      const uint64_t v = rng();
      std::memcpy(&w[i], &v, std::min<size_t>(8, wb - i));
    }
    if (fmt == GemmFormat::fp8)
      for (auto& x : w)
        if ((x & 0x7F) == 0x7F) x ^= 1;
    if (fmt == GemmFormat::bf16)
      for (size_t i = 1; i < wb; i += 2) w[i] = static_cast<uint8_t>((w[i] & 0x80) | 0x3C);
    s.resize(sb);
    for (size_t i = 0; i < sb; ++i) s[i] = static_cast<uint8_t>(118 + i % 7);
    b.w.push_back(std::move(w));
    b.s.push_back(std::move(s));
    b.bytes_each = wb + sb;
  }
  for (int c = 0; c < copies; ++c)
    b.g.push_back(GemmWeight{fmt, b.w[c].data(), b.s[c].empty() ? nullptr : b.s[c].data(), false, rows, cols,
                             fmt == GemmFormat::fp4 ? 1 : 128, fmt == GemmFormat::fp4 ? 32 : 128});
  return b;
}

dsv4::LinearOpts opts_for(GemmFormat f) {
  return f == GemmFormat::bf16 ? dsv4::LinearOpts{} : dsv4::quantized_linear_opts(dsv4::Numerics::reference);
}

std::vector<float> make_x(int64_t n) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (auto& v : x) v = dsv4::round_to_bf16(nd(rng));
  return x;
}

void run_gemv(benchmark::State& st, GemmFormat fmt, int64_t rows, int64_t cols,
              dsv4::SimdLevel level = dsv4::best_simd_level()) {
  if (dsv4::set_simd_level(level) != level) {
    st.SkipWithError("SIMD level not available on this CPU");
    return;
  }
  const int threads = static_cast<int>(st.range(0));
  omp_set_num_threads(threads);
  static std::map<int, Bank>* banks = new std::map<int, Bank>();
  const int key = static_cast<int>(fmt);
  if (!banks->count(key)) (*banks)[key] = make_bank(fmt, rows, cols, fmt == GemmFormat::bf16 ? 4 : 16);
  const Bank& b = (*banks)[key];
  const std::vector<float> x = make_x(cols);
  std::vector<float> y(rows);
  size_t i = 0;
  for (auto _ : st) {
    dsv4::linear(b.g[i++ % b.g.size()], x.data(), 1, y.data(), opts_for(fmt));
    benchmark::DoNotOptimize(y.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * b.bytes_each));
  omp_set_num_threads(omp_get_num_procs());
  dsv4::set_simd_level(dsv4::best_simd_level());
}

void run_gemm(benchmark::State& st, GemmFormat fmt, int64_t rows, int64_t cols) {
  const int64_t n_tok = st.range(0);
  const Bank b = make_bank(fmt, rows, cols, 1);
  const std::vector<float> x = make_x(n_tok * cols);
  std::vector<float> y(n_tok * rows);
  for (auto _ : st) {
    dsv4::linear(b.g[0], x.data(), n_tok, y.data(), opts_for(fmt));
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(st.iterations() * n_tok);
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * rows * cols * n_tok * st.iterations() / 1e9,
                                              benchmark::Counter::kIsRate);
}

void BM_Gemv_fp4(benchmark::State& st) { run_gemv(st, GemmFormat::fp4, 2048, 4096); }
void BM_Gemv_fp8(benchmark::State& st) { run_gemv(st, GemmFormat::fp8, 2048, 4096); }
void BM_Gemv_bf16(benchmark::State& st) { run_gemv(st, GemmFormat::bf16, 4096, 4096); }
// The AVX2 kernels on an AVX-512 machine (what CPUs without AVX-512 run), one thread.
void BM_Gemv_fp4_avx2(benchmark::State& st) { run_gemv(st, GemmFormat::fp4, 2048, 4096, dsv4::SimdLevel::avx2); }
void BM_Gemv_fp8_avx2(benchmark::State& st) { run_gemv(st, GemmFormat::fp8, 2048, 4096, dsv4::SimdLevel::avx2); }
void BM_Gemv_bf16_avx2(benchmark::State& st) { run_gemv(st, GemmFormat::bf16, 4096, 4096, dsv4::SimdLevel::avx2); }
void BM_Gemm_fp4(benchmark::State& st) { run_gemm(st, GemmFormat::fp4, 2048, 4096); }
void BM_Gemm_fp8(benchmark::State& st) { run_gemm(st, GemmFormat::fp8, 2048, 4096); }

BENCHMARK(BM_Gemv_fp4)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->UseRealTime();
BENCHMARK(BM_Gemv_fp8)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->UseRealTime();
BENCHMARK(BM_Gemv_bf16)->Arg(1)->Arg(4)->Arg(16)->UseRealTime();
BENCHMARK(BM_Gemv_fp4_avx2)->Arg(1)->UseRealTime();
BENCHMARK(BM_Gemv_fp8_avx2)->Arg(1)->UseRealTime();
BENCHMARK(BM_Gemv_bf16_avx2)->Arg(1)->UseRealTime();
BENCHMARK(BM_Gemm_fp4)->Arg(48)->Arg(256)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gemm_fp8)->Arg(256)->Arg(2048)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
