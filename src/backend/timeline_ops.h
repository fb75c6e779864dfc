// An Ops decorator that records a host / device timeline of the ops of a step without synchronizing per op
// (benchmarks: `dsv4 bench model --timeline FILE`). For every op: the host clock when its enqueue began and ended,
// and a device marker recorded right after it on the op's queue (Backend::timeline_mark: a timing event on CUDA, the
// host clock on the CPU). After the step, finish() reads the markers, and summarize() tells where the wall time
// went: each op's device interval (its marker minus the marker of the op it follows), how long the device waited for
// the host (the op's host enqueue ended after the op it follows was done on the device), the device's busy and idle
// time. Every op is forwarded as it is (the composite ops and the branch calls too), so the traced step runs the
// same kernels as an untraced one. Not for recorded steps (CUDA graphs: the model runs hooked steps eagerly, and
// the CUDA marker refuses a capture). The markers cost host time between ops (one cudaEventRecord each on CUDA).
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/forwarding_ops.h"

namespace dsv4 {

class TimelineOps final : public ForwardingOps {
 public:
  // One op of the step, in queue order. Times: host steady_clock seconds.
  struct Row {
    const char* op = "";  // op name (OpCall::op: linears with their weight's format, "linear_pair fp8", ...)
    int queue = 0;        // 0: the main queue; 1: the branch queue (between branch_begin and branch_end)
    int64_t n = 0;        // the op's rows (tokens, or rows of the buffer)
    int64_t a = 0, b = 0; // two sizes (OpCall::a, b: the weight's rows and cols for linears; 0 for most ops)
    int after[2] = {-1, -1};  // the rows whose device work this op's follows (-1: the origin; a join: two)
    double host_begin = 0, host_end = 0;
    double device_end = 0;    // set by finish()
  };
  // Per op name, and the step as a whole (seconds).
  struct OpTotal {
    std::string op;
    int64_t calls = 0;
    double host = 0, device = 0, host_behind = 0;
  };
  struct Summary {
    int64_t ops = 0;
    double wall = 0;              // origin .. end
    double before_first_op = 0;   // origin .. the first op's enqueue (host work before the ops: plan, uploads)
    double after_last_op = 0;     // the last op's device end .. end (copies back, host work after the ops)
    double host_enqueue = 0;      // Σ host enqueue time of the ops
    double device_intervals = 0;  // Σ device interval of the ops
    double device_busy = 0;       // the union over the ops of [the later of its enqueue's begin and the end of
                                  // what it follows, its device end]
    double device_idle = 0;       // wall - device_busy
    double host_behind = 0;       // the union over the ops (after the first op's enqueue began) of the time the
                                  // device had finished what the op follows while the host had not yet finished
                                  // enqueueing it: wall time in which device work waited on the host
    double host_behind_enqueue = 0;  // ... of which inside the waiting op's own enqueue
    double host_behind_between = 0;  // ... the rest: the host between ops (not inside the op's enqueue)
    double clock_uncertainty = 0;    // how far device times may be off the host clock (Backend::timeline_start)
    std::vector<OpTotal> by_op;      // per op name, by device time (descending)
  };

  // Traces the ops of `inner` (default: be.ops()) with be's markers. reserve: markers made ready before the step
  // (more are made when needed, at some host cost).
  TimelineOps(Backend& be, const Ops& inner, int reserve = 4096);
  explicit TimelineOps(Backend& be, int reserve = 4096) : TimelineOps(be, be.ops(), reserve) {}

  // Begin a timeline (waits for the queued work; clears the rows): the origin.
  void start();
  // Read the device markers of the rows (waits for them).
  void finish();
  const std::vector<Row>& rows() const { return rows_; }
  double origin() const { return origin_; }
  // The summary of the rows read by finish(), with `end` (host steady_clock seconds: when the step returned).
  Summary summarize(double end) const;
  // The rows as tab-separated values with a header line, times in ms since the origin (see the header's columns).
  void write_tsv(std::ostream& os) const;

  // The branch calls, forwarded: the ops between branch_begin() and branch_end() go to queue 1.
  void branch_begin() const override;
  void branch_end() const override;
  void branch_join() const override;

 private:
  // Enqueue one op through body() and record its row and marker.
  void around(const OpCall& call, OpBody body) const override;
  Backend& be_;
  int reserve_;
  double origin_ = 0, uncertainty_ = 0;
  mutable std::vector<Row> rows_;
  mutable int queue_ = 0;           // the queue ops go to now
  mutable int last_[2] = {-1, -1};  // the last row on each queue
  mutable int join_ = -1;           // the branch's last row, joined into the main queue's next op
  bool read_ = false;
};

}  // namespace dsv4
