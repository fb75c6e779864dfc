#include "backend/timeline_ops.h"

#include <algorithm>
#include <map>
#include <ostream>

#include <fmt/format.h>

#include "core/error.h"

namespace dsv4 {

namespace {
// The row name of a linear kind (0 linear, 1 linear_pair, 2 linear_grouped, 3 linear_check_finite) of W's format.
const char* linear_name(int kind, const WeightView& W) {
  static const char* const names[4][4] = {
      {"linear fp4", "linear fp8", "linear bf16", "linear f32"},
      {"linear_pair fp4", "linear_pair fp8", "linear_pair bf16", "linear_pair f32"},
      {"linear_grouped fp4", "linear_grouped fp8", "linear_grouped bf16", "linear_grouped f32"},
      {"linear_check_finite fp4", "linear_check_finite fp8", "linear_check_finite bf16", "linear_check_finite f32"}};
  const int f = W.fmt == GemmFormat::fp4 ? 0 : W.fmt == GemmFormat::fp8 ? 1 : W.fmt == GemmFormat::bf16 ? 2 : 3;
  return names[kind][f];
}
}  // namespace

TimelineOps::TimelineOps(Backend& be, int reserve) : be_(be), inner_(be.ops()), reserve_(std::max(reserve, 1)) {}

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

template <class F>
void TimelineOps::traced(const char* op, int64_t n, int64_t a, int64_t b, F&& f) const {
  const int i = int(rows_.size());
  Row& r = rows_.emplace_back();
  r.op = op;
  r.queue = queue_;
  r.n = n;
  r.a = a;
  r.b = b;
  r.after[0] = last_[queue_];
  if (queue_ == 0 && join_ >= 0) {
    r.after[1] = join_;
    join_ = -1;
  }
  r.host_begin = Backend::timeline_clock();
  f();
  rows_[size_t(i)].host_end = Backend::timeline_clock();  // (f may not add rows: ops do not nest; by index all the same)
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

// ---- the ops: each forwarded as it is --------------------------------------------------------------------------

void TimelineOps::branch_begin() const {
  inner_.branch_begin();
  last_[1] = last_[0];  // the branch follows what the main queue holds now
  queue_ = 1;
}
void TimelineOps::branch_end() const {
  inner_.branch_end();
  queue_ = 0;
}
void TimelineOps::branch_join() const {
  inner_.branch_join();
  join_ = last_[1];  // the main queue's next op follows the branch too
}

void TimelineOps::linear(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o) const {
  traced(linear_name(0, W), n_tok, W.rows, W.cols, [&] { inner_.linear(W, x, n_tok, y, o); });
}
void TimelineOps::linear_pair(const WeightView& Wa, const WeightView& Wb, const float* x, int64_t n_tok, float* ya,
                              float* yb, const LinearOpts& o) const {
  traced(linear_name(1, Wa), n_tok, Wa.rows + Wb.rows, Wa.cols,
         [&] { inner_.linear_pair(Wa, Wb, x, n_tok, ya, yb, o); });
}
void TimelineOps::linear_grouped(const WeightView& W, const float* x, int64_t n_tok, int64_t groups, float* y,
                                 const LinearOpts& o) const {
  traced(linear_name(2, W), n_tok, W.rows, W.cols, [&] { inner_.linear_grouped(W, x, n_tok, groups, y, o); });
}
void TimelineOps::linear_check_finite(const WeightView& W, const float* x, int64_t n_tok, float* y,
                                      const LinearOpts& o, int32_t* bad) const {
  traced(linear_name(3, W), n_tok, W.rows, W.cols, [&] { inner_.linear_check_finite(W, x, n_tok, y, o, bad); });
}
void TimelineOps::fill(float* x, int64_t n, float value) const {
  traced("fill", n, 0, 0, [&] { inner_.fill(x, n, value); });
}
void TimelineOps::round_bf16(float* x, int64_t n) const {
  traced("round_bf16", n, 0, 0, [&] { inner_.round_bf16(x, n); });
}
void TimelineOps::scale(float* x, int64_t n, float alpha, bool bf16) const {
  traced("scale", n, 0, 0, [&] { inner_.scale(x, n, alpha, bf16); });
}
void TimelineOps::embed(const WeightView& table, const int32_t* ids, int64_t n_tok, int copies, float* out) const {
  traced("embed", n_tok, table.rows, table.cols, [&] { inner_.embed(table, ids, n_tok, copies, out); });
}
void TimelineOps::rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16,
                          float* y) const {
  traced("rmsnorm", n_rows, 0, 0, [&] { inner_.rmsnorm(x, n_rows, dim, w, eps, bf16, y); });
}
void TimelineOps::head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16) const {
  traced("head_rms", n_rows, 0, 0, [&] { inner_.head_rms(x, n_rows, dim, eps, bf16); });
}
void TimelineOps::rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin,
                       bool inverse, bool bf16) const {
  traced("rope", n_tok, 0, 0, [&] { inner_.rope(x, n_tok, n_heads, head_dim, rd, cos_sin, inverse, bf16); });
}
void TimelineOps::head_rms_rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, float eps, int64_t rd,
                                const float* cos_sin, bool bf16) const {
  traced("head_rms_rope", n_tok, 0, 0,
         [&] { inner_.head_rms_rope(x, n_tok, n_heads, head_dim, eps, rd, cos_sin, bf16); });
}
void TimelineOps::norm_rope_fp8(float* x, int64_t n_rows, int64_t dim, const float* w, float eps, int64_t rd,
                                const float* cos_sin, bool bf16, const int32_t* store_src, float* store,
                                const int32_t* store_dst, int64_t n_store) const {
  traced("norm_rope_fp8", n_rows, 0, 0, [&] {
    inner_.norm_rope_fp8(x, n_rows, dim, w, eps, rd, cos_sin, bf16, store_src, store, store_dst, n_store);
  });
}
void TimelineOps::rope_hadamard_fp4(float* x, int64_t n_tok, int64_t n_heads, int64_t dim, int64_t rd,
                                    const float* cos_sin) const {
  traced("rope_hadamard_fp4", n_tok, 0, 0, [&] { inner_.rope_hadamard_fp4(x, n_tok, n_heads, dim, rd, cos_sin); });
}
void TimelineOps::fp8_sim(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block) const {
  traced("fp8_sim", n_rows, 0, 0, [&] { inner_.fp8_sim(x, n_rows, row_stride, n_cols, block); });
}
void TimelineOps::fp4_sim(float* x, int64_t n_rows, int64_t dim) const {
  traced("fp4_sim", n_rows, 0, 0, [&] { inner_.fp4_sim(x, n_rows, dim); });
}
void TimelineOps::hadamard(float* x, int64_t n_rows, int64_t dim, bool bf16) const {
  traced("hadamard", n_rows, 0, 0, [&] { inner_.hadamard(x, n_rows, dim, bf16); });
}
void TimelineOps::check_finite(const float* x, int64_t n_rows, int64_t dim, int32_t* bad) const {
  traced("check_finite", n_rows, 0, 0, [&] { inner_.check_finite(x, n_rows, dim, bad); });
}
void TimelineOps::gather_rows(const float* a, int64_t n_a, const float* b, const int32_t* idx, int64_t n,
                              int64_t dim, float* out) const {
  traced("gather_rows", n, 0, 0, [&] { inner_.gather_rows(a, n_a, b, idx, n, dim, out); });
}
void TimelineOps::scatter_rows(const float* src, const int32_t* src_idx, float* dst, const int32_t* dst_idx, int64_t n,
                               int64_t dim) const {
  traced("scatter_rows", n, 0, 0, [&] { inner_.scatter_rows(src, src_idx, dst, dst_idx, n, dim); });
}
void TimelineOps::add_rows(float* x, int64_t n, int64_t dim, const float* table, const int32_t* rows) const {
  traced("add_rows", n, 0, 0, [&] { inner_.add_rows(x, n, dim, table, rows); });
}
void TimelineOps::frontier_update(const float* kv, float* score, int64_t n_tok, const float* ape,
                                  const int32_t* ape_row, float* state_kv, float* state_score, const int32_t* idx,
                                  const int32_t* dst, int64_t n, int64_t dim) const {
  traced("frontier_update", n, 0, 0, [&] {
    inner_.frontier_update(kv, score, n_tok, ape, ape_row, state_kv, state_score, idx, dst, n, dim);
  });
}
void TimelineOps::encode_rows(const float* x, int64_t n, const RowCodec& c, float* out) const {
  traced("encode_rows", n, 0, 0, [&] { inner_.encode_rows(x, n, c, out); });
}
void TimelineOps::hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                         const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u,
                         float* post, float* comb) const {
  traced("hc_pre", n_tok, 0, 0, [&] {
    inner_.hc_pre(X, n_tok, hc, dim, fn, scale, base, sinkhorn_iters, hc_eps, norm_eps, bf16, u, post, comb);
  });
}
void TimelineOps::hc_pre_norm(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                              const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16,
                              const float* norm_w, float* u, float* post, float* comb) const {
  traced("hc_pre_norm", n_tok, 0, 0, [&] {
    inner_.hc_pre_norm(X, n_tok, hc, dim, fn, scale, base, sinkhorn_iters, hc_eps, norm_eps, bf16, norm_w, u, post,
                       comb);
  });
}
void TimelineOps::hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc,
                          int64_t dim, bool bf16, float* Xout) const {
  traced("hc_post", n_tok, 0, 0, [&] { inner_.hc_post(f, X, post, comb, n_tok, hc, dim, bf16, Xout); });
}
void TimelineOps::hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                          const float* base, float hc_eps, float norm_eps, bool bf16, float* u) const {
  traced("hc_head", n_tok, 0, 0, [&] { inner_.hc_head(X, n_tok, hc, dim, fn, scale, base, hc_eps, norm_eps, bf16, u); });
}
void TimelineOps::sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv,
                                   const int32_t* win_idx, int64_t k_win, const int32_t* comp_idx, int64_t k_comp,
                                   const float* sink, float scale, bool bf16, float* out) const {
  traced("sparse_attention", n_tok, k_win, k_comp, [&] {
    inner_.sparse_attention(q, n_tok, n_heads, kv, win_idx, k_win, comp_idx, k_comp, sink, scale, bf16, out);
  });
}
void TimelineOps::sparse_attention_rope(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv,
                                        const int32_t* win_idx, int64_t k_win, const int32_t* comp_idx,
                                        int64_t k_comp, const float* sink, float scale, bool bf16, int64_t rd,
                                        const float* cos_sin, float* out) const {
  traced("sparse_attention_rope", n_tok, k_win, k_comp, [&] {
    inner_.sparse_attention_rope(q, n_tok, n_heads, kv, win_idx, k_win, comp_idx, k_comp, sink, scale, bf16, rd,
                                 cos_sin, out);
  });
}
void TimelineOps::compress_pool(const float* kv, const float* score, int64_t n_tok, const float* state_kv,
                                const float* state_score, const int32_t* cand, int64_t n_emit, int64_t n_cand,
                                int coff, int64_t c, float* out) const {
  traced("compress_pool", n_emit, 0, 0, [&] {
    inner_.compress_pool(kv, score, n_tok, state_kv, state_score, cand, n_emit, n_cand, coff, c, out);
  });
}
void TimelineOps::indexer_topk(const float* q, int64_t n_tok, int64_t n_heads, int64_t dim, const PagedRows& keys,
                               const int32_t* n_visible, int64_t max_visible, const float* w, int64_t topk, bool bf16,
                               int32_t* sel) const {
  traced("indexer_topk", n_tok, max_visible, topk,
         [&] { inner_.indexer_topk(q, n_tok, n_heads, dim, keys, n_visible, max_visible, w, topk, bf16, sel); });
}
void TimelineOps::route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias,
                        const int32_t* tid2eid, const int32_t* tokens, float route_scale, int32_t* ids_out,
                        float* w_out) const {
  traced("route", n_tok, n_experts, k,
         [&] { inner_.route(logits, n_tok, n_experts, k, bias, tid2eid, tokens, route_scale, ids_out, w_out); });
}
void TimelineOps::swiglu(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit, const float* row_w,
                         bool bf16, float* h) const {
  traced("swiglu", n_rows, 0, 0, [&] { inner_.swiglu(g, up, n_rows, dim, limit, row_w, bf16, h); });
}
void TimelineOps::moe(const MoeWeights& w, const float* x, int64_t n_tok, const int32_t* ids, const float* wts,
                      int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* y) const {
  traced("moe", n_tok, w.n_experts, k, [&] { inner_.moe(w, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, y); });
}
void TimelineOps::route_moe(const float* logits, int64_t n_experts, const float* bias, const int32_t* tid2eid,
                            const int32_t* tokens, float route_scale, const MoeWeights& w, const float* x,
                            int64_t n_tok, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, int32_t* ids,
                            float* wts, float* y) const {
  traced("route_moe", n_tok, n_experts, k, [&] {
    inner_.route_moe(logits, n_experts, bias, tid2eid, tokens, route_scale, w, x, n_tok, k, swiglu_limit, q, bf16,
                     ids, wts, y);
  });
}
void TimelineOps::moe_resident(const MoeWeights& w, const uint8_t* resident, const float* x, int64_t n_tok,
                               const int32_t* ids, const float* wts, int64_t k, float swiglu_limit,
                               const LinearOpts& q, bool bf16, float* o_pairs, float* o_shared) const {
  traced("moe_resident", n_tok, w.n_experts, k, [&] {
    inner_.moe_resident(w, resident, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, o_pairs, o_shared);
  });
}
void TimelineOps::moe_combine(const float* o_pairs, const int32_t* ids, int64_t n_tok, int64_t k, int64_t D,
                              const float* o_shared, bool bf16, float* y) const {
  traced("moe_combine", n_tok, 0, k, [&] { inner_.moe_combine(o_pairs, ids, n_tok, k, D, o_shared, bf16, y); });
}

}  // namespace dsv4
