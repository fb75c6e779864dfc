// Routed experts split between the GPU and the CPU (issue 11; model/split_moe.h) with the real CUDA backend:
// * SplitMoe on CUDA (resident experts on the GPU, the others on the CPU, input rows through pinned memory) equals
//   the unsplit CUDA moe and the CPU backend's moe BITWISE in the deterministic mode, for every placement of an
//   8-expert layer and forced routings (one expert for every slot, distinct, every expert, random with duplicates),
//   reference and dense numerics, up to 300 tokens; in the fast mode within the fast moe tolerance (rms 2^-5);
// * the demo model on CUDA, deterministic: the logits of a 300-token prompt + 12 decode steps (the layers without host
//   experts replayed as CUDA graph segments) under all-GPU, --cpu-moe,
//   every --n-cpu-moe value and a hot-expert profile equal the CPU backend's BITWISE;
// * full-size V4-Flash placements that cannot fit (all experts on the GPU; all on the CPU: 140 GB > the host's
//   RAM) are one-line errors with exit 1 before any allocation;
// * the staged path (model/expert_staging.h: the host experts copied to the GPU through two staging slots on a copy
//   stream and run there): the 8-expert layer under the placements and routings above BITWISE equal to the CPU in
//   the deterministic mode, with slots of one expert, of three (chunks smaller than a layer) and of the whole layer,
//   host memory pinned or not; in the fast mode equal to the all-resident GPU run within the fast moe tolerance
//   (the differing elements are counted: the same kernels, so 0 is expected); a V4-Flash-shaped layer (256 FP4
//   experts of [2048, 4096], 512 tokens > the automatic threshold, the default 256 MiB slots: 13 chunks per layer)
//   bitwise equal to the all-resident run in the deterministic mode and within tolerance in the fast one, and a
//   call under the threshold still on the CPU; the demo model's prefill (300 tokens, past the automatic threshold)
//   + decode under several placements BITWISE equal to the CPU.
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/split_moe_fixture.h"
#include "model/expert_staging.h"
#include "gpu_modes.h"
#include "gpu_cli.h"
#include "gpu_test_util.h"
#include "model/expert_placement.h"
#include "model/sequence.h"

