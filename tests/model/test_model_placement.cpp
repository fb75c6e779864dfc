// Routed experts split between the device and the CPU (issue 11; model/expert_placement.h, model/split_moe.h) in the
// CPU-only build: the "device" is the CPU backend (CpuOps) and the host half a second CPU executor
// (cpu_expert_rows), so the placement machinery — masks, staging, scatter of the host rows, the fixed-order combine
// — runs as on a GPU. Checks:
// * SplitMoe == the unsplit Ops::moe BITWISE for every one of the 256 placements of an 8-expert layer and forced
//   routings (all slots to one expert, distinct, every expert, random with duplicates), reference and dense
//   numerics, 1..300 tokens;
// * the demo model: logits of a prefill + decode BITWISE equal for all on the device, --cpu-moe, every --n-cpu-moe
//   value, --gpu-experts N and a hot-expert profile, and the split really ran (stats);
// * placement resolution (auto budget, profile order) and the one-line errors (bad / mismatched profiles, bad
//   values, conflicting options, a placement that cannot fit).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu_backend.h"
#include "common/deferred_upload_queue.h"
#include "common/split_moe_fixture.h"
#include "loader/config.h"
#include "model/expert_placement.h"
#include "model/expert_staging.h"
#include "model_test_util.h"

namespace dsv4::test {
namespace {

const std::string kDemo = std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo";

std::vector<float> host(const Buffer& b, size_t n) {
  std::vector<float> v(n);
  std::memcpy(v.data(), b.data(), n * 4);
  return v;
}

TEST(SplitMoe, EveryPlacementAndRoutingEqualsTheUnsplitOpBitwise) {
  (void)tiny("tiny-a", Numerics::reference);  // single-thread policy of the model tests
  Backend& be = cpu_backend();
  SplitMoeFixture fx(be);
  const Ops& ops = be.ops();
  SplitMoe split(be);
  const float limit = 10.0f;
  int checked = 0;
  for (Numerics num : {Numerics::reference, Numerics::dense}) {
    const LinearOpts q = quantized_linear_opts(num);
    const bool bf = num == Numerics::reference;
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {3, 4}, {5, 6}}) {
      const Buffer x = fx.input(n, 11 + uint32_t(n)), w = fx.weights(n, k, 12);
      const auto pats = routing_patterns(n, k, SplitMoeFixture::E, 13);
      for (size_t pi = 0; pi < pats.size(); ++pi) {
        const Buffer ids = be.upload_vector(pats[pi], "ids");
        Buffer ref(be, size_t(n * SplitMoeFixture::D) * 4, "ref"), got(be, size_t(n * SplitMoeFixture::D) * 4, "got");
        ops.moe(fx.all_device(), x.as<float>(), n, ids.as<int32_t>(), w.as<float>(), k, limit, q, bf, ref.as<float>());
        const auto r = host(ref, size_t(n * SplitMoeFixture::D));
        for (unsigned mask = 0; mask < 256; ++mask) {
          SplitMoeFixture::Split s;
          fx.make_split(mask, s);
          std::memset(got.data(), 0xFF, got.bytes());
          split.run(ops, s.layer, SplitMoeFixture::D, x.as<float>(), n, ids.as<int32_t>(), w.as<float>(), k, limit, q,
                    bf, got.as<float>());
          const auto g = host(got, size_t(n * SplitMoeFixture::D));
          ASSERT_EQ(std::memcmp(r.data(), g.data(), r.size() * 4), 0)
              << numerics_name(num) << " n " << n << " k " << k << " pattern " << pi << " host mask " << mask;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 3 * 4 * 256);
  // the host side really ran: pairs and bytes were counted
  EXPECT_GT(split.stats().host_pairs, 0);
  EXPECT_GT(split.stats().device_pairs, 0);
  EXPECT_GT(split.stats().to_device_bytes, 0u);
}

TEST(SplitMoe, LongPromptOfRandomRoutingEqualsTheUnsplitOp) {
  (void)tiny("tiny-a", Numerics::reference);
  Backend& be = cpu_backend();
  SplitMoeFixture fx(be, 9);
  SplitMoe split(be);
  const int64_t n = 300, k = 6;
  const Buffer x = fx.input(n, 21), w = fx.weights(n, k, 22);
  const auto pats = routing_patterns(n, k, SplitMoeFixture::E, 23);
  const LinearOpts q = quantized_linear_opts(Numerics::reference);
  for (const auto& pat : {pats[2], pats[3]})
    for (unsigned mask : {0x00u, 0xFFu, 0x0Fu, 0xA5u, 0x80u}) {
      const Buffer ids = be.upload_vector(pat, "ids");
      Buffer ref(be, size_t(n * SplitMoeFixture::D) * 4, "ref"), got(be, size_t(n * SplitMoeFixture::D) * 4, "got");
      be.ops().moe(fx.all_device(), x.as<float>(), n, ids.as<int32_t>(), w.as<float>(), k, 10.0f, q, true,
                   ref.as<float>());
      SplitMoeFixture::Split s;
      fx.make_split(mask, s);
      split.run(be.ops(), s.layer, SplitMoeFixture::D, x.as<float>(), n, ids.as<int32_t>(), w.as<float>(), k, 10.0f,
                q, true, got.as<float>());
      EXPECT_EQ(std::memcmp(ref.data(), got.data(), ref.bytes()), 0) << "host mask " << mask;
    }
}

// ---- the staged path (model/expert_staging.h): host experts streamed to the "device" in slot-sized chunks --------

// One fixture expert's footprint in a staging slot: w1, w3, w2 (FP4 [128, 128]: 8 KiB + 512 B of scales each).
constexpr size_t kFixtureExpertSlotBytes = 3 * (8192 + 512);

// A staged SplitMoe: every call of >= min_tokens tokens stages; slot_bytes per slot; optionally the deferred queue.
std::unique_ptr<SplitMoe> staged_split(Backend& be, int64_t min_tokens, size_t slot_bytes, bool deferred) {
  SplitMoeOptions o;
  o.stage_min_tokens = min_tokens;
  o.stage_slot_bytes = slot_bytes;
  auto s = std::make_unique<SplitMoe>(be, o);
  if (deferred) s->staging()->set_upload_queue(std::make_unique<DeferredUploadQueue>(ExpertStaging::kSlots));
  return s;
}

TEST(SplitMoe, StagedPathEqualsTheUnsplitOpBitwiseForEveryPlacementAndRouting) {
  (void)tiny("tiny-a", Numerics::reference);
  Backend& be = cpu_backend();
  SplitMoeFixture fx(be);
  const Ops& ops = be.ops();
  // slots of one expert, of three (chunks smaller than a layer's host experts), of the whole layer; the in-order
  // queue (copies at once) and the deferred one (copies as late as the protocol allows)
  struct Config {
    size_t slot;
    bool deferred;
    int64_t per_chunk;
  };
  const std::vector<Config> configs{{1, true, 1},
                                    {3 * kFixtureExpertSlotBytes, false, 3},
                                    {3 * kFixtureExpertSlotBytes, true, 3},
                                    {size_t(1) << 20, false, 8}};
  int checked = 0;
  for (const Config& cf : configs) {
    auto split = staged_split(be, 1, cf.slot, cf.deferred);
    int64_t chunks_expected = 0, unsplit_calls = 0;
    for (Numerics num : {Numerics::reference, Numerics::dense}) {
      const LinearOpts q = quantized_linear_opts(num);
      const bool bf = num == Numerics::reference;
      for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {3, 4}, {5, 6}}) {
        const Buffer x = fx.input(n, 11 + uint32_t(n)), w = fx.weights(n, k, 12);
        const auto pats = routing_patterns(n, k, SplitMoeFixture::E, 13);
        for (size_t pi = 0; pi < pats.size(); ++pi) {
          const Buffer ids = be.upload_vector(pats[pi], "ids");
          Buffer ref(be, size_t(n * SplitMoeFixture::D) * 4, "ref"), got(be, size_t(n * SplitMoeFixture::D) * 4, "got");
          ops.moe(fx.all_device(), x.as<float>(), n, ids.as<int32_t>(), w.as<float>(), k, 10.0f, q, bf,
                  ref.as<float>());
          for (unsigned mask = 0; mask < 256; mask += (cf.deferred ? 1 : 3)) {
            SplitMoeFixture::Split s;
            fx.make_split(mask, s);
            split->attach(s.layer);
            const int64_t nh = s.layer.n_host;
            ASSERT_EQ(s.layer.stage != nullptr, nh > 0) << mask;
            if (nh > 0) {
              const int64_t want = (nh + cf.per_chunk - 1) / cf.per_chunk;
              ASSERT_EQ(int64_t(s.layer.stage->chunks.size()), want) << "slot " << cf.slot << " mask " << mask;
              chunks_expected += want;
            } else {
              ++unsplit_calls;
            }
            std::memset(got.data(), 0xFF, got.bytes());
            split->run(ops, s.layer, SplitMoeFixture::D, x.as<float>(), n, ids.as<int32_t>(), w.as<float>(), k,
                       10.0f, q, bf, got.as<float>());
            ASSERT_EQ(std::memcmp(ref.data(), got.data(), ref.bytes()), 0)
                << numerics_name(num) << " n " << n << " k " << k << " pattern " << pi << " host mask " << mask
                << " slot " << cf.slot << (cf.deferred ? " deferred" : " in order");
            ++checked;
          }
        }
      }
    }
    const SplitMoeStats st = split->stats();
    EXPECT_EQ(st.host_pairs, 0) << "the CPU path ran";
    EXPECT_EQ(st.staged_calls, st.calls - unsplit_calls);  // mask 0: no host expert, nothing to stage
    EXPECT_EQ(st.staged_chunks, chunks_expected);
    EXPECT_GT(st.staged_bytes, 0u);
  }
  EXPECT_GT(checked, 2 * 3 * 4 * 256);
}

TEST(SplitMoe, StagedLongPromptAndTheThreshold) {
  (void)tiny("tiny-a", Numerics::reference);
  Backend& be = cpu_backend();
  SplitMoeFixture fx(be, 9);
  const int64_t n = 300, k = 6;
  const Buffer x = fx.input(n, 21), w = fx.weights(n, k, 22);
  const auto pats = routing_patterns(n, k, SplitMoeFixture::E, 23);
  const LinearOpts q = quantized_linear_opts(Numerics::reference);
  for (bool deferred : {false, true}) {
    auto split = staged_split(be, 1, 2 * kFixtureExpertSlotBytes, deferred);
    for (const auto& pat : {pats[2], pats[3]})
      for (unsigned mask : {0x00u, 0xFFu, 0x0Fu, 0xA5u, 0x80u, 0x7Eu}) {
        const Buffer ids = be.upload_vector(pat, "ids");
        Buffer ref(be, size_t(n * SplitMoeFixture::D) * 4, "ref"), got(be, size_t(n * SplitMoeFixture::D) * 4, "got");
        be.ops().moe(fx.all_device(), x.as<float>(), n, ids.as<int32_t>(), w.as<float>(), k, 10.0f, q, true,
                     ref.as<float>());
        SplitMoeFixture::Split s;
        fx.make_split(mask, s);
        split->attach(s.layer);
        split->run(be.ops(), s.layer, SplitMoeFixture::D, x.as<float>(), n, ids.as<int32_t>(), w.as<float>(), k,
                   10.0f, q, true, got.as<float>());
        EXPECT_EQ(std::memcmp(ref.data(), got.data(), ref.bytes()), 0) << "host mask " << mask << " deferred "
                                                                        << deferred;
      }
  }
  // the threshold: calls below it run the host experts on the CPU, calls at it stage them
  auto split = staged_split(be, 100, size_t(1) << 20, false);
  SplitMoeFixture::Split s;
  fx.make_split(0xF0u, s);
  split->attach(s.layer);
  for (int64_t m : {int64_t(99), int64_t(100)}) {
    const Buffer ids = be.upload_vector(std::vector<int32_t>(pats[3].begin(), pats[3].begin() + m * k), "ids");
    Buffer ref(be, size_t(m * SplitMoeFixture::D) * 4, "ref"), got(be, size_t(m * SplitMoeFixture::D) * 4, "got");
    be.ops().moe(fx.all_device(), x.as<float>(), m, ids.as<int32_t>(), w.as<float>(), k, 10.0f, q, true,
                 ref.as<float>());
    split->reset_stats();
    split->run(be.ops(), s.layer, SplitMoeFixture::D, x.as<float>(), m, ids.as<int32_t>(), w.as<float>(), k, 10.0f,
               q, true, got.as<float>());
    EXPECT_EQ(std::memcmp(ref.data(), got.data(), ref.bytes()), 0) << m;
    const SplitMoeStats st = split->stats();
    EXPECT_EQ(st.calls, 1);
    EXPECT_EQ(st.staged_calls, m >= 100 ? 1 : 0) << m;
    EXPECT_EQ(st.host_pairs > 0, m < 100) << m;
    EXPECT_EQ(st.staged_bytes, m >= 100 ? 4 * kFixtureExpertSlotBytes : 0u) << m;
  }
}

TEST(SplitMoe, StagingProtocolViolationsAreCaught) {
  // a copy into a slot the device may still be reading is refused (the CPU's stand-in for a copy-stream race)
  Backend& be = cpu_backend();
  auto q = be.make_upload_queue(2);
  std::vector<uint8_t> src(64, 7), dst(64, 0);
  q->copy(0, dst.data(), src.data(), 64);
  q->filled(0);
  q->copy(1, dst.data(), src.data(), 32);  // the other slot: fine
  EXPECT_THROW(q->copy(0, dst.data(), src.data(), 64), Error);
  q->consumed(0);
  q->copy(0, dst.data(), src.data(), 64);
  EXPECT_THROW(q->copy(2, dst.data(), src.data(), 1), Error);
  EXPECT_THROW(q->filled(-1), Error);
  EXPECT_EQ(q->bytes(), 64u * 2 + 32u);
  EXPECT_EQ(dst[0], 7);
  // the deferred test queue copies only at filled(): what the staged tests rely on
  DeferredUploadQueue d(2);
  std::vector<uint8_t> out(8, 0), in(8, 5);
  d.copy(1, out.data(), in.data(), 8);
  EXPECT_EQ(out[0], 0);
  d.filled(0);
  EXPECT_EQ(out[0], 0);
  d.filled(1);
  EXPECT_EQ(out[0], 5);
}

TEST(SplitMoe, StagingCostModel) {
  // V4-Flash: 256 experts, top-6, FP4 w1 / w3 [2048, 4096] and w2 [4096, 2048] with E8M0 scales per 32
  const double bytes = 3.0 * (2048.0 * 4096 / 2 + 2048.0 * 4096 / 32), macs = 3.0 * 2048 * 4096;
  EXPECT_EQ(auto_stage_min_tokens(256, 6, bytes, macs, kPinnedUploadBytesPerS), 227);
  // slower uploads (memory that is not page-locked): later
  EXPECT_GT(auto_stage_min_tokens(256, 6, bytes, macs, kPageableUploadBytesPerS), 227 * 3);
  EXPECT_EQ(auto_stage_min_tokens(0, 6, bytes, macs, kPinnedUploadBytesPerS), 1);
  // the device bytes of the two slots: at least one expert each
  SplitMoeOptions o;
  EXPECT_EQ(SplitMoe::staging_device_bytes(o, 1000), 0u);  // off
  o.stage_min_tokens = -1;
  o.stage_slot_bytes = 100;
  EXPECT_EQ(SplitMoe::staging_device_bytes(o, 1000), 2u * (1000 + 6 * 256));
  o.stage_slot_bytes = size_t(256) << 20;
  EXPECT_EQ(SplitMoe::staging_device_bytes(o, 1000), size_t(512) << 20);
}

// The page-locking budget of host experts: V4-Flash's ~70-76 GiB of host experts on the GPU machine's 125 GiB host
// are pinned (they were not under the earlier half-of-RAM rule, and staged copies then ran at 8 GB/s); a small host
// keeps 16 GiB pageable; an unknown host size does not limit.
TEST(ExpertStagingPolicy, PinBudget) {
  constexpr double G = 1024.0 * 1024 * 1024;
  EXPECT_TRUE(pin_host_fits(75.86 * G, 125.0 * G));
  EXPECT_TRUE(pin_host_fits(93.0 * G, 125.0 * G));
  EXPECT_FALSE(pin_host_fits(94.0 * G, 125.0 * G));   // more than 3/4
  EXPECT_FALSE(pin_host_fits(40.0 * G, 48.0 * G));    // 8 GiB would stay pageable
  EXPECT_TRUE(pin_host_fits(32.0 * G, 48.0 * G));
  EXPECT_TRUE(pin_host_fits(1e15, 0.0));
}

// ---- the demo model under every placement ------------------------------------------------------------------------

struct DemoRun {
  std::vector<float> logits;  // prefill positions, then decode steps
  SplitMoeStats stats;
  int64_t n_host = 0;
};

DemoRun run_demo(const PlacementOptions& p) {
  (void)tiny("tiny-a", Numerics::reference);
  ModelOptions o;
  o.numerics = Numerics::reference;
  o.ubatch = 48;  // several ubatches per prefill
  o.placement = p;
  auto m = Model::load(kDemo, o);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> d(2, m->n_vocab() - 1);
  std::vector<int32_t> prompt(100);
  for (auto& t : prompt) t = d(rng);
  DemoRun r;
  const int64_t V = m->n_vocab();
  SequenceState st = m->fresh_state();
  auto keep = [&](int64_t, std::span<const float> lg) { r.logits.insert(r.logits.end(), lg.begin(), lg.end()); };
  m->forward(st, prompt, [](int64_t) { return true; }, keep);
  for (int i = 0; i < 4; ++i) {  // decode: the greedy token of the last logits
    const float* last = r.logits.data() + r.logits.size() - size_t(V);
    const int32_t t = int32_t(std::max_element(last, last + V) - last);
    m->forward(st, std::span<const int32_t>(&t, 1), [](int64_t) { return true; }, keep);
  }
  r.stats = m->split_stats();
  r.n_host = m->placement().n_host();
  return r;
}

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("dsv4_placement_" + std::to_string(getpid()) + "_" + name);
}

