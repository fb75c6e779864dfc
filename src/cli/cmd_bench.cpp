// `dsv4 bench <kind>`: performance measurements of the CPU backend (never part of the test suite).
//   dsv4 bench gemm [--threads N] [--seconds S] [--prefill-tokens T] [--experts-alloc E] [--no-head] [--json]
//     1. machine bandwidth: parallel memcpy of a large buffer ("copy", STREAM convention: read + write bytes / s)
//        and a parallel read-only sweep ("read"), in the same run;
//     2. decode: one token through one V4-Flash MoE layer's active weights — 6 routed experts (FP4 w1/w3 [2048,4096],
//        w2 [4096,2048], E8M0 per 32) + the shared expert (FP8 128x128 blocks) — with the reference quantization
//        (act_quant per 128, bf16 outputs), through the CPU backend's MoE op (CpuOps::moe; also as one linear() per
//        product, decode_moe_layer_per_linear); reports weight-streaming GB/s and its % of the copy bandwidth;
//        plus the BF16 lm head GEMV [129280, 4096] (fp32 logits) unless --no-head;
//     3. prefill: a T-token chunk through the same layer (T*6/256 tokens per routed expert, all 256 experts + shared),
//        reporting tokens/s, GFLOP/s and % of the fp32 FMA peak measured in the same run (FMA chains on every thread).
//   dsv4 bench structured -m DIR [-n N] [--threads T] [--repeat R] [--json]   (src/cli/bench_structured.cpp)
//     decode ms/token of a real model without and with a JSON-schema constraint (cold and cached grammar).
//   dsv4 bench spec -m DIR [--batch 1,8] [--draft 1,2,3,4] [-n N] [--json]   (src/cli/bench_spec.cpp)
//     speculative decoding with the checkpoint's drafter (MTP or DSpark): acceptance rate, speed-up, verify / draft
//     step costs.
//   Weights are random bytes in the official formats (no checkpoint needed). Each decode token uses a different set of
//   experts among --experts-alloc allocated ones, so weights stream from memory, not from the caches.
// Hook: add another benchmark kind (e.g. `dsv4 bench layer`, model engineer) as one more entry of kBenchKinds below.
#include <omp.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/act_quant.h"
#include "backend/cpu_features.h"
#include "backend/cpu_ops.h"
#include "backend/gemm.h"
#include "cli/numerics_option.h"
#include "cli/bench_structured.h"
#include "cli/command.h"
#include "cli/int_option.h"
#include "core/error.h"
#include "format/numeric.h"

namespace dsv4::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- random weights in the official formats --------------------------------------------------------------------
uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Fill with random bytes (parallel, deterministic per 64 KiB chunk).
void fill_random(uint8_t* p, size_t n, uint64_t seed) {
  const int64_t chunks = static_cast<int64_t>((n + 65535) / 65536);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    uint64_t s = seed * 1000003ull + static_cast<uint64_t>(c);
    const size_t b = static_cast<size_t>(c) * 65536, e = std::min(n, b + 65536);
    for (size_t i = b; i < e; i += 8) {
      const uint64_t v = splitmix(s);
      std::memcpy(p + i, &v, std::min<size_t>(8, e - i));
    }
  }
}

struct OwnedWeight {
  std::vector<uint8_t> w, scale;
  GemmWeight g;
  size_t bytes() const { return w.size() + scale.size(); }
};

OwnedWeight make_fp8(int64_t rows, int64_t cols, uint64_t seed) {
  OwnedWeight o;
  o.w.resize(static_cast<size_t>(rows * cols));
  fill_random(o.w.data(), o.w.size(), seed);
  for (auto& b : o.w)
    if ((b & 0x7F) == 0x7F) b ^= 0x01;  // no NaN codes
  o.scale.resize(static_cast<size_t>(((rows + 127) / 128) * ((cols + 127) / 128)));
  for (size_t i = 0; i < o.scale.size(); ++i) o.scale[i] = static_cast<uint8_t>(118 + (i * 7 + seed) % 6);
  o.g = GemmWeight{GemmFormat::fp8, o.w.data(), o.scale.data(), false, rows, cols, 128, 128};
  return o;
}