namespace dsv4::test::gpu {
namespace {

std::vector<float> moe_ref(Backend& be, const SplitMoeFixture& fx, const std::vector<float>& x,
                           const std::vector<int32_t>& ids, const std::vector<float>& w, int64_t n, int64_t k,
                           Numerics num) {
  const Buffer bx = to_device(be, x), bi = to_device(be, ids), bw = to_device(be, w);
  Buffer y(be, size_t(n * SplitMoeFixture::D) * 4, "y");
  be.ops().moe(fx.all_device(), bx.as<float>(), n, bi.as<int32_t>(), bw.as<float>(), k, 10.0f,
               quantized_linear_opts(num), num == Numerics::reference, y.as<float>());
  return to_host<float>(be, y, size_t(n * SplitMoeFixture::D));
}

std::vector<float> split_run(Backend& be, SplitMoe& split, const SplitMoeFixture& fx, unsigned mask,
                             const std::vector<float>& x, const std::vector<int32_t>& ids, const std::vector<float>& w,
                             int64_t n, int64_t k, Numerics num) {
  const Buffer bx = to_device(be, x), bi = to_device(be, ids), bw = to_device(be, w);
  Buffer y = out_buffer<float>(be, size_t(n * SplitMoeFixture::D));
  SplitMoeFixture::Split s;
  fx.make_split(mask, s);
  split.run(be.ops(), s.layer, SplitMoeFixture::D, bx.as<float>(), n, bi.as<int32_t>(), bw.as<float>(), k, 10.0f,
            quantized_linear_opts(num), num == Numerics::reference, y.as<float>());
  return to_host<float>(be, y, size_t(n * SplitMoeFixture::D));
}

TEST(CudaSplitMoe, EveryPlacementAndRoutingEqualsTheCpuBitwiseInTheDeterministicMode) {
  DSV4_REQUIRE_GPU();
  Backend& g = *cuda();
  SplitMoeFixture fg(g), fc(cpu());  // the same weights on both backends
  SplitMoe split(g);
  DeterministicGemm det;
  int checked = 0;
  for (Numerics num : {Numerics::reference, Numerics::dense})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {4, 6}, {300, 6}}) {
      const auto x = randn(size_t(n * SplitMoeFixture::D), 31 + uint32_t(n), 1.0f, true);
      std::vector<float> w(size_t(n * k));
      for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f + 0.5f * float((i * 37) % 11) / 11.0f;
      const auto pats = routing_patterns(n, k, SplitMoeFixture::E, 33);
      for (size_t pi = 0; pi < pats.size(); ++pi) {
        const auto cref = moe_ref(cpu(), fc, x, pats[pi], w, n, k, num);
        const auto gref = moe_ref(g, fg, x, pats[pi], w, n, k, num);
        ASSERT_EQ(std::memcmp(cref.data(), gref.data(), cref.size() * 4), 0) << "unsplit CUDA moe vs CPU";
        for (unsigned mask = 0; mask < 256; mask += (n > 4 ? 17 : 1)) {
          const auto got = split_run(g, split, fg, mask, x, pats[pi], w, n, k, num);
          ASSERT_EQ(std::memcmp(cref.data(), got.data(), cref.size() * 4), 0)
              << numerics_name(num) << " n " << n << " k " << k << " pattern " << pi << " host mask " << mask;
          ++checked;
        }
      }
    }
  std::printf("[cuda-split] %d (placement, routing) cases bitwise equal to the CPU; %lld host pairs, %.1f KB to "
              "the host, %.1f KB back\n",
              checked, static_cast<long long>(split.stats().host_pairs), split.stats().to_host_bytes / 1e3,
              split.stats().to_device_bytes / 1e3);
  EXPECT_GT(split.stats().host_pairs, 0);
}

// ---- the staged path --------------------------------------------------------------------------------------------

// One fixture expert's footprint in a staging slot: w1, w3, w2 (FP4 [128, 128]: 8 KiB + 512 B of scales each).
constexpr size_t kFixtureExpertSlotBytes = 3 * (8192 + 512);

std::unique_ptr<SplitMoe> staged_split(Backend& be, int64_t min_tokens, size_t slot_bytes) {
  SplitMoeOptions o;
  o.stage_min_tokens = min_tokens;
  o.stage_slot_bytes = slot_bytes;
  return std::make_unique<SplitMoe>(be, o);
}

std::vector<float> staged_run(Backend& be, SplitMoe& split, const SplitMoeFixture& fx, unsigned mask,
                              const std::vector<float>& x, const std::vector<int32_t>& ids,
                              const std::vector<float>& w, int64_t n, int64_t k, Numerics num) {
  const Buffer bx = to_device(be, x), bi = to_device(be, ids), bw = to_device(be, w);
  Buffer y = out_buffer<float>(be, size_t(n * SplitMoeFixture::D));
  SplitMoeFixture::Split s;
  fx.make_split(mask, s);
  split.attach(s.layer);
  split.run(be.ops(), s.layer, SplitMoeFixture::D, bx.as<float>(), n, bi.as<int32_t>(), bw.as<float>(), k, 10.0f,
            quantized_linear_opts(num), num == Numerics::reference, y.as<float>());
  return to_host<float>(be, y, size_t(n * SplitMoeFixture::D));  // (synchronizes: the slots' views die with s)
}

// per token: rms(got - ref) <= 2^-5 rms(ref) (the fast moe tolerance); returns the number of elements that differ
int64_t expect_within_moe_tolerance(const std::vector<float>& ref, const std::vector<float>& got, int64_t n,
                                    int64_t D, const std::string& what) {
  int64_t differ = 0;
  for (int64_t t = 0; t < n; ++t) {
    double e2 = 0, r2 = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double a = ref[size_t(t * D + d)], b = got[size_t(t * D + d)];
      EXPECT_TRUE(std::isfinite(b)) << what << " token " << t;
      if (!std::isfinite(b)) return -1;
      e2 += (a - b) * (a - b);
      r2 += a * a;
      differ += a != b ? 1 : 0;
    }
    EXPECT_LE(std::sqrt(e2), std::ldexp(std::sqrt(r2), -5)) << what << " token " << t;
  }
  return differ;
}