TEST(DemoPlacement, EveryPlacementGivesBitwiseEqualLogits) {
  const DemoRun ref = run_demo({});
  ASSERT_EQ(ref.n_host, 0);
  EXPECT_EQ(ref.stats.calls, 0);
  const ModelConfig cfg = load_config(kDemo + "/config.json");
  const int L = cfg.num_hidden_layers, E = cfg.n_routed_experts;
  // a hot-expert profile with a skewed made-up usage
  ExpertProfile prof;
  prof.model = "dsv4-demo";
  prof.counts.assign(size_t(L), std::vector<uint64_t>(size_t(E), 0));
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e) prof.counts[size_t(l)][size_t(e)] = uint64_t((e * 7 + l * 3) % E) * 10;
  const auto pf = temp_file("hot.json");
  write_expert_profile(prof, pf);
  struct Case {
    std::string name;
    PlacementOptions p;
    int64_t n_host;
  };
  std::vector<Case> cases;
  {
    PlacementOptions p;
    p.cpu_moe = true;
    cases.push_back({"--cpu-moe", p, int64_t(L) * E});
  }
  for (int n = 0; n <= L; ++n) {
    PlacementOptions p;
    p.n_cpu_moe = n;
    cases.push_back({"--n-cpu-moe " + std::to_string(n), p, int64_t(n) * E});
  }
  {
    PlacementOptions p;
    p.gpu_experts = "3";
    cases.push_back({"--gpu-experts 3", p, int64_t(L) * (E - 3)});
    p.hot_experts = pf.string();
    cases.push_back({"--gpu-experts 3 --hot-experts", p, int64_t(L) * (E - 3)});
    p.gpu_experts = "";
    cases.push_back({"--hot-experts (auto: all fit)", p, 0});
  }
  for (const Case& c : cases) {
    const DemoRun r = run_demo(c.p);
    EXPECT_EQ(r.n_host, c.n_host) << c.name;
    ASSERT_EQ(r.logits.size(), ref.logits.size()) << c.name;
    EXPECT_EQ(std::memcmp(r.logits.data(), ref.logits.data(), ref.logits.size() * 4), 0) << c.name;
    if (c.n_host > 0) {
      EXPECT_GT(r.stats.calls, 0) << c.name;
      EXPECT_GT(r.stats.host_pairs, 0) << c.name;
    } else {
      EXPECT_EQ(r.stats.calls, 0) << c.name;
    }
    EXPECT_EQ(r.stats.staged_calls, 0) << c.name << ": the CPU backend stages only when told (--stage-tokens)";
  }
  std::filesystem::remove(pf);
}

