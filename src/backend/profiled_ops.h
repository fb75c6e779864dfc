// An Ops decorator that times every op (benchmarks: `dsv4 bench model` per-op breakdown). Each call is bracketed by
// backend synchronizations and timed on the host clock, so small ops include a launch + sync latency; totals per op
// name are kept. Not for production paths.
//
// Names: each op's own (forwarding_ops.h), except the linears of every kind, which are summed by weight format
// ("linear fp8"), and the three composites head_rms_rope, hc_pre_norm and route_moe, which run as Ops' defaults and
// are timed as their parts (the names the breakdown has always had; the benchmark's JSON keeps them).
#pragma once
#include <functional>
#include <map>
#include <string>

#include "backend/backend.h"
#include "backend/forwarding_ops.h"

namespace dsv4 {

class ProfiledOps final : public ForwardingOps {
 public:
  struct Entry {
    double seconds = 0;
    int64_t calls = 0;
  };
  // Times the ops of `inner` (default: be.ops()), each bracketed by be.synchronize().
  ProfiledOps(Backend& be, const Ops& inner) : ForwardingOps(inner), be_(be) {}
  explicit ProfiledOps(Backend& be) : ProfiledOps(be, be.ops()) {}
  const std::map<std::string, Entry, std::less<>>& times() const { return times_; }
  void reset() { times_.clear(); }

  // The branch calls are not forwarded: every op stays on the main queue, the one be.synchronize() waits for.
  void branch_begin() const override {}
  void branch_end() const override {}
  void branch_join() const override {}
  // Timed as their parts (see above).
  void head_rms_rope(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, float eps, int64_t rd,
                     const float* cos_sin, bool bf16) const override {
    Ops::head_rms_rope(x, n_tok, n_heads, head_dim, eps, rd, cos_sin, bf16);
  }
  void hc_pre_norm(const float* X, int64_t n_tok, int hc, int64_t dim, const float* fn, const float* scale,
                   const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, bool bf16,
                   const float* norm_w, float* u, float* post, float* comb) const override {
    Ops::hc_pre_norm(X, n_tok, hc, dim, fn, scale, base, sinkhorn_iters, hc_eps, norm_eps, bf16, norm_w, u, post,
                     comb);
  }
  void route_moe(const float* logits, int64_t n_experts, const float* bias, const int32_t* tid2eid,
                 const int32_t* tokens, float route_scale, const MoeWeights& w, const float* x, int64_t n_tok,
                 int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, int32_t* ids, float* wts,
                 float* y) const override {
    Ops::route_moe(logits, n_experts, bias, tid2eid, tokens, route_scale, w, x, n_tok, k, swiglu_limit, q, bf16, ids,
                   wts, y);
  }

 private:
  void around(const OpCall& call, OpBody body) const override;
  Backend& be_;
  mutable std::map<std::string, Entry, std::less<>> times_;
};

}  // namespace dsv4