TEST(CudaSplitMoe, StagedPathEqualsTheCpuBitwiseInTheDeterministicMode) {
  DSV4_REQUIRE_GPU();
  Backend& g = *cuda();
  SplitMoeFixture fg(g), fc(cpu());
  DeterministicGemm det;
  struct Config {
    size_t slot;
    bool pin;
    int64_t per_chunk;
  };
  int checked = 0;
  for (const Config& cf : {Config{1, false, 1}, Config{3 * kFixtureExpertSlotBytes, true, 3},
                           Config{3 * kFixtureExpertSlotBytes, false, 3}, Config{size_t(1) << 20, true, 8}}) {
    auto split = staged_split(g, 1, cf.slot);
    if (cf.pin) {  // page-lock the fixture's host experts (every mask's host views point into them)
      SplitMoeFixture::Split all;
      fg.make_split(0xFFu, all);
      split->attach(all.layer);
      split->finish(6);
      EXPECT_TRUE(split->host_experts_pinned()) << "cudaHostRegister of the fixture's host experts failed";
    }
    int64_t chunks = 0;
    for (Numerics num : {Numerics::reference, Numerics::dense})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {4, 6}, {300, 6}}) {
        const auto x = randn(size_t(n * SplitMoeFixture::D), 31 + uint32_t(n), 1.0f, true);
        std::vector<float> w(size_t(n * k));
        for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f + 0.5f * float((i * 37) % 11) / 11.0f;
        const auto pats = routing_patterns(n, k, SplitMoeFixture::E, 33);
        for (size_t pi = 0; pi < pats.size(); ++pi) {
          const auto cref = moe_ref(cpu(), fc, x, pats[pi], w, n, k, num);
          for (unsigned mask = 1; mask < 256; mask += (n > 4 ? 17 : 3)) {
            const auto got = staged_run(g, *split, fg, mask, x, pats[pi], w, n, k, num);
            ASSERT_EQ(std::memcmp(cref.data(), got.data(), cref.size() * 4), 0)
                << numerics_name(num) << " n " << n << " k " << k << " pattern " << pi << " host mask " << mask
                << " slot " << cf.slot << (cf.pin ? " pinned" : "");
            chunks += (std::popcount(mask) + cf.per_chunk - 1) / cf.per_chunk;
            ++checked;
          }
        }
      }
    const SplitMoeStats st = split->stats();
    EXPECT_EQ(st.host_pairs, 0) << "the CPU path ran";
    EXPECT_EQ(st.staged_calls, st.calls);
    EXPECT_EQ(st.staged_chunks, chunks);
    EXPECT_GT(st.staged_copy_s, 0.0);
    std::printf("[cuda-split] staged, %zu-byte slots%s: %lld calls, %lld chunks, %.1f KB copied in %.3f ms\n", cf.slot,
                cf.pin ? " (pinned)" : "", static_cast<long long>(st.staged_calls),
                static_cast<long long>(st.staged_chunks), st.staged_bytes / 1e3, st.staged_copy_s * 1e3);
  }
  std::printf("[cuda-split] %d staged (placement, routing) cases bitwise equal to the CPU\n", checked);
}

