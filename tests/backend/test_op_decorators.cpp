// The op decorators' base (backend/forwarding_ops.h) and the benchmarks' two decorators (ProfiledOps: `bench
// model`'s per-op breakdown; TimelineOps: `bench model --timeline`) over an Ops that records its calls, for every
// Ops method: the wrapped Ops gets the call once, as itself (ProfiledOps: the three older composites as their
// parts, the branch calls not at all), inside the hook, under the names and sizes that the benchmark's JSON and the
// timeline's rows show (other tools read them: they must not change). An op added to Ops gets a case in every_op().
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/profiled_ops.h"
#include "backend/timeline_ops.h"

namespace dsv4 {
namespace {

using Calls = std::vector<std::string>;

// Records the name of every method called; computes nothing (the pointers are never read).
class RecordingOps final : public Ops {
 public:
  mutable Calls calls;
  void branch_begin() const override { calls.push_back("branch_begin"); }
  void branch_end() const override { calls.push_back("branch_end"); }
  void branch_join() const override { calls.push_back("branch_join"); }
  void linear(const WeightView&, const float*, int64_t, float*, const LinearOpts&) const override {
    calls.push_back("linear");
  }
  void linear_grouped(const WeightView&, const float*, int64_t, int64_t, float*, const LinearOpts&) const override {
    calls.push_back("linear_grouped");
  }
  void linear_pair(const WeightView&, const WeightView&, const float*, int64_t, float*, float*,
                   const LinearOpts&) const override {
    calls.push_back("linear_pair");
  }
  void linear_check_finite(const WeightView&, const float*, int64_t, float*, const LinearOpts&,
                           int32_t*) const override {
    calls.push_back("linear_check_finite");
  }
  void fill(float*, int64_t, float) const override { calls.push_back("fill"); }
  void round_bf16(float*, int64_t) const override { calls.push_back("round_bf16"); }
  void scale(float*, int64_t, float, bool) const override { calls.push_back("scale"); }
  void embed(const WeightView&, const int32_t*, int64_t, int, float*) const override { calls.push_back("embed"); }
  void rmsnorm(const float*, int64_t, int64_t, const float*, float, bool, float*) const override {
    calls.push_back("rmsnorm");
  }
  void head_rms(float*, int64_t, int64_t, float, bool) const override { calls.push_back("head_rms"); }
  void rope(float*, int64_t, int64_t, int64_t, int64_t, const float*, bool, bool) const override {
    calls.push_back("rope");
  }
  void head_rms_rope(float*, int64_t, int64_t, int64_t, float, int64_t, const float*, bool) const override {
    calls.push_back("head_rms_rope");
  }
  void norm_rope_fp8(float*, int64_t, int64_t, const float*, float, int64_t, const float*, bool, const int32_t*,
                     float*, const int32_t*, int64_t) const override {
    calls.push_back("norm_rope_fp8");
  }
  void rope_hadamard_fp4(float*, int64_t, int64_t, int64_t, int64_t, const float*) const override {
    calls.push_back("rope_hadamard_fp4");
  }
  void fp8_sim(float*, int64_t, int64_t, int64_t, int64_t) const override { calls.push_back("fp8_sim"); }
  void fp4_sim(float*, int64_t, int64_t) const override { calls.push_back("fp4_sim"); }
  void hadamard(float*, int64_t, int64_t, bool) const override { calls.push_back("hadamard"); }
  void check_finite(const float*, int64_t, int64_t, int32_t*) const override { calls.push_back("check_finite"); }
  void gather_rows(const float*, int64_t, const float*, const int32_t*, int64_t, int64_t, float*) const override {
    calls.push_back("gather_rows");
  }
  void scatter_rows(const float*, const int32_t*, float*, const int32_t*, int64_t, int64_t) const override {
    calls.push_back("scatter_rows");
  }
  void add_rows(float*, int64_t, int64_t, const float*, const int32_t*) const override { calls.push_back("add_rows"); }
  void frontier_update(const float*, float*, int64_t, const float*, const int32_t*, float*, float*, const int32_t*,
                       const int32_t*, int64_t, int64_t) const override {
    calls.push_back("frontier_update");
  }
  void encode_rows(const float*, int64_t, const RowCodec&, float*) const override { calls.push_back("encode_rows"); }
  void hc_pre(const float*, int64_t, int, int64_t, const float*, const float*, const float*, int, float, float, bool,
              float*, float*, float*) const override {
    calls.push_back("hc_pre");
  }
  void hc_pre_norm(const float*, int64_t, int, int64_t, const float*, const float*, const float*, int, float, float,
                   bool, const float*, float*, float*, float*) const override {
    calls.push_back("hc_pre_norm");
  }
  void hc_post(const float*, const float*, const float*, const float*, int64_t, int, int64_t, bool,
               float*) const override {
    calls.push_back("hc_post");
  }
  void hc_head(const float*, int64_t, int, int64_t, const float*, const float*, const float*, float, float, bool,
               float*) const override {
    calls.push_back("hc_head");
  }
  void sparse_attention(const float*, int64_t, int64_t, const KvRows&, const int32_t*, int64_t, const int32_t*,
                        int64_t, const float*, float, bool, float*) const override {
    calls.push_back("sparse_attention");
  }
  void sparse_attention_rope(const float*, int64_t, int64_t, const KvRows&, const int32_t*, int64_t, const int32_t*,
                             int64_t, const float*, float, bool, int64_t, const float*, float*) const override {
    calls.push_back("sparse_attention_rope");
  }
  void compress_pool(const float*, const float*, int64_t, const float*, const float*, const int32_t*, int64_t,
                     int64_t, int, int64_t, float*) const override {
    calls.push_back("compress_pool");
  }
  void indexer_topk(const float*, int64_t, int64_t, int64_t, const PagedRows&, const int32_t*, int64_t, const float*,
                    int64_t, bool, int32_t*) const override {
    calls.push_back("indexer_topk");
  }
  void route(const float*, int64_t, int64_t, int64_t, const float*, const int32_t*, const int32_t*, float, int32_t*,
             float*) const override {
    calls.push_back("route");
  }
  void swiglu(const float*, const float*, int64_t, int64_t, float, const float*, bool, float*) const override {
    calls.push_back("swiglu");
  }
  void moe(const MoeWeights&, const float*, int64_t, const int32_t*, const float*, int64_t, float, const LinearOpts&,
           bool, float*) const override {
    calls.push_back("moe");
  }
  void route_moe(const float*, int64_t, const float*, const int32_t*, const int32_t*, float, const MoeWeights&,
                 const float*, int64_t, int64_t, float, const LinearOpts&, bool, int32_t*, float*,
                 float*) const override {
    calls.push_back("route_moe");
  }
  void moe_resident(const MoeWeights&, const uint8_t*, const float*, int64_t, const int32_t*, const float*, int64_t,
                    float, const LinearOpts&, bool, float*, float*) const override {
    calls.push_back("moe_resident");
  }
  void moe_combine(const float*, const int32_t*, int64_t, int64_t, int64_t, const float*, bool,
                   float*) const override {
    calls.push_back("moe_combine");
  }
};

WeightView weight(GemmFormat f, int64_t rows, int64_t cols) {
  WeightView w;
  w.fmt = f;
  w.rows = rows;
  w.cols = cols;
  return w;
}

// One Ops method called with distinct sizes, and what each decorator makes of it.
struct Case {
  std::string op;                      // the Ops method
  std::function<void(const Ops&)> call;
  std::string row;                     // TimelineOps: the row's op name
  int64_t n = 0, a = 0, b = 0;         // ... and its sizes
  Calls profiled_calls;                // ProfiledOps: what the wrapped Ops gets
  Calls profile;                       // ProfiledOps: the names timed, once each
};

// An op timed and traced as itself.
Case plain(std::string op, std::function<void(const Ops&)> call, int64_t n, int64_t a = 0, int64_t b = 0) {
  return {op, std::move(call), op, n, a, b, {op}, {op}};
}
// A linear: the row names its kind and weight format; the profile sums every kind by format.
Case linear(std::string op, const char* fmt, std::function<void(const Ops&)> call, int64_t n, int64_t a, int64_t b) {
  return {op, std::move(call), op + " " + fmt, n, a, b, {op}, {std::string("linear ") + fmt}};
}
// A composite that ProfiledOps leaves to Ops' default: timed as its parts.
Case split(std::string op, std::function<void(const Ops&)> call, int64_t n, int64_t a, int64_t b, Calls parts) {
  return {op, std::move(call), op, n, a, b, parts, parts};
}

std::vector<Case> every_op() {
  static const WeightView w8 = weight(GemmFormat::fp8, 256, 128), w4 = weight(GemmFormat::fp4, 64, 96),
                          w16 = weight(GemmFormat::bf16, 32, 48), w32 = weight(GemmFormat::f32, 16, 24);
  static const LinearOpts lo;
  static const KvRows kv;
  static const PagedRows keys;
  static const RowCodec codec;
  static MoeWeights moe_w;
  moe_w.n_experts = 9;
  return {
      linear("linear", "fp8", [](const Ops& o) { o.linear(w8, nullptr, 3, nullptr, lo); }, 3, 256, 128),
      linear("linear_pair", "bf16", [](const Ops& o) { o.linear_pair(w16, w32, nullptr, 4, nullptr, nullptr, lo); },
             4, 48, 48),
      linear("linear_grouped", "fp4", [](const Ops& o) { o.linear_grouped(w4, nullptr, 5, 2, nullptr, lo); }, 5, 64,
             96),
      linear("linear_check_finite", "f32",
             [](const Ops& o) { o.linear_check_finite(w32, nullptr, 6, nullptr, lo, nullptr); }, 6, 16, 24),
      plain("fill", [](const Ops& o) { o.fill(nullptr, 7, 0.0f); }, 7),
      plain("round_bf16", [](const Ops& o) { o.round_bf16(nullptr, 8); }, 8),
      plain("scale", [](const Ops& o) { o.scale(nullptr, 9, 2.0f, true); }, 9),
      plain("embed", [](const Ops& o) { o.embed(w16, nullptr, 10, 4, nullptr); }, 10, 32, 48),
      plain("rmsnorm", [](const Ops& o) { o.rmsnorm(nullptr, 11, 64, nullptr, 1e-6f, true, nullptr); }, 11),
      plain("head_rms", [](const Ops& o) { o.head_rms(nullptr, 12, 64, 1e-6f, true); }, 12),
      plain("rope", [](const Ops& o) { o.rope(nullptr, 13, 2, 64, 16, nullptr, false, true); }, 13),
      split("head_rms_rope", [](const Ops& o) { o.head_rms_rope(nullptr, 14, 2, 64, 1e-6f, 16, nullptr, true); },
            14, 0, 0, {"head_rms", "rope"}),
      plain("norm_rope_fp8",
            [](const Ops& o) {
              o.norm_rope_fp8(nullptr, 36, 64, nullptr, 1e-6f, 16, nullptr, true, nullptr, nullptr, nullptr, 2);
            },
            36),
      plain("rope_hadamard_fp4", [](const Ops& o) { o.rope_hadamard_fp4(nullptr, 37, 2, 64, 16, nullptr); }, 37),
      plain("fp8_sim", [](const Ops& o) { o.fp8_sim(nullptr, 15, 128, 128, 64); }, 15),
      plain("fp4_sim", [](const Ops& o) { o.fp4_sim(nullptr, 16, 64); }, 16),
      plain("hadamard", [](const Ops& o) { o.hadamard(nullptr, 17, 64, true); }, 17),
      plain("check_finite", [](const Ops& o) { o.check_finite(nullptr, 18, 64, nullptr); }, 18),
      plain("gather_rows", [](const Ops& o) { o.gather_rows(nullptr, 2, nullptr, nullptr, 19, 64, nullptr); }, 19),
      plain("scatter_rows", [](const Ops& o) { o.scatter_rows(nullptr, nullptr, nullptr, nullptr, 20, 64); }, 20),
      plain("add_rows", [](const Ops& o) { o.add_rows(nullptr, 21, 64, nullptr, nullptr); }, 21),
      plain("frontier_update",
            [](const Ops& o) {
              o.frontier_update(nullptr, nullptr, 3, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 38, 64);
            },
            38),
      plain("encode_rows", [](const Ops& o) { o.encode_rows(nullptr, 22, codec, nullptr); }, 22),
      plain("hc_pre",
            [](const Ops& o) {
              o.hc_pre(nullptr, 23, 4, 64, nullptr, nullptr, nullptr, 20, 1e-6f, 1e-6f, true, nullptr, nullptr,
                       nullptr);
            },
            23),
      split("hc_pre_norm",
            [](const Ops& o) {
              o.hc_pre_norm(nullptr, 24, 4, 64, nullptr, nullptr, nullptr, 20, 1e-6f, 1e-6f, true, nullptr, nullptr,
                            nullptr, nullptr);
            },
            24, 0, 0, {"hc_pre", "rmsnorm"}),
      plain("hc_post",
            [](const Ops& o) { o.hc_post(nullptr, nullptr, nullptr, nullptr, 25, 4, 64, true, nullptr); }, 25),
      plain("hc_head",
            [](const Ops& o) {
              o.hc_head(nullptr, 26, 4, 64, nullptr, nullptr, nullptr, 1e-6f, 1e-6f, true, nullptr);
            },
            26),
      plain("sparse_attention",
            [](const Ops& o) {
              o.sparse_attention(nullptr, 27, 2, kv, nullptr, 128, nullptr, 512, nullptr, 0.1f, true, nullptr);
            },
            27, 128, 512),
      plain("sparse_attention_rope",
            [](const Ops& o) {
              o.sparse_attention_rope(nullptr, 39, 2, kv, nullptr, 128, nullptr, 512, nullptr, 0.1f, true, 16, nullptr,
                                      nullptr);
            },
            39, 128, 512),
      plain("compress_pool",
            [](const Ops& o) {
              o.compress_pool(nullptr, nullptr, 3, nullptr, nullptr, nullptr, 28, 8, 2, 64, nullptr);
            },
            28),
      plain("indexer_topk",
            [](const Ops& o) {
              o.indexer_topk(nullptr, 29, 2, 64, keys, nullptr, 300, nullptr, 512, true, nullptr);
            },
            29, 300, 512),
      plain("route",
            [](const Ops& o) { o.route(nullptr, 30, 9, 6, nullptr, nullptr, nullptr, 1.5f, nullptr, nullptr); }, 30, 9,
            6),
      plain("swiglu", [](const Ops& o) { o.swiglu(nullptr, nullptr, 31, 64, 7.0f, nullptr, true, nullptr); }, 31),
      plain("moe", [](const Ops& o) { o.moe(moe_w, nullptr, 32, nullptr, nullptr, 6, 7.0f, lo, true, nullptr); }, 32,
            9, 6),
      split("route_moe",
            [](const Ops& o) {
              o.route_moe(nullptr, 9, nullptr, nullptr, nullptr, 1.5f, moe_w, nullptr, 33, 6, 7.0f, lo, true,
                          nullptr, nullptr, nullptr);
            },
            33, 9, 6, {"route", "moe"}),
      plain("moe_resident",
            [](const Ops& o) {
              o.moe_resident(moe_w, nullptr, nullptr, 34, nullptr, nullptr, 6, 7.0f, lo, true, nullptr, nullptr);
            },
            34, 9, 6),
      plain("moe_combine", [](const Ops& o) { o.moe_combine(nullptr, nullptr, 35, 6, 64, nullptr, true, nullptr); },
            35, 0, 6),
  };
}

// A decorator that logs its hook into the wrapped RecordingOps' calls: "[name" before the op, "]" after it.
class LoggingOps final : public ForwardingOps {
 public:
  explicit LoggingOps(const RecordingOps& rec) : ForwardingOps(rec), rec_(rec) {}