OwnedWeight make_fp4(int64_t rows, int64_t cols, uint64_t seed) {
  OwnedWeight o;
  o.w.resize(static_cast<size_t>(rows * cols / 2));
  fill_random(o.w.data(), o.w.size(), seed);
  o.scale.resize(static_cast<size_t>(rows * ((cols + 31) / 32)));
  for (size_t i = 0; i < o.scale.size(); ++i) o.scale[i] = static_cast<uint8_t>(119 + (i * 13 + seed) % 6);
  o.g = GemmWeight{GemmFormat::fp4, o.w.data(), o.scale.data(), false, rows, cols, 1, 32};
  return o;
}

OwnedWeight make_bf16(int64_t rows, int64_t cols, uint64_t seed) {
  OwnedWeight o;
  o.w.resize(static_cast<size_t>(rows * cols * 2));
  fill_random(o.w.data(), o.w.size(), seed);
  for (size_t i = 1; i < o.w.size(); i += 2) o.w[i] = static_cast<uint8_t>((o.w[i] & 0x80) | 0x3C);  // |w| ~ 2^-7
  o.g = GemmWeight{GemmFormat::bf16, o.w.data(), nullptr, false, rows, cols, 128, 128};
  return o;
}

struct Expert {
  OwnedWeight w1, w2, w3;
  size_t bytes() const { return w1.bytes() + w2.bytes() + w3.bytes(); }
};

// SwiGLU expert (spec §5.7): h = bf16(silu(min(g,10)) * clamp(up,-10,10)); y = w2(h). Scratch sized by the caller.
void run_expert(const Expert& e, const float* x, int64_t n, const LinearOpts& o, std::vector<float>& g,
                std::vector<float>& up, std::vector<float>& y) {
  const int64_t inter = e.w1.g.rows;
  g.resize(static_cast<size_t>(n * inter));
  up.resize(g.size());
  y.resize(static_cast<size_t>(n * e.w2.g.rows));
  linear(e.w1.g, x, n, g.data(), o);
  linear(e.w3.g, x, n, up.data(), o);
  const int64_t total = n * inter;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < total; ++i) {
    const float gv = std::min(g[i], 10.0f), uv = std::clamp(up[i], -10.0f, 10.0f);
    g[i] = round_to_bf16(gv / (1.0f + std::exp(-gv)) * uv);
  }
  linear(e.w2.g, g.data(), n, y.data(), o);
}

// ---- bandwidth -------------------------------------------------------------------------------------------------
struct Bandwidth {
  double copy_gbs = 0, read_gbs = 0;
};

Bandwidth measure_bandwidth(size_t bytes, int reps) {
  std::unique_ptr<uint8_t[]> src(new uint8_t[bytes]), dst(new uint8_t[bytes]);
  const int nt = omp_get_max_threads();
  // first touch by the threads that will use the memory
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const size_t b = bytes * t / nt, e = bytes * (t + 1) / nt;
    std::memset(src.get() + b, 1 + t, e - b);
    std::memset(dst.get() + b, 0, e - b);
  }
  Bandwidth bw;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(nt)
    {
      const int t = omp_get_thread_num();
      const size_t b = bytes * t / nt, e = bytes * (t + 1) / nt;
      std::memcpy(dst.get() + b, src.get() + b, e - b);
    }
    bw.copy_gbs = std::max(bw.copy_gbs, 2.0 * static_cast<double>(bytes) / seconds_since(t0) / 1e9);
  }
  uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    uint64_t total = 0;
#pragma omp parallel num_threads(nt) reduction(+ : total)
    {
      const int t = omp_get_thread_num();
      const size_t b = (bytes / 64) * t / nt * 64, e = (bytes / 64) * (t + 1) / nt * 64;
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
      const uint64_t* p = reinterpret_cast<const uint64_t*>(src.get() + b);
      for (size_t i = 0; i < (e - b) / 8; i += 8) {
        a0 += p[i], a1 += p[i + 1], a2 += p[i + 2], a3 += p[i + 3];
        a4 += p[i + 4], a5 += p[i + 5], a6 += p[i + 6], a7 += p[i + 7];
      }
      total += a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    }
    sink += total;
    bw.read_gbs = std::max(bw.read_gbs, static_cast<double>(bytes) / seconds_since(t0) / 1e9);
  }
  if (sink == 42) std::fprintf(stderr, " ");  // keep the sum alive
  return bw;
}