TEST(DemoPlacement, StagedCallsGiveBitwiseEqualLogits) {
  const DemoRun ref = run_demo({});
  struct Case {
    std::string name;
    PlacementOptions p;
    int64_t host_per_layer;  // host experts of every split layer
  };
  std::vector<Case> cases;
  {
    PlacementOptions p;
    p.cpu_moe = true;
    cases.push_back({"--cpu-moe", p, 8});
    p = {};
    p.n_cpu_moe = 3;
    cases.push_back({"--n-cpu-moe 3", p, 8});
    p = {};
    p.gpu_experts = "5";
    cases.push_back({"--gpu-experts 5", p, 3});
  }
  // every call staged, one expert per chunk (the slot is sized up to one expert) or a few; prefill ubatches
  // (48 tokens) staged, decode on the CPU
  struct Stage {
    int64_t tokens, bytes;
    bool decode_on_cpu;
  };
  for (const Stage& st : {Stage{1, 1, false}, Stage{1, 60000, false}, Stage{40, int64_t(1) << 20, true}})
    for (Case c : cases) {
      c.p.stage_tokens = st.tokens;
      c.p.stage_bytes = st.bytes;
      const DemoRun r = run_demo(c.p);
      const std::string name = c.name + " --stage-tokens " + std::to_string(st.tokens) + ", " +
                               std::to_string(st.bytes) + "-byte slots";
      ASSERT_EQ(r.logits.size(), ref.logits.size()) << name;
      EXPECT_EQ(std::memcmp(r.logits.data(), ref.logits.data(), ref.logits.size() * 4), 0) << name;
      EXPECT_GT(r.stats.staged_calls, 0) << name;
      EXPECT_GT(r.stats.staged_bytes, 0u) << name;
      EXPECT_EQ(r.stats.host_pairs > 0, st.decode_on_cpu) << name;
      // chunks per staged call: one per host expert with 1-byte slots, fewer with room for several
      if (st.bytes == 1) EXPECT_EQ(r.stats.staged_chunks, c.host_per_layer * r.stats.staged_calls) << name;
      else EXPECT_LT(r.stats.staged_chunks, c.host_per_layer * r.stats.staged_calls) << name;
    }
}