 private:
  void around(const OpCall& call, OpBody body) const override {
    rec_.calls.push_back(std::string("[") + call.op);
    body();
    rec_.calls.push_back("]");
  }
  const RecordingOps& rec_;
};

TEST(OpDecorators, ForwardingOpsForwardsEveryOpOnceInsideTheHook) {
  RecordingOps rec;
  const LoggingOps ops(rec);
  for (const Case& c : every_op()) {
    rec.calls.clear();
    c.call(ops);
    EXPECT_EQ(rec.calls, (Calls{"[" + c.row, c.op, "]"})) << c.op;
  }
  rec.calls.clear();
  ops.branch_begin();
  ops.branch_end();
  ops.branch_join();
  EXPECT_EQ(rec.calls, (Calls{"branch_begin", "branch_end", "branch_join"})) << "the branch calls skip the hook";
}

TEST(OpDecorators, ProfiledOpsTimesEveryOpUnderItsName) {
  RecordingOps rec;
  for (const Case& c : every_op()) {
    ProfiledOps prof(cpu_backend(), rec);
    rec.calls.clear();
    c.call(prof);
    EXPECT_EQ(rec.calls, c.profiled_calls) << c.op;
    std::map<std::string, int64_t> want, got;
    for (const auto& name : c.profile) ++want[name];
    for (const auto& [name, e] : prof.times()) {
      got[name] = e.calls;
      EXPECT_GE(e.seconds, 0.0) << c.op;
    }
    EXPECT_EQ(got, want) << c.op;
  }
}

TEST(OpDecorators, TimelineOpsTracesEveryOpAsOneRow) {
  RecordingOps rec;
  for (const Case& c : every_op()) {
    TimelineOps tl(cpu_backend(), rec, 4);
    tl.start();
    rec.calls.clear();
    c.call(tl);
    tl.finish();
    EXPECT_EQ(rec.calls, Calls{c.op}) << c.op;
    ASSERT_EQ(tl.rows().size(), 1u) << c.op;
    const TimelineOps::Row& r = tl.rows()[0];
    EXPECT_EQ(std::string(r.op), c.row) << c.op;
    EXPECT_EQ(r.queue, 0) << c.op;
    EXPECT_EQ(r.n, c.n) << c.op;
    EXPECT_EQ(r.a, c.a) << c.op;
    EXPECT_EQ(r.b, c.b) << c.op;
    EXPECT_LE(r.host_begin, r.host_end) << c.op;
  }
}

// A branch: TimelineOps forwards the three calls and puts the branch's ops on queue 1, the op after the join after
// both queues' last ops; ProfiledOps keeps every op on the main queue (its synchronize waits for that queue only).
TEST(OpDecorators, Branch) {
  RecordingOps rec;
  auto step = [](const Ops& o) {
    o.branch_begin();
    o.fill(nullptr, 1, 0.0f);
    o.branch_end();
    o.scale(nullptr, 2, 2.0f, false);
    o.branch_join();
    o.round_bf16(nullptr, 3);
  };
  TimelineOps tl(cpu_backend(), rec);
  tl.start();
  step(tl);
  tl.finish();
  EXPECT_EQ(rec.calls, (Calls{"branch_begin", "fill", "branch_end", "scale", "branch_join", "round_bf16"}));
  ASSERT_EQ(tl.rows().size(), 3u);
  const auto& rows = tl.rows();
  EXPECT_EQ(rows[0].queue, 1);
  EXPECT_EQ(rows[0].after[0], -1);
  EXPECT_EQ(rows[1].queue, 0);
  EXPECT_EQ(rows[1].after[0], -1);
  EXPECT_EQ(rows[1].after[1], -1);
  EXPECT_EQ(rows[2].queue, 0);
  EXPECT_EQ(rows[2].after[0], 1);
  EXPECT_EQ(rows[2].after[1], 0);

  rec.calls.clear();
  ProfiledOps prof(cpu_backend(), rec);
  step(prof);
  EXPECT_EQ(rec.calls, (Calls{"fill", "scale", "round_bf16"}));
  EXPECT_EQ(prof.times().size(), 3u);
}

}  // namespace
}  // namespace dsv4