// ---- fp32 FMA peak: independent FMA chains on every thread, at the SIMD width the kernels use ------------------
#if defined(__x86_64__) && defined(__GNUC__)
// 12 independent chains (more than FMA latency x FMA ports); returns a value that depends on the work.
__attribute__((target("avx2,fma"))) float fma_loop256(int64_t iters) {
  __m256 c[12];
  for (int i = 0; i < 12; ++i) c[i] = _mm256_set1_ps(1.0f + 1e-7f * static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-6f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) c[i] = _mm256_fmadd_ps(c[i], m, a);
  for (int i = 1; i < 12; ++i) c[0] = _mm256_add_ps(c[0], c[i]);
  return _mm256_cvtss_f32(c[0]);
}
__attribute__((target("avx512f"))) float fma_loop512(int64_t iters) {
  __m512 c[12];
  for (int i = 0; i < 12; ++i) c[i] = _mm512_set1_ps(1.0f + 1e-7f * static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-6f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) c[i] = _mm512_fmadd_ps(c[i], m, a);
  for (int i = 1; i < 12; ++i) c[0] = _mm512_add_ps(c[0], c[i]);
  return _mm512_cvtss_f32(c[0]);
}
#endif

// GFLOP/s (2 per FMA lane) of nt threads running FMA chains at the width of simd_level() (scalar: 1 lane).
double fma_peak_gflops(int nt) {
  const SimdLevel l = simd_level();
  const int lanes = l >= SimdLevel::avx512 ? 16 : l == SimdLevel::avx2 ? 8 : 1;
  constexpr int64_t kIters = 20'000'000;
  double sink = 0;
  const auto t0 = Clock::now();
#pragma omp parallel num_threads(nt) reduction(+ : sink)
  {
#if defined(__x86_64__) && defined(__GNUC__)
    if (l >= SimdLevel::avx512)
      sink += fma_loop512(kIters);
    else if (l == SimdLevel::avx2)
      sink += fma_loop256(kIters);
    else
#endif
    {
      float c[12];
      for (int i = 0; i < 12; ++i) c[i] = 1.0f + 1e-7f * static_cast<float>(i);
      for (int64_t it = 0; it < kIters; ++it)
        for (float& v : c) v = std::fma(v, 0.999999f, 1e-6f);
      sink += c[0];
    }
  }
  const double t = seconds_since(t0);
  if (sink == 42) std::fprintf(stderr, " ");
  return 2.0 * lanes * 12.0 * static_cast<double>(kIters) * nt / t / 1e9;
}

// ---- dsv4 bench gemm -------------------------------------------------------------------------------------------
struct GemmBenchOpts {
  int threads = 0;
  double seconds = 2.0;
  int64_t prefill_tokens = 2048;
  int experts_alloc = 48;
  int64_t mem_mib = 1024;
  std::string numerics = "reference";
  bool no_head = false;
  bool json = false;
};