TEST(CudaSplitMoe, StagedFastModeEqualsTheAllResidentRun) {
  DSV4_REQUIRE_GPU();
  Backend& g = *cuda();
  SplitMoeFixture fg(g);
  auto split = staged_split(g, 1, 3 * kFixtureExpertSlotBytes);
  int64_t differ = 0, total = 0;
  for (auto [n, k] : {std::pair<int64_t, int64_t>{7, 6}, {300, 6}}) {
    const auto x = randn(size_t(n * SplitMoeFixture::D), 41 + uint32_t(n), 1.0f, true);
    const std::vector<float> w(size_t(n * k), 0.3f);
    const auto pats = routing_patterns(n, k, SplitMoeFixture::E, 43);
    for (unsigned mask : {0xFFu, 0x3Cu, 0x81u})
      for (size_t pi = 0; pi < pats.size(); ++pi) {
        const auto ref = moe_ref(g, fg, x, pats[pi], w, n, k, Numerics::reference);  // every expert resident
        const auto got = staged_run(g, *split, fg, mask, x, pats[pi], w, n, k, Numerics::reference);
        const int64_t d = expect_within_moe_tolerance(
            ref, got, n, SplitMoeFixture::D, "n " + std::to_string(n) + " mask " + std::to_string(mask) +
                                                 " pattern " + std::to_string(pi));
        ASSERT_GE(d, 0);
        differ += d;
        total += n * SplitMoeFixture::D;
      }
  }
  EXPECT_EQ(split->stats().host_pairs, 0);
  std::printf("[cuda-split] fast mode, staged vs every expert resident: %lld of %lld outputs differ (same kernels: 0 "
              "expected)\n", static_cast<long long>(differ), static_cast<long long>(total));
}

