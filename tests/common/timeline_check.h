// Checks of a step's timeline (backend/timeline_ops.h) that hold on every backend: one row per op in queue order,
// host times increasing, device ends in order along each queue and after what each op follows, and a summary that
// adds up. Shared by tests/model (CPU) and tests/gpu (CUDA).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "backend/timeline_ops.h"
#include "model/model.h"
#include "model/sequence.h"

namespace dsv4::test {

// A prefill of ids in a fresh sequence: the logits of its last position.
inline std::vector<float> timeline_prefill(const Model& m, const std::vector<int32_t>& ids) {
  ModelSequence seq(m);
  std::vector<float> lg(static_cast<size_t>(m.n_vocab()));
  seq.append(ids, lg);
  return lg;
}

// `end`: the host time the step returned (summarize's argument).
inline void check_timeline(const TimelineOps& tl, double end, const std::string& what) {
  const auto& rows = tl.rows();
  ASSERT_FALSE(rows.empty()) << what;
  const TimelineOps::Summary s = tl.summarize(end);
  const double tol = s.clock_uncertainty + 2e-6;  // device times vs the host clock (event resolution ~0.5 us)
  EXPECT_LE(tl.origin(), rows[0].host_begin) << what;
  double last_end[2] = {tl.origin() - tol, tl.origin() - tol};
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    ASSERT_TRUE(r.queue == 0 || r.queue == 1) << what << " row " << i;
    EXPECT_LE(r.host_begin, r.host_end) << what << " row " << i << " " << r.op;
    if (i + 1 < rows.size()) {
      EXPECT_LE(r.host_end, rows[i + 1].host_begin) << what << " row " << i << " " << r.op;
    }
    EXPECT_GE(r.device_end, r.host_begin - tol) << what << " row " << i << " " << r.op << ": done before enqueued";
    EXPECT_GE(r.device_end, last_end[r.queue] - 1e-9) << what << " row " << i << " " << r.op << ": out of order";
    last_end[r.queue] = r.device_end;
    for (int d : r.after) {
      EXPECT_LT(d, int(i)) << what << " row " << i;
      if (d >= 0) {
        EXPECT_GE(r.device_end, rows[size_t(d)].device_end - 1e-9) << what << " row " << i << " " << r.op;
      }
    }
    EXPECT_LE(r.device_end, end + tol) << what << " row " << i << " " << r.op << ": done after the step returned";
  }
  EXPECT_EQ(s.ops, int64_t(rows.size())) << what;
  int64_t calls = 0;
  for (const auto& o : s.by_op) calls += o.calls;
  EXPECT_EQ(calls, int64_t(rows.size())) << what;
  for (double v : {s.wall, s.before_first_op, s.after_last_op, s.host_enqueue, s.device_intervals, s.device_busy,
                   s.device_idle, s.host_behind, s.host_behind_between, s.host_behind_enqueue})
    EXPECT_GE(v, 0.0) << what;
  EXPECT_NEAR(s.device_busy + s.device_idle, s.wall, 1e-9) << what;
  EXPECT_NEAR(s.host_behind, s.host_behind_between + s.host_behind_enqueue, 1e-9) << what;
  EXPECT_LE(s.device_busy, s.wall + 1e-9) << what;
  EXPECT_LE(s.host_behind, s.wall + 1e-9) << what;
  // every idle moment is before the first op, after the last one, or one in which some op's device work waited on
  // the host (the first op in queue order that ends after it had not been enqueued yet)
  EXPECT_LE(s.device_idle, s.before_first_op + s.host_behind + s.after_last_op + 1e-9) << what;
  // the file: a header and one line per row
  std::ostringstream os;
  tl.write_tsv(os);
  const std::string tsv = os.str();
  size_t lines = 0;
  for (char c : tsv) lines += c == '\n';
  EXPECT_EQ(lines, rows.size() + 1) << what;
  EXPECT_EQ(tsv.rfind("i\top\tqueue\t", 0), 0u) << what;
}

}  // namespace dsv4::test
