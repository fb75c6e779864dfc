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
#include "backend/ops.h"

namespace dsv4 {

class TimelineOps final : public Ops {
 public:
  // One op of the step, in queue order. Times: host steady_clock seconds.
  struct Row {
    const char* op = "";  // op name (linears by weight format: "linear fp8", ...)
    int queue = 0;        // 0: the main queue; 1: the branch queue (between branch_begin and branch_end)
    int64_t n = 0;        // the op's rows (tokens, or rows of the buffer)
    int64_t a = 0, b = 0; // the weight's rows and cols (linears; 0 for other ops)
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

  // reserve: markers made ready before the step (more are made when needed, at some host cost).
  explicit TimelineOps(Backend& be, int reserve = 4096);

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

  void branch_begin() const override;
  void branch_end() const override;
  void branch_join() const override;
  void linear(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o) const override;
  void linear_grouped(const WeightView& W, const float* x, int64_t n_tok, int64_t groups, float* y,
                      const LinearOpts& o) const override;
  void linear_pair(const WeightView& Wa, const WeightView& Wb, const float* x, int64_t n_tok, float* ya, float* yb,
                   const LinearOpts& o) const override;
  void linear_check_finite(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o,
                           int32_t* bad) const override;
  void fill(float* x, int64_t n, float value) const override;
  void round_bf16(float* x, int64_t n) const override;
  void scale(float* x, int64_t n, float alpha, bool bf16) const override;
  void embed(const WeightView& table, const int32_t* ids, int64_t n_tok, int copies, float* out) const override;
  void rmsnorm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, bool bf16,
               float* y) const override;
  void head_rms(float* x, int64_t n_rows, int64_t dim, float eps, bool bf16) const override;
  void rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t rd, const float* cos_sin, bool inverse,
            bool bf16) const override;
  void head_rms_rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, float eps, int64_t rd,
                     const float* cos_sin, bool bf16) const override;
  void norm_rope_fp8(float* x, int64_t n_rows, int64_t dim, const float* w, float eps, int64_t rd,
                     const float* cos_sin, bool bf16, const int32_t* store_src, float* store,
                     const int32_t* store_dst, int64_t n_store) const override;
  void rope_hadamard_fp4(float* x, int64_t n_tok, int64_t n_heads, int64_t dim, int64_t rd,
                         const float* cos_sin) const override;
  void fp8_sim(float* x, int64_t n_rows, int64_t row_stride, int64_t n_cols, int64_t block) const override;
  void fp4_sim(float* x, int64_t n_rows, int64_t dim) const override;
  void hadamard(float* x, int64_t n_rows, int64_t dim, bool bf16) const override;
  void check_finite(const float* x, int64_t n_rows, int64_t dim, int32_t* bad) const override;
  void gather_rows(const float* a, int64_t n_a, const float* b, const int32_t* idx, int64_t n, int64_t dim,
                   float* out) const override;
  void scatter_rows(const float* src, const int32_t* src_idx, float* dst, const int32_t* dst_idx, int64_t n,
                    int64_t dim) const override;
  void add_rows(float* x, int64_t n, int64_t dim, const float* table, const int32_t* rows) const override;
  void frontier_update(const float* kv, float* score, int64_t n_tok, const float* ape, const int32_t* ape_row,
                       float* state_kv, float* state_score, const int32_t* idx, const int32_t* dst, int64_t n,
                       int64_t dim) const override;
  void encode_rows(const float* x, int64_t n, const RowCodec& c, float* out) const override;
  void hc_pre(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
              const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16, float* u, float* post,
              float* comb) const override;
  void hc_pre_norm(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                   const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16,
                   const float* norm_w, float* u, float* post, float* comb) const override;
  void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n_tok, int hc,
               int64_t dim, bool bf16, float* Xout) const override;
  void hc_head(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
               const float* base, float hc_eps, float norm_eps, bool bf16, float* u) const override;
  void sparse_attention(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv, const int32_t* win_idx,
                        int64_t k_win, const int32_t* comp_idx, int64_t k_comp, const float* sink, float scale,
                        bool bf16, float* out) const override;
  void sparse_attention_rope(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv,
                             const int32_t* win_idx, int64_t k_win, const int32_t* comp_idx, int64_t k_comp,
                             const float* sink, float scale, bool bf16, int64_t rd, const float* cos_sin,
                             float* out) const override;
  void compress_pool(const float* kv, const float* score, int64_t n_tok, const float* state_kv,
                     const float* state_score, const int32_t* cand, int64_t n_emit, int64_t n_cand, int coff,
                     int64_t c, float* out) const override;
  void indexer_topk(const float* q, int64_t n_tok, int64_t n_heads, int64_t dim, const PagedRows& keys,
                    const int32_t* n_visible, int64_t max_visible, const float* w, int64_t topk, bool bf16,
                    int32_t* sel) const override;
  void route(const float* logits, int64_t n_tok, int64_t n_experts, int64_t k, const float* bias,
             const int32_t* tid2eid, const int32_t* tokens, float route_scale, int32_t* ids_out,
             float* w_out) const override;
  void swiglu(const float* g, const float* up, int64_t n_rows, int64_t dim, float limit, const float* row_w,
              bool bf16, float* h) const override;
  void moe(const MoeWeights& w, const float* x, int64_t n_tok, const int32_t* ids, const float* wts, int64_t k,
           float swiglu_limit, const LinearOpts& q, bool bf16, float* y) const override;
  void route_moe(const float* logits, int64_t n_experts, const float* bias, const int32_t* tid2eid,
                 const int32_t* tokens, float route_scale, const MoeWeights& w, const float* x, int64_t n_tok,
                 int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, int32_t* ids, float* wts,
                 float* y) const override;
  void moe_resident(const MoeWeights& w, const uint8_t* resident, const float* x, int64_t n_tok, const int32_t* ids,
                    const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* o_pairs,
                    float* o_shared) const override;
  void moe_combine(const float* o_pairs, const int32_t* ids, int64_t n_tok, int64_t k, int64_t D,
                   const float* o_shared, bool bf16, float* y) const override;

 private:
  // Enqueue one op through f and record its row and marker.
  template <class F>
  void traced(const char* op, int64_t n, int64_t a, int64_t b, F&& f) const;
  Backend& be_;
  const Ops& inner_;
  int reserve_;
  double origin_ = 0, uncertainty_ = 0;
  mutable std::vector<Row> rows_;
  mutable int queue_ = 0;           // the queue ops go to now
  mutable int last_[2] = {-1, -1};  // the last row on each queue
  mutable int join_ = -1;           // the branch's last row, joined into the main queue's next op
  bool read_ = false;
};

}  // namespace dsv4