// A V4-Flash-shaped MoE layer: 256 FP4 routed experts (w1 / w3 [2048, 4096], w2 [4096, 2048], E8M0 scales per 32)
// in ONE host allocation laid out like a checkpoint's tensors (adjacent: the staged copies coalesce), their device
// copies, and an FP8 shared expert.
class FlashLayer {
 public:
  static constexpr int64_t E = 256, D = 4096, I = 2048;
  explicit FlashLayer(Backend& g) : g_(g) {
    const size_t wb = size_t(I * D / 2), sb = size_t(I * D / 32);  // one matrix: weights, scales (w2: the same)
    bytes_.resize(size_t(E) * 3 * (wb + sb));
    uint64_t st = 0x1234567ull;  // splitmix64: gigabytes in about a second
    auto next = [&] {
      uint64_t z = (st += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return z ^ (z >> 31);
    };
    uint8_t* p = bytes_.data();
    for (int64_t e = 0; e < E; ++e) {
      ExpertView x;
      for (WeightView* v : {&x.w1, &x.w3, &x.w2}) {
        v->fmt = GemmFormat::fp4;
        v->rows = v == &x.w2 ? D : I;
        v->cols = v == &x.w2 ? I : D;
        v->block_rows = 1;
        v->block_cols = 32;
        for (size_t i = 0; i < wb; i += 8) {
          const uint64_t r = next();
          std::memcpy(p + i, &r, 8);
        }
        v->w = p;
        p += wb;
        for (size_t i = 0; i < sb; ++i) p[i] = uint8_t(127 - 4 - int(next() % 3));
        v->scale = p;
        p += sb;
      }
      host_.push_back(x);
      dev_.push_back(ExpertView{g.upload(x.w1, kept_), g.upload(x.w2, kept_), g.upload(x.w3, kept_)});
    }
    shared_h_[0] = random_weight(GemmFormat::fp8, I, D, 71);
    shared_h_[1] = random_weight(GemmFormat::fp8, D, I, 72);
    shared_h_[2] = random_weight(GemmFormat::fp8, I, D, 73);
    shared_ = ExpertView{g.upload(shared_h_[0].view, kept_), g.upload(shared_h_[1].view, kept_),
                         g.upload(shared_h_[2].view, kept_)};
    table_ = g.upload_vector(dev_, "flash expert table");
  }
  MoeWeights all_device() const { return MoeWeights{dev_.data(), E, table_.data(), &shared_}; }
  struct Split {
    std::vector<ExpertView> dev, host;
    Buffer table, resident;
    SplitMoeLayer layer;
  };
  void make_split(const std::vector<uint8_t>& on_host, Split& s) const {
    s.dev = dev_;
    s.host = host_;
    std::vector<uint8_t> res(static_cast<size_t>(E));
    s.layer.on_host = on_host;
    s.layer.n_host = 0;
    for (int64_t e = 0; e < E; ++e) {
      const bool h = on_host[size_t(e)] != 0;
      res[size_t(e)] = h ? 0 : 1;
      s.layer.n_host += h ? 1 : 0;
      ExpertView& u = h ? s.dev[size_t(e)] : s.host[size_t(e)];
      for (WeightView* v : {&u.w1, &u.w2, &u.w3}) v->w = nullptr, v->scale = nullptr, v->aux = nullptr;
    }
    s.table = g_.upload_vector(s.dev, "flash split table");
    s.resident = g_.upload_vector(res, "flash resident");
    s.layer.device = MoeWeights{s.dev.data(), E, s.table.data(), &shared_};
    s.layer.host = MoeWeights{s.host.data(), E, nullptr, nullptr};
    s.layer.resident = s.resident.as<uint8_t>();
  }

 private:
  Backend& g_;
  std::vector<uint8_t> bytes_;  // every routed expert's host bytes
  std::vector<ExpertView> host_, dev_;
  HostWeight shared_h_[3];
  ExpertView shared_;
  std::vector<Buffer> kept_;
  Buffer table_;
};

TEST(CudaSplitMoe, StagedFlashShapedLayerEqualsTheAllResidentRun) {
  DSV4_REQUIRE_GPU();
  Backend& g = *cuda();
  const auto t0 = std::chrono::steady_clock::now();
  FlashLayer fl(g);
  const int64_t k = 6, D = FlashLayer::D, E = FlashLayer::E;
  std::printf("[cuda-split] V4-Flash-shaped layer made in %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::vector<std::vector<uint8_t>> placements(3, std::vector<uint8_t>(size_t(E), 0));
  for (int64_t e = 0; e < E; ++e) {
    placements[0][size_t(e)] = 1;                 // every expert on the host (13 chunks of 20)
    placements[1][size_t(e)] = e >= 100 ? 1 : 0;  // a partly split layer
    placements[2][size_t(e)] = e % 2;             // every other one
  }
  for (bool det : {true, false}) {
    std::unique_ptr<DeterministicScope> ds;
    if (det) ds = std::make_unique<DeterministicScope>();
    for (int64_t n : {int64_t(512), int64_t(100)}) {
      const auto x = randn(size_t(n * D), 51 + uint32_t(n), 1.0f, true);
      std::mt19937 rng(52);
      std::vector<int32_t> ids(size_t(n * k));
      for (auto& v : ids) v = int32_t(rng() % uint32_t(E));
      std::vector<float> w(size_t(n * k));
      for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f + 0.5f * float((i * 37) % 11) / 11.0f;
      const Buffer bx = to_device(g, x), bi = to_device(g, ids), bw = to_device(g, w);
      Buffer yr = out_buffer<float>(g, size_t(n * D));
      const LinearOpts q = quantized_linear_opts(Numerics::reference);
      g.ops().moe(fl.all_device(), bx.as<float>(), n, bi.as<int32_t>(), bw.as<float>(), k, 10.0f, q, true,
                  yr.as<float>());
      const auto ref = to_host<float>(g, yr, size_t(n * D));
      for (size_t pi = 0; pi < placements.size(); ++pi) {
        if (n < 512 && (!det || pi != 1)) continue;  // under the threshold: one case (the CPU experts are slow)
        SplitMoeOptions o;
        o.stage_min_tokens = -1;  // the cost model's threshold (227 tokens pinned), the default 256 MiB slots
        SplitMoe split(g, o);
        FlashLayer::Split s;
        fl.make_split(placements[pi], s);
        split.attach(s.layer);
        split.finish(k);
        EXPECT_TRUE(split.host_experts_pinned());
        EXPECT_EQ(split.stage_min_tokens(), 227);
        Buffer y = out_buffer<float>(g, size_t(n * D));
        split.reset_stats();
        const auto t1 = std::chrono::steady_clock::now();
        split.run(g.ops(), s.layer, D, bx.as<float>(), n, bi.as<int32_t>(), bw.as<float>(), k, 10.0f, q, true,
                  y.as<float>());
        const auto got = to_host<float>(g, y, size_t(n * D));
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
        const SplitMoeStats st = split.stats();
        const std::string what = std::string(det ? "deterministic" : "fast") + " n " + std::to_string(n) +
                                 " placement " + std::to_string(pi) + " (" + std::to_string(s.layer.n_host) +
                                 " host experts)";
        int64_t differ = 0;
        if (det) {
          for (size_t i = 0; i < ref.size(); ++i) differ += ref[i] != got[i] ? 1 : 0;
          EXPECT_EQ(differ, 0) << what;
        } else {
          differ = expect_within_moe_tolerance(ref, got, n, D, what);
        }
        if (n >= 512) {
          EXPECT_EQ(st.staged_calls, 1) << what;
          EXPECT_EQ(st.host_pairs, 0) << what;
          EXPECT_EQ(st.staged_chunks, (s.layer.n_host + 19) / 20) << what;
          EXPECT_EQ(st.staged_bytes, uint64_t(s.layer.n_host) * 3 * (FlashLayer::I * FlashLayer::D / 2 + FlashLayer::I * FlashLayer::D / 32)) << what;
        } else {
          EXPECT_EQ(st.staged_calls, 0) << what;
          EXPECT_GT(st.host_pairs, 0) << what;
        }
        std::printf("[cuda-split] flash %s: %lld of %zu outputs differ from every expert resident; %s, %.1f ms; "
                    "%.1f MB staged in %lld chunks, copies %.1f ms = %.1f GB/s\n",
                    what.c_str(), static_cast<long long>(differ), ref.size(),
                    st.staged_calls ? "staged" : "CPU experts", secs * 1e3, st.staged_bytes / 1e6,
                    static_cast<long long>(st.staged_chunks), st.staged_copy_s * 1e3,
                    st.staged_copy_s > 0 ? st.staged_bytes / st.staged_copy_s / 1e9 : 0.0);
      }
    }
  }
}

TEST(CudaSplitMoe, FastModeIsWithinTheMoeTolerance) {
  DSV4_REQUIRE_GPU();
  Backend& g = *cuda();
  SplitMoeFixture fg(g), fc(cpu());
  SplitMoe split(g);
  const int64_t n = 7, k = 6;
  const auto x = randn(size_t(n * SplitMoeFixture::D), 41, 1.0f, true);
  const std::vector<float> w(size_t(n * k), 0.3f);
  const auto pats = routing_patterns(n, k, SplitMoeFixture::E, 43);
  for (unsigned mask : {0x00u, 0xFFu, 0x3Cu})
    for (const auto& pat : pats) {
      const auto ref = moe_ref(cpu(), fc, x, pat, w, n, k, Numerics::reference);
      const auto got = split_run(g, split, fg, mask, x, pat, w, n, k, Numerics::reference);
      for (int64_t t = 0; t < n; ++t) {
        double e2 = 0, r2 = 0;
        for (int64_t d = 0; d < SplitMoeFixture::D; ++d) {
          const double a = ref[size_t(t * SplitMoeFixture::D + d)], b = got[size_t(t * SplitMoeFixture::D + d)];
          ASSERT_TRUE(std::isfinite(b));
          e2 += (a - b) * (a - b);
          r2 += a * a;
        }
        EXPECT_LE(std::sqrt(e2), std::ldexp(std::sqrt(r2), -5)) << "token " << t << " mask " << mask;
      }
    }
}

std::vector<float> demo_logits(const Model& m, std::span<const int32_t> ids, int decode) {
  ModelSequence seq(m);
  const int64_t V = m.n_vocab();
  std::vector<float> out;
  seq.append_all(ids, [&](int64_t, std::span<const float> lg) { out.insert(out.end(), lg.begin(), lg.end()); });
  for (int i = 0; i < decode; ++i) {
    const float* last = out.data() + out.size() - size_t(V);
    const int32_t t = int32_t(std::max_element(last, last + V) - last);
    seq.append_all(std::span<const int32_t>(&t, 1),
                   [&](int64_t, std::span<const float> lg) { out.insert(out.end(), lg.begin(), lg.end()); });
  }
  return out;
}

TEST(CudaPlacement, DemoModelEveryPlacementEqualsTheCpuBitwise) {
  DSV4_REQUIRE_GPU();
  DeterministicScope det;
  const auto cpu_model = cached_model("dsv4-demo", Numerics::reference, false);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> d(2, cpu_model->n_vocab() - 1);
  std::vector<int32_t> ids(300);
  for (auto& t : ids) t = d(rng);
  const auto ref = demo_logits(*cpu_model, ids, 12);
  const int L = cpu_model->config().num_hidden_layers, E = cpu_model->config().n_routed_experts;
  ExpertProfile prof;
  prof.counts.assign(size_t(L), std::vector<uint64_t>(size_t(E), 0));
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e) prof.counts[size_t(l)][size_t(e)] = uint64_t((e * 5 + l) % E);
  const auto pf = std::filesystem::temp_directory_path() / ("dsv4_gpu_hot_" + std::to_string(getpid()) + ".json");
  write_expert_profile(prof, pf);
  std::vector<std::pair<std::string, PlacementOptions>> cases;
  cases.push_back({"all on the GPU", {}});
  {
    PlacementOptions p;
    p.cpu_moe = true;
    cases.push_back({"--cpu-moe", p});
  }
  for (int n = 0; n <= L; ++n) {
    PlacementOptions p;
    p.n_cpu_moe = n;
    cases.push_back({"--n-cpu-moe " + std::to_string(n), p});
  }
  {
    PlacementOptions p;
    p.gpu_experts = "3";
    p.hot_experts = pf.string();
    cases.push_back({"--gpu-experts 3 --hot-experts", p});
  }
  for (const auto& [name, p0] : cases) {
    ModelOptions o;
    o.numerics = Numerics::reference;
    o.backend = cuda();
    o.ubatch = 128;
    o.placement = p0;
    o.placement.stage_tokens = 0;  // the CPU experts on the CPU also in prefill (staged: the next test)
    auto m = Model::load(model_dir("dsv4-demo"), o);
    const int64_t r0 = m->step_graphs() ? m->step_graphs()->replays() : 0;
    const auto got = demo_logits(*m, ids, 12);
    const int64_t replays = m->step_graphs() ? m->step_graphs()->replays() - r0 : 0;
    ASSERT_EQ(got.size(), ref.size()) << name;
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) bad += ref[i] != got[i] ? 1 : 0;
    const SplitMoeStats st = m->split_stats();
    std::printf("[cuda-placement] demo %-32s %lld experts on the CPU, %lld split calls, %zu of %zu logits differ\n",
                name.c_str(), static_cast<long long>(m->placement().n_host()), static_cast<long long>(st.calls), bad,
                ref.size());
    EXPECT_EQ(bad, 0u) << name;
    if (m->placement().n_host() > 0) {
      EXPECT_GT(st.host_pairs, 0) << name;
    }
    // the layers without host experts run as recorded CUDA graph segments between the split ones
    int split_layers = 0;
    for (int l = 0; l < L; ++l) split_layers += m->placement().n_host(l) > 0;
    if (split_layers < L) {
      EXPECT_GT(replays, 0) << name << ": decode segments of unsplit layers should replay";
    }
    std::printf("[cuda-placement]   %d split layers, %lld graph replays in 12 decode steps\n", split_layers,
                static_cast<long long>(replays));
  }
  std::filesystem::remove(pf);
}