int run_gemm_bench(const GemmBenchOpts& o) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const auto num = parse_numerics(o.numerics);
  if (!num) usage_fail("bench gemm: --numerics must be reference or dense, got '{}'", o.numerics);
  const LinearOpts lo = quantized_linear_opts(*num);
  const int nt = omp_get_max_threads();
  const int64_t D = 4096, I = 2048, E = 256, topk = 6;
  nlohmann::json out;
  out["threads"] = nt;
  out["simd"] = simd_level_name(simd_level());
  out["cpu_features"] = cpu_features_string();
  out["numerics"] = o.numerics;
  auto say = [&](const std::string& s) {  // human-readable lines (stderr with --json, so stdout stays one object)
    std::fprintf(o.json ? stderr : stdout, "%s\n", s.c_str());
    std::fflush(o.json ? stderr : stdout);
  };
  say(fmt::format("dsv4 bench gemm: {} threads, kernels {}, cpu [{}], numerics {}", nt, simd_level_name(simd_level()),
                  cpu_features_string(), o.numerics));

  const Bandwidth bw = measure_bandwidth(static_cast<size_t>(o.mem_mib) << 20, 5);
  out["copy_GBps"] = bw.copy_gbs;
  out["read_GBps"] = bw.read_gbs;
  say(fmt::format("memory: copy {:.1f} GB/s (read+write bytes, {} MiB memcpy), read {:.1f} GB/s", bw.copy_gbs,
                  o.mem_mib, bw.read_gbs));

  // weights
  auto t_init = Clock::now();
  std::vector<Expert> experts(static_cast<size_t>(o.experts_alloc));
  for (int e = 0; e < o.experts_alloc; ++e) {
    experts[e].w1 = make_fp4(I, D, 3 * e + 1);
    experts[e].w3 = make_fp4(I, D, 3 * e + 2);
    experts[e].w2 = make_fp4(D, I, 3 * e + 3);
  }
  Expert shared{make_fp8(I, D, 9001), make_fp8(D, I, 9002), make_fp8(I, D, 9003)};
  say(fmt::format("weights: {} routed experts x {:.1f} MB (FP4) + shared {:.1f} MB (FP8), made in {:.1f} s",
                  o.experts_alloc, experts[0].bytes() / 1e6, shared.bytes() / 1e6, seconds_since(t_init)));

  std::vector<float> x(static_cast<size_t>(std::max<int64_t>(o.prefill_tokens, 1) * D));
  {
    uint64_t s = 77;
    for (auto& v : x) v = round_to_bf16(static_cast<float>(static_cast<int64_t>(splitmix(s) % 2001) - 1000) * 1e-3f);
  }
  std::vector<float> g, up, y, acc(static_cast<size_t>(D));

  // decode: one token through the CPU backend's MoE op (CpuOps::moe: the routed experts' and the shared expert's
  // products batched over the pool, the combine), 6 routed experts (a different set each step) + shared
  const size_t layer_bytes = topk * experts[0].bytes() + shared.bytes();
  std::vector<ExpertView> views(static_cast<size_t>(o.experts_alloc));
  for (int e = 0; e < o.experts_alloc; ++e) views[e] = ExpertView{experts[e].w1.g, experts[e].w2.g, experts[e].w3.g};
  const ExpertView shared_view{shared.w1.g, shared.w2.g, shared.w3.g};
  MoeWeights mw;
  mw.experts = views.data();
  mw.n_experts = o.experts_alloc;
  mw.shared = &shared_view;
  static const CpuOps cpu_ops;
  auto measure = [&](auto&& step_fn) {  // seconds per token, after a 0.2 s warm-up
    double t = 0;
    for (int warm = 0; warm < 2; ++warm) {
      int64_t steps = 0;
      const auto t0 = Clock::now();
      do step_fn(), ++steps;
      while (seconds_since(t0) < (warm == 0 ? 0.2 : o.seconds));
      t = seconds_since(t0) / static_cast<double>(steps);
    }
    return t;
  };
  int next = 0;
  std::vector<int32_t> ids(topk);
  std::vector<float> wts(topk, 1.0f / topk);
  const double t_dec = measure([&] {
    for (int k = 0; k < topk; ++k) ids[k] = (next + k) % o.experts_alloc;
    next = (next + topk) % o.experts_alloc;
    cpu_ops.moe(mw, x.data(), 1, ids.data(), wts.data(), topk, 10.0f, lo, true, acc.data());
  });
  // the same layer as one linear() per product (and an OpenMP SwiGLU per expert), the measure before the MoE op was
  // batched (bench results up to a14bd3b)
  const double t_lin = measure([&] {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int k = 0; k < topk; ++k) {
      run_expert(experts[next], x.data(), 1, lo, g, up, y);
      next = (next + 1) % o.experts_alloc;
      for (int64_t d = 0; d < D; ++d) acc[d] += y[d];
    }
    run_expert(shared, x.data(), 1, lo, g, up, y);
  });
  const double dec_gbs = static_cast<double>(layer_bytes) / t_dec / 1e9;
  const double lin_gbs = static_cast<double>(layer_bytes) / t_lin / 1e9;
  out["decode_moe_layer"] = {{"bytes", layer_bytes},
                             {"ms_per_token", t_dec * 1e3},
                             {"GBps", dec_gbs},
                             {"pct_of_copy", 100.0 * dec_gbs / bw.copy_gbs},
                             {"pct_of_read", 100.0 * dec_gbs / bw.read_gbs}};
  out["decode_moe_layer_per_linear"] = {{"ms_per_token", t_lin * 1e3},
                                        {"GBps", lin_gbs},
                                        {"pct_of_copy", 100.0 * lin_gbs / bw.copy_gbs}};
  say(fmt::format(
      "decode MoE layer (CpuOps::moe, 6 routed FP4 + shared FP8, {:.1f} MB/token): {:.3f} ms/token, {:.1f} GB/s "
      "= {:.0f}% of copy, {:.0f}% of read bandwidth; as one linear() per product: {:.3f} ms/token, {:.1f} GB/s",
      layer_bytes / 1e6, t_dec * 1e3, dec_gbs, 100.0 * dec_gbs / bw.copy_gbs, 100.0 * dec_gbs / bw.read_gbs,
      t_lin * 1e3, lin_gbs));

  // per-format GEMV rates (same weights; FP4 routed only / FP8 shared only)
  {
    auto rate = [&](auto&& fn, size_t bytes_per_call) {
      int64_t n = 0;
      const auto t0 = Clock::now();
      do fn(), ++n;
      while (seconds_since(t0) < o.seconds / 2);
      return static_cast<double>(bytes_per_call) * n / seconds_since(t0) / 1e9;
    };
    std::vector<float> yy(static_cast<size_t>(D));
    int e = 0;
    const double fp4 = rate(
        [&] {
          linear(experts[e].w1.g, x.data(), 1, yy.data(), lo);
          e = (e + 1) % o.experts_alloc;
        },
        experts[0].w1.bytes());
    const double fp8 = rate([&] { linear(shared.w1.g, x.data(), 1, yy.data(), lo); }, shared.w1.bytes());
    // FP8 streamed from memory: shared-expert-shaped [2048, 4096] weights cycled over more bytes than the caches hold
    const int n_fp8 = std::max(2, static_cast<int>((o.experts_alloc * experts[0].w1.bytes()) / shared.w1.bytes()));
    std::vector<OwnedWeight> fp8s;
    for (int i = 0; i < n_fp8; ++i) fp8s.push_back(make_fp8(I, D, 7001 + i));
    int f = 0;
    const double fp8s_rate = rate(
        [&] {
          linear(fp8s[f].g, x.data(), 1, yy.data(), lo);
          f = (f + 1) % n_fp8;
        },
        shared.w1.bytes());
    // The same without E4M3 subnormal codes (exponent field 0: 1/16 of uniformly random bytes, ~1e-4 of a real
    // checkpoint's weights): the GEMV decodes codes through fp32 subnormals, which cost a microcode assist per
    // multiply on some CPUs; the two figures differing shows that cost.
    for (auto& wt : fp8s)
      for (auto& b : wt.w)
        if ((b & 0x78) == 0) b |= 0x08;
    const double fp8n_rate = rate(
        [&] {
          linear(fp8s[f].g, x.data(), 1, yy.data(), lo);
          f = (f + 1) % n_fp8;
        },
        shared.w1.bytes());
    fp8s.clear();
    out["decode_gemv_GBps"] = {{"fp4_expert_w1", fp4},
                               {"fp8_shared_w1_cached", fp8},
                               {"fp8_w1_streamed", fp8s_rate},
                               {"fp8_w1_streamed_no_subnormal_codes", fp8n_rate}};
    out["decode_gemv_pct_of_read"] = {{"fp4_expert_w1", 100.0 * fp4 / bw.read_gbs},
                                      {"fp8_w1_streamed", 100.0 * fp8s_rate / bw.read_gbs},
                                      {"fp8_w1_streamed_no_subnormal_codes", 100.0 * fp8n_rate / bw.read_gbs}};
    out["decode_gemv_pct_of_copy"] = {{"fp4_expert_w1", 100.0 * fp4 / bw.copy_gbs},
                                      {"fp8_shared_w1_cached", 100.0 * fp8 / bw.copy_gbs},
                                      {"fp8_w1_streamed", 100.0 * fp8s_rate / bw.copy_gbs},
                                      {"fp8_w1_streamed_no_subnormal_codes", 100.0 * fp8n_rate / bw.copy_gbs}};
    say(fmt::format("decode GEMV: FP4 expert w1 {:.1f} GB/s = {:.0f}% of read, {:.0f}% of copy (streamed); FP8 [2048, "
                    "4096] {:.1f} GB/s = {:.0f}% of read, {:.0f}% of copy (streamed over {} copies; {:.1f} GB/s = {:.0f}% "
                    "of read, {:.0f}% of copy without subnormal codes), {:.1f} GB/s (8 MB, cache-warm)",
                    fp4, 100.0 * fp4 / bw.read_gbs, 100.0 * fp4 / bw.copy_gbs, fp8s_rate, 100.0 * fp8s_rate / bw.read_gbs,
                    100.0 * fp8s_rate / bw.copy_gbs, n_fp8, fp8n_rate, 100.0 * fp8n_rate / bw.read_gbs,
                    100.0 * fp8n_rate / bw.copy_gbs, fp8));
    // thread scaling of the streamed FP4 GEMV (per-core rate and where memory bandwidth takes over)
    std::string line;
    nlohmann::json sc = nlohmann::json::object();
    std::vector<int> counts;
    for (int t = 1; t < nt; t *= 2) counts.push_back(t);
    counts.push_back(nt);
    for (int t : counts) {
      omp_set_num_threads(t);
      const double r = rate(
          [&] {
            linear(experts[e].w1.g, x.data(), 1, yy.data(), lo);
            e = (e + 1) % o.experts_alloc;
          },
          experts[0].w1.bytes());
      sc[std::to_string(t)] = r;
      line += fmt::format(" {}t {:.1f}", t, r);
    }
    omp_set_num_threads(nt);
    out["decode_gemv_fp4_scaling_GBps"] = sc;
    say("decode GEMV FP4 streamed GB/s by threads:" + line);
  }

  if (!o.no_head) {
    OwnedWeight head = make_bf16(129280, D, 4242);
    std::vector<float> logits(129280);
    LinearOpts ho;  // fp32 logits from the upcast bf16 head (spec §5.8)
    int64_t n = 0;
    linear(head.g, x.data(), 1, logits.data(), ho);
    const auto t0 = Clock::now();
    do linear(head.g, x.data(), 1, logits.data(), ho), ++n;
    while (seconds_since(t0) < o.seconds / 2);
    const double t = seconds_since(t0) / static_cast<double>(n);
    const double gbs = static_cast<double>(head.bytes()) / t / 1e9;
    out["decode_head_bf16"] = {{"ms", t * 1e3}, {"GBps", gbs}, {"pct_of_copy", 100.0 * gbs / bw.copy_gbs}};
    say(fmt::format("decode lm head BF16 [129280, 4096] GEMV: {:.2f} ms, {:.1f} GB/s = {:.0f}% of copy", t * 1e3, gbs,
                    100.0 * gbs / bw.copy_gbs));
  }

  // prefill: T tokens, T*6/256 per routed expert over all 256 experts (weights cycled over the allocated ones)
  {
    const int64_t T = o.prefill_tokens;
    const int64_t per = std::max<int64_t>(1, T * topk / E);
    const auto t0 = Clock::now();
    run_expert(shared, x.data(), T, lo, g, up, y);
    for (int64_t e = 0; e < E; ++e) run_expert(experts[e % o.experts_alloc], x.data(), per, lo, g, up, y);
    const double t = seconds_since(t0);
    const double flops = 2.0 * 3.0 * static_cast<double>(I * D) * static_cast<double>(T + per * E);
    const double peak = fma_peak_gflops(nt);
    out["fma_peak_GFLOPs"] = peak;
    out["prefill_moe_layer"] = {{"tokens", T},
                                {"tokens_per_expert", per},
                                {"seconds", t},
                                {"tokens_per_s", static_cast<double>(T) / t},
                                {"GFLOPs", flops / t / 1e9},
                                {"pct_of_fma_peak", 100.0 * flops / t / 1e9 / peak}};
    say(
        fmt::format("prefill MoE layer, {} tokens ({} per routed expert x 256 + shared): {:.3f} s, {:.0f} tokens/s, "
                    "{:.0f} GFLOP/s = {:.0f}% of the measured fp32 FMA peak ({:.0f} GFLOP/s, {} threads, {})",
                    T, per, t, static_cast<double>(T) / t, flops / t / 1e9, 100.0 * flops / t / 1e9 / peak, peak, nt,
                    simd_level_name(simd_level())));
  }
  if (o.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

void setup_gemm(CLI::App& app, Runner& run) {
  auto o = std::make_shared<GemmBenchOpts>();
  app.add_option("--threads", o->threads, "OpenMP threads (default 0: all)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, 4096));
  // (CLI::PositiveNumber quoted its bound, DBL_MAX, in 300 digits, and let NaN through)
  app.add_option("--seconds", o->seconds, "measuring time per decode figure (s, default 2)")
      ->check(CLI::Validator(
          [](std::string& s) {
            double v = 0;
            if (!CLI::detail::lexical_cast(s, v)) return std::string();  // the conversion's own error
            return v > 0 && v <= 3600.0 ? std::string() : "must be in (0, 3600] seconds (got '" + s + "')";
          },
          ""));
  app.add_option("--prefill-tokens", o->prefill_tokens, "prefill chunk length")
      ->transform(dsv4::cli::integer_in<int64_t>(1, int64_t(1) << 20));
  app.add_option("--experts-alloc", o->experts_alloc, "distinct routed experts allocated (6 .. 256, the layer's count; "
                                                      "default 48)")
      ->transform(dsv4::cli::integer_in<int>(6, 256));
  app.add_option("--mem-mib", o->mem_mib, "bandwidth buffer size (MiB)")
      ->transform(dsv4::cli::integer_in<int64_t>(1, int64_t(1) << 20));
  dsv4::cli::add_numerics_option(app, o->numerics, "reference (FP8 act quant, bf16 out) or dense (fp32)");
  app.add_flag("--no-head", o->no_head, "skip the BF16 lm-head GEMV (1 GB)");
  app.add_flag("--json", o->json, "print one JSON object");
  run = [o] { return run_gemm_bench(*o); };
}

}  // namespace
void setup_bench_model(CLI::App& app, Runner& run);  // bench_model.cpp
void setup_bench_serve(CLI::App& app, Runner& run);  // bench_serve.cpp
void setup_bench_spec(CLI::App& app, Runner& run);   // bench_spec.cpp
namespace {

// Benchmark kinds of `dsv4 bench`. Add one line per kind (name, help, setup).
struct BenchKind {
  const char* name;
  const char* help;
  void (*setup)(CLI::App&, Runner&);
};
const BenchKind kBenchKinds[] = {
    {"gemm", "CPU memory bandwidth, MoE-layer decode GEMV and prefill GEMM on random V4-Flash-shaped weights",
     setup_gemm},
    {"model", "the whole forward pass on a backend (--device): prefill tok/s, decode ms/step and GB/s, per-op times",
     setup_bench_model},
    {"structured", "decode ms/token of a model with and without a JSON-schema constraint", setup_bench_structured},
    {"serve", "aggregate tokens/s of the HTTP server at several numbers of concurrent clients (--clients 1,8)",
     setup_bench_serve},
    {"spec", "speculative decoding with the checkpoint's drafter: acceptance rate, speed-up, verify and draft step costs",
     setup_bench_spec},
};

void setup_bench(CLI::App& app, Runner& run) {
  app.require_subcommand(1);
  auto runners = std::make_shared<std::vector<std::pair<CLI::App*, Runner>>>();
  for (const BenchKind& k : kBenchKinds) {
    CLI::App* sub = app.add_subcommand(k.name, k.help);
    runners->emplace_back(sub, Runner{});
    k.setup(*sub, runners->back().second);
  }
  run = [runners] {
    for (auto& [sub, r] : *runners)
      if (sub->parsed() && r) return r();
    return 0;
  };
}

}  // namespace

DSV4_COMMAND(bench, "Performance benchmarks (bench gemm, bench model, bench structured, bench serve, bench spec)", setup_bench);

}  // namespace dsv4::cli
