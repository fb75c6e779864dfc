#include "backend/timeline_ops.h"

#include <algorithm>
#include <map>
#include <ostream>

#include <fmt/format.h>

#include "core/error.h"

namespace dsv4 {

TimelineOps::TimelineOps(Backend& be, const Ops& inner, int reserve)
    : ForwardingOps(inner), be_(be), reserve_(std::max(reserve, 1)) {}

void TimelineOps::start() {
  rows_.clear();
  rows_.reserve(size_t(reserve_));
  queue_ = 0;
  last_[0] = last_[1] = -1;
  join_ = -1;
  read_ = false;
  origin_ = be_.timeline_start(reserve_, &uncertainty_);
}

void TimelineOps::finish() {
  if (queue_ != 0) fail("internal: timeline finished inside a branch");
  std::vector<double> t(rows_.size());
  be_.timeline_read(int(rows_.size()), t.data());
  for (size_t i = 0; i < rows_.size(); ++i) rows_[i].device_end = t[i];
  read_ = true;
}

void TimelineOps::around(const OpCall& call, OpBody body) const {
  const int i = int(rows_.size());
  Row& r = rows_.emplace_back();
  r.op = call.op;
  r.queue = queue_;
  r.n = call.n;
  r.a = call.a;
  r.b = call.b;
  r.after[0] = last_[queue_];
  if (queue_ == 0 && join_ >= 0) {
    r.after[1] = join_;
    join_ = -1;
  }
  r.host_begin = Backend::timeline_clock();
  body();
  // (body() may not add rows: ops do not nest; by index all the same)
  rows_[size_t(i)].host_end = Backend::timeline_clock();
  be_.timeline_mark(i, queue_);
  last_[queue_] = i;
}

namespace {
// The length of the union of the intervals [a, b) within [lo, hi].
double union_length(std::vector<std::pair<double, double>> iv, double lo, double hi) {
  std::sort(iv.begin(), iv.end());
  double total = 0, cover = lo;
  for (const auto& [a, b] : iv) {
    const double x = std::max(a, cover), y = std::min(b, hi);
    if (y > x) total += y - x;
    cover = std::max(cover, b);
  }
  return total;
}
}  // namespace

TimelineOps::Summary TimelineOps::summarize(double end) const {
  if (!read_) fail("internal: timeline summarized before finish()");
  Summary s;
  s.ops = int64_t(rows_.size());
  s.wall = end - origin_;
  s.clock_uncertainty = uncertainty_;
  if (rows_.empty()) {
    s.before_first_op = s.wall;
    s.device_idle = s.wall;
    return s;
  }
  s.before_first_op = rows_[0].host_begin - origin_;
  std::map<std::string, OpTotal> per;
  // wall time intervals: the device busy with an op; an op's device work waiting for the host (from the end of
  // what it follows, or from its enqueue's begin for the first op, to the end of its enqueue); the part of that
  // inside the op's own enqueue
  std::vector<std::pair<double, double>> busy, behind, inside;
  double last_end = origin_;
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    double prev = origin_;
    for (int d : r.after)
      if (d >= 0) prev = std::max(prev, rows_[size_t(d)].device_end);
    const double start = std::max(prev, r.host_begin), wait_end = std::min(r.host_end, r.device_end);
    if (r.device_end > start) busy.push_back({start, r.device_end});
    if (wait_end > (i == 0 ? start : prev)) behind.push_back({i == 0 ? start : prev, wait_end});
    if (wait_end > start) inside.push_back({start, wait_end});
    const double dev = std::max(0.0, r.device_end - prev);
    s.host_enqueue += r.host_end - r.host_begin;
    s.device_intervals += dev;
    last_end = std::max(last_end, r.device_end);
    OpTotal& o = per[r.op];
    o.op = r.op;
    ++o.calls;
    o.host += r.host_end - r.host_begin;
    o.device += dev;
    o.host_behind += std::max(0.0, wait_end - (i == 0 ? start : prev));
  }
  s.after_last_op = std::max(0.0, end - last_end);
  s.device_busy = union_length(busy, origin_, end);
  s.device_idle = std::max(0.0, s.wall - s.device_busy);
  s.host_behind = union_length(behind, origin_, end);
  s.host_behind_enqueue = std::min(s.host_behind, union_length(inside, origin_, end));
  s.host_behind_between = s.host_behind - s.host_behind_enqueue;
  for (auto& [k, v] : per) s.by_op.push_back(v);
  std::sort(s.by_op.begin(), s.by_op.end(), [](const OpTotal& x, const OpTotal& y) { return x.device > y.device; });
  return s;
}

void TimelineOps::write_tsv(std::ostream& os) const {
  if (!read_) fail("internal: timeline written before finish()");
  os << "i\top\tqueue\tn\trows\tcols\tafter\thost_begin_ms\thost_end_ms\tdevice_end_ms\thost_ms\tdevice_ms\t"
        "host_behind_ms\n";
  auto ms = [&](double t) { return (t - origin_) * 1e3; };
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    double prev = origin_;
    std::string after;
    for (int d : r.after) {
      if (d >= 0) prev = std::max(prev, rows_[size_t(d)].device_end);
      if (d >= 0 || after.empty()) {
        if (!after.empty()) after += '+';
        after += std::to_string(d);
      }
    }
    const double behind = std::max(0.0, std::min(r.host_end, r.device_end) - prev);
    os << fmt::format("{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:.4f}\t{:.4f}\t{:.4f}\t{:.4f}\t{:.4f}\t{:.4f}\n", i, r.op, r.queue,
                      r.n, r.a, r.b, after, ms(r.host_begin), ms(r.host_end), ms(r.device_end),
                      (r.host_end - r.host_begin) * 1e3, std::max(0.0, r.device_end - prev) * 1e3, behind * 1e3);
  }
}

// ---- the branch calls ---------------------------------------------------------------------------------------------

void TimelineOps::branch_begin() const {
  ForwardingOps::branch_begin();
  last_[1] = last_[0];  // the branch follows what the main queue holds now
  queue_ = 1;
}
void TimelineOps::branch_end() const {
  ForwardingOps::branch_end();
  queue_ = 0;
}
void TimelineOps::branch_join() const {
  ForwardingOps::branch_join();
  join_ = last_[1];  // the main queue's next op follows the branch too
}

}  // namespace dsv4