// ---- placement resolution and errors -----------------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ExpertPlacement, ResolvesEveryOption) {
  const ModelConfig cfg = load_config(kDemo + "/config.json");  // 6 layers x 8 experts
  PlacementOptions p;
  EXPECT_TRUE(resolve_placement(cfg, p, 100, 0).all_device());
  p.n_cpu_moe = 2;
  ExpertPlacement pl = resolve_placement(cfg, p, 100, 0);
  for (int l = 0; l < 6; ++l) EXPECT_EQ(pl.n_host(l), l >= 4 ? 8 : 0) << l;
  p = {};
  p.gpu_experts = "auto";
  pl = resolve_placement(cfg, p, 100, 100 * 19 + 50);  // room for 19 experts: layers 0, 1 and 3 of layer 2
  EXPECT_EQ(pl.n_host(), 48 - 19);
  EXPECT_EQ(pl.n_host(0), 0);
  EXPECT_EQ(pl.n_host(1), 0);
  EXPECT_EQ(pl.n_host(2), 5);
  EXPECT_FALSE(pl.on_host(2, 2));
  EXPECT_TRUE(pl.on_host(2, 3));
  EXPECT_EQ(pl.n_host(5), 8);
  // a profile: the most used (layer, expert) pairs first
  ExpertProfile prof;
  prof.counts.assign(6, std::vector<uint64_t>(8, 1));
  prof.counts[5][7] = 100;
  prof.counts[4][1] = 90;
  prof.counts[0][0] = 80;
  const auto pf = temp_file("order.json");
  write_expert_profile(prof, pf);
  p.hot_experts = pf.string();
  pl = resolve_placement(cfg, p, 100, 100 * 3);
  EXPECT_EQ(pl.n_host(), 45);
  EXPECT_FALSE(pl.on_host(5, 7));
  EXPECT_FALSE(pl.on_host(4, 1));
  EXPECT_FALSE(pl.on_host(0, 0));
  p.gpu_experts = "1";  // the most used expert of each layer
  pl = resolve_placement(cfg, p, 100, 0);
  EXPECT_FALSE(pl.on_host(5, 7));
  EXPECT_FALSE(pl.on_host(4, 1));
  EXPECT_FALSE(pl.on_host(1, 0));  // ties: the lower id
  EXPECT_EQ(pl.n_host(), 6 * 7);
  const ExpertProfile back = read_expert_profile(pf);
  EXPECT_EQ(back.counts, prof.counts);
  // a profile of this model's dimensions (as dsv4 profile-experts records them) is accepted, and they round-trip
  prof.top_k = cfg.num_experts_per_tok;
  prof.hidden_size = cfg.hidden_size;
  prof.vocab_size = cfg.vocab_size;
  prof.model = "dsv4-demo";
  write_expert_profile(prof, pf);
  const ExpertProfile same = read_expert_profile(pf);
  EXPECT_EQ(same.top_k, 2);
  EXPECT_EQ(same.hidden_size, cfg.hidden_size);
  EXPECT_EQ(same.vocab_size, cfg.vocab_size);
  EXPECT_EQ(same.model, "dsv4-demo");
  p.gpu_experts = "1";
  EXPECT_EQ(resolve_placement(cfg, p, 100, 0).n_host(), 6 * 7);
  std::filesystem::remove(pf);
}