TEST(CudaPlacement, DemoModelStagedPrefillEqualsTheCpuBitwise) {
  // a 300-token prompt in ubatches of 128 (over the automatic threshold of the demo's experts: staged) + decode
  // (1 token: the CPU path), deterministic: every logit equals the CPU backend's
  DSV4_REQUIRE_GPU();
  DeterministicScope det;
  const auto cpu_model = cached_model("dsv4-demo", Numerics::reference, false);
  std::mt19937 rng(6);
  std::uniform_int_distribution<int32_t> d(2, cpu_model->n_vocab() - 1);
  std::vector<int32_t> ids(300);
  for (auto& t : ids) t = d(rng);
  const auto ref = demo_logits(*cpu_model, ids, 4);
  struct Case {
    std::string name;
    PlacementOptions p;
  };
  std::vector<Case> cases;
  for (int64_t tokens : {int64_t(-1), int64_t(1)}) {
    const std::string st = tokens < 0 ? " (--stage-tokens auto)" : " (--stage-tokens 1, 1-expert chunks)";
    PlacementOptions p;
    p.stage_tokens = tokens;
    if (tokens > 0) p.stage_bytes = 1;  // one expert per chunk
    PlacementOptions c = p;
    c.cpu_moe = true;
    cases.push_back({"--cpu-moe" + st, c});
    c = p;
    c.n_cpu_moe = 2;
    cases.push_back({"--n-cpu-moe 2" + st, c});
    c = p;
    c.gpu_experts = "3";
    cases.push_back({"--gpu-experts 3" + st, c});
  }
  for (const auto& [name, p] : cases) {
    ModelOptions o;
    o.numerics = Numerics::reference;
    o.backend = cuda();
    o.ubatch = 128;
    o.placement = p;
    auto m = Model::load(model_dir("dsv4-demo"), o);
    const auto got = demo_logits(*m, ids, 4);
    ASSERT_EQ(got.size(), ref.size()) << name;
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) bad += ref[i] != got[i] ? 1 : 0;
    const SplitMoeStats st = m->split_stats();
    ASSERT_NE(m->split_moe(), nullptr) << name;
    std::printf("[cuda-placement] demo %-44s threshold %lld tokens (mapped checkpoint %spage-locked), %lld of %lld "
                "split calls staged (%lld chunks, %.1f KB), %lld CPU pairs; %zu of %zu logits differ\n",
                name.c_str(), static_cast<long long>(m->split_moe()->stage_min_tokens()),
                m->split_moe()->host_experts_pinned() ? "" : "NOT ",
                static_cast<long long>(st.staged_calls), static_cast<long long>(st.calls),
                static_cast<long long>(st.staged_chunks), st.staged_bytes / 1e3,
                static_cast<long long>(st.host_pairs), bad, ref.size());
    EXPECT_EQ(bad, 0u) << name;
    if (p.stage_tokens < 0) {
      EXPECT_GT(m->split_moe()->stage_min_tokens(), 1) << name;
      EXPECT_LE(m->split_moe()->stage_min_tokens(), 128) << name << ": the full prefill ubatches stage";
    } else {
      EXPECT_EQ(m->split_moe()->stage_min_tokens(), 1) << name;
    }
    EXPECT_GT(st.staged_calls, 0) << name;
    if (p.stage_tokens < 0) {
      EXPECT_GT(st.host_pairs, 0) << name << ": decode steps stay on the CPU";
    }
  }
}

TEST(CudaPlacement, FullFlashPlacementsThatCannotFitAreOneLineErrors) {
  DSV4_REQUIRE_GPU();
  const std::string base = "bench model --config " + std::string(DSV4_SOURCE_DIR) +
                           "/tests/data/configs/deepseek-v4-flash-config.json --load-format dummy --device cuda "
                           "--prefill 0 --steps 1 --no-profile";
  const CliResult gpu = cli(base + " --n-cpu-moe 0");
  EXPECT_EQ(gpu.rc, 1) << gpu.out;
  EXPECT_NE(gpu.out.find("dsv4: error:"), std::string::npos) << gpu.out;
  EXPECT_NE(gpu.out.find("--gpu-experts auto"), std::string::npos) << gpu.out;
  const CliResult host = cli(base + " --cpu-moe");
  EXPECT_EQ(host.rc, 1) << host.out;
  EXPECT_NE(host.out.find("host memory"), std::string::npos) << host.out;
  for (const CliResult* r : {&gpu, &host}) {
    const size_t at = r->out.rfind("dsv4: error:");
    if (at != std::string::npos) std::printf("[cuda-placement] %s", r->out.substr(at).c_str());
  }
}

}  // namespace
}  // namespace dsv4::test::gpu
