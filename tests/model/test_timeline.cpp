// The host / device timeline of a step (backend/timeline_ops.h) on the CPU backend: one row per op of the step (the
// composite ops and the branch forwarded as they are, so the logits are bitwise those of an untraced step), rows in
// order with increasing times, a summary that adds up; on a backend whose ops finish before they return, the device
// waits on the host for the whole of every op's enqueue.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "backend/profiled_ops.h"
#include "backend/timeline_ops.h"
#include "common/timeline_check.h"
#include "model_test_util.h"

namespace dsv4::test {
namespace {

TEST(Timeline, OneRowPerOpInOrderAndLogitsUnchanged) {
  (void)tiny("tiny-a", Numerics::reference);  // (the tiny models' thread policy)
  for (Numerics num : {Numerics::reference, Numerics::dense}) {
    ModelOptions o;
    o.numerics = num;
    o.ubatch = 256;
    std::unique_ptr<Model> m = Model::load(tiny_dir("tiny-a"), o);
    const auto ids = random_ids(150, m->n_vocab(), 7);  // ratio-4 and ratio-128 compressors emit rows
    const std::vector<float> plain = timeline_prefill(*m, ids);

    TimelineOps tl(m->backend(), 16);  // (fewer markers reserved than ops: the rest are made when marked)
    m->set_op_hook(&tl);
    tl.start();
    const std::vector<float> traced = timeline_prefill(*m, ids);
    const double end = Backend::timeline_clock();
    m->set_op_hook(nullptr);
    tl.finish();
    ASSERT_EQ(plain.size(), traced.size());
    EXPECT_EQ(std::memcmp(plain.data(), traced.data(), plain.size() * 4), 0) << "the traced step's logits differ";
    check_timeline(tl, end, "tiny-a prefill");

    // one row per op: ProfiledOps (which leaves the composite ops to Ops' defaults: two calls each here) counts the
    // same step's calls
    ProfiledOps prof(m->backend());
    m->set_op_hook(&prof);
    (void)timeline_prefill(*m, ids);
    m->set_op_hook(nullptr);
    int64_t calls = 0, composite = 0, branch_rows = 0;
    for (const auto& [name, e] : prof.times()) calls += e.calls;
    for (const auto& r : tl.rows()) {
      const std::string op = r.op;
      composite += op == "hc_pre_norm" || op == "head_rms_rope" || op == "route_moe";
      branch_rows += r.queue == 1;
    }
    EXPECT_GT(composite, 0);
    EXPECT_EQ(int64_t(tl.rows().size()) + composite, calls);
    EXPECT_GT(branch_rows, 0) << "the attention's window / compressor branch runs on queue 1";
    EXPECT_LT(branch_rows, int64_t(tl.rows().size()));

    // ops that finish before they return: every marker after its op's enqueue, and the device waits on the host for
    // all of every enqueue
    const TimelineOps::Summary s = tl.summarize(end);
    for (const auto& r : tl.rows()) EXPECT_GE(r.device_end, r.host_end) << r.op;
    EXPECT_NEAR(s.host_behind_enqueue, s.host_enqueue, 1e-9 + 1e-9 * s.host_enqueue);
    EXPECT_EQ(s.clock_uncertainty, 0.0);
    EXPECT_GT(s.device_busy, 0.0);
  }
}

TEST(Timeline, StartClearsTheRows) {
  (void)tiny("tiny-a", Numerics::reference);
  ModelOptions o;
  o.ubatch = 256;
  std::unique_ptr<Model> m = Model::load(tiny_dir("tiny-a"), o);
  const auto ids = random_ids(20, m->n_vocab(), 8);
  TimelineOps tl(m->backend());
  m->set_op_hook(&tl);
  size_t first = 0;
  for (int rep = 0; rep < 2; ++rep) {
    tl.start();
    (void)timeline_prefill(*m, ids);
    const double end = Backend::timeline_clock();
    tl.finish();
    check_timeline(tl, end, "rep " + std::to_string(rep));
    if (rep == 0) first = tl.rows().size();
  }
  m->set_op_hook(nullptr);
  EXPECT_EQ(tl.rows().size(), first);
  EXPECT_THROW((void)TimelineOps(m->backend()).summarize(0.0), Error) << "a summary needs finish()";
}

}  // namespace
}  // namespace dsv4::test