TEST(ExpertPlacement, BadOptionsAndProfilesAreOneLineErrors) {
  const ModelConfig cfg = load_config(kDemo + "/config.json");
  auto write = [&](const std::string& name, const std::string& text) {
    const auto f = temp_file(name);
    std::ofstream(f) << text;
    return f.string();
  };
  ExpertProfile seven;
  seven.counts.assign(7, std::vector<uint64_t>(8, 1));
  const auto f7 = temp_file("seven.json");
  write_expert_profile(seven, f7);
  ExpertProfile nine;
  nine.counts.assign(6, std::vector<uint64_t>(8, 1));
  nine.counts[3].push_back(5);
  const auto f9 = temp_file("nine.json");
  write_expert_profile(nine, f9);
  struct Case {
    PlacementOptions p;
    int64_t budget;
    std::string needle;
  };
  std::vector<Case> cases;
  auto add = [&](auto set, int64_t budget, const std::string& needle) {
    PlacementOptions p;
    set(p);
    cases.push_back({p, budget, needle});
  };
  add([](PlacementOptions& p) { p.n_cpu_moe = 7; }, 0, "--n-cpu-moe 7: the model has 6 layers");
  add([](PlacementOptions& p) { p.cpu_moe = true, p.n_cpu_moe = 1; }, 0, "give one of them");
  add([](PlacementOptions& p) { p.n_cpu_moe = 1, p.gpu_experts = "auto"; }, 0, "give one of them");
  add([](PlacementOptions& p) { p.gpu_experts = "many"; }, 0, "--gpu-experts must be auto or a number");
  add([](PlacementOptions& p) { p.gpu_experts = "9"; }, 0, "0 .. 8");
  add([](PlacementOptions& p) { p.gpu_experts = "auto"; }, -5 << 20, "need 0.00 GiB more than the device has free");
  add([&](PlacementOptions& p) { p.hot_experts = f7.string(); }, 1 << 20, "layer 6 does not exist");
  add([&](PlacementOptions& p) { p.hot_experts = f9.string(); }, 1 << 20, "expert 8 does not exist");
  add([&](PlacementOptions& p) { p.hot_experts = "/nonexistent/profile.json"; }, 1 << 20, "cannot open");
  add([&](PlacementOptions& p) { p.hot_experts = write("notjson", "{oops"); }, 1 << 20, "not JSON");
  add([&](PlacementOptions& p) {  // deep nesting: printing the field in the message recursed once per level
    p.hot_experts = write("deep", R"({"format":"dsv4-expert-profile","counts":[],"version":)" +
                                      std::string(300000, '[') + std::string(300000, ']') + "}");
  }, 1 << 20, "nested deeper than");
  add([&](PlacementOptions& p) { p.hot_experts = write("other", "{\"format\": \"x\"}"); }, 1 << 20,
      "not an expert profile");
  add([&](PlacementOptions& p) { p.hot_experts = write("neg", R"({"format":"dsv4-expert-profile","counts":[[1,-2]]})"); },
      1 << 20, "not a count");
  add([&](PlacementOptions& p) {  // fewer layers than the model: another model's profile
    p.hot_experts = write("short", R"({"format":"dsv4-expert-profile","version":1,"counts":[[1,2,3,4,5,6,7,8]]})");
  }, 1 << 20, "the profile has 1 layers but the model 6");
  add([&](PlacementOptions& p) {
    p.hot_experts = write("v2", R"({"format":"dsv4-expert-profile","version":2,"counts":[]})");
  }, 1 << 20, "profile version 2");
  // a profile of another model with the same 6 layers x 8 experts (its other dimensions differ), or an edited one
  // whose header disagrees with its counts: one line naming the difference, never a placement
  const std::string rows6 = nlohmann::json(std::vector<std::vector<int>>(6, {1, 2, 3, 4, 5, 6, 7, 8})).dump();
  auto prof6 = [&](const std::string& name, const std::string& fields) {
    return write(name, R"({"format":"dsv4-expert-profile","version":1,)" + fields + R"("counts":)" + rows6 + "}");
  };
  add([&](PlacementOptions& p) { p.hot_experts = prof6("topk", R"("model":"other-model","top_k":6,)"); }, 1 << 20,
      "recorded on a model with top_k 6 but this model has 2 (a profile of another model, 'other-model'");
  add([&](PlacementOptions& p) { p.hot_experts = prof6("hidden", R"("top_k":2,"hidden_size":4096,)"); }, 1 << 20,
      "hidden_size 4096 but this model has " + std::to_string(cfg.hidden_size));
  add([&](PlacementOptions& p) { p.hot_experts = prof6("vocab", R"("vocab_size":102400,)"); }, 1 << 20,
      "vocab_size 102400 but this model has " + std::to_string(cfg.vocab_size));
  add([&](PlacementOptions& p) { p.hot_experts = prof6("nl", R"("n_layers":43,)"); }, 1 << 20,
      "\"n_layers\" is 43 but \"counts\" has 6 rows");
  add([&](PlacementOptions& p) { p.hot_experts = prof6("ne", R"("n_experts":256,)"); }, 1 << 20,
      "\"n_experts\" is 256 but counts[0] has 8");
  add([&](PlacementOptions& p) { p.hot_experts = prof6("tkstr", R"("top_k":"6",)"); }, 1 << 20,
      "\"top_k\" is \"6\", not a count");
  add([&](PlacementOptions& p) { p.hot_experts = prof6("model", R"("model":7,)"); }, 1 << 20,
      "\"model\" is 7, not a name");
  for (const Case& c : cases) {
    const std::string msg = error_of([&] { (void)resolve_placement(cfg, c.p, 100, c.budget); });
    EXPECT_NE(msg.find(c.needle), std::string::npos) << "got: '" << msg << "' want: " << c.needle;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // through Model::load as well
  ModelOptions o;
  o.placement.n_cpu_moe = 9;
  EXPECT_NE(error_of([&] { (void)Model::load(kDemo, o); }).find("--n-cpu-moe 9"), std::string::npos);
  o.placement = {};
  o.placement.hot_experts = f9.string();
  EXPECT_NE(error_of([&] { (void)Model::load(kDemo, o); }).find("expert 8 does not exist"), std::string::npos);
  std::filesystem::remove(f7);
  std::filesystem::remove(f9);
}

}  // namespace
}  // namespace dsv4::test
