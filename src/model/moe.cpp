// Mixture of experts (spec §5.7): fp32 router logits, sqrt-softplus scores, hash (tid2eid) or bias-corrected top-k
// selection, normalized weights × route scale (op `route`); routed SwiGLU experts (clamped, routing weight applied
// before w2) accumulated in fp32 in ascending expert id, plus the shared expert (op `moe`); bf16 result in reference
// numerics. Dispatch and combine happen inside the ops, on the device; a layer with routed experts on the CPU
// (placement, model/expert_placement.h) runs split (model/split_moe.h), to the same result.
#include "model/model.h"

namespace dsv4 {

void Model::moe(int l, const DevicePlan& dp, int64_t n, const float* x, float* out) const {
  const LayerResident& lp = lr_[size_t(l)];
  const int64_t E = cfg_.n_routed_experts, k = cfg_.num_experts_per_tok;
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* logits = ws.alloc<float>(n * E);     // [n, E]
  ops().linear(lp.gate, x, n, logits, bf16_weight_opts());  // fp32(x) @ fp32(gate)ᵀ
  int32_t* ids = ws.alloc<int32_t>(n * k);    // [n, k]
  float* wts = ws.alloc<float>(n * k);
  const float* bias = lp.hash ? nullptr : lp.gate_bias;
  const int32_t* tid2eid = lp.hash ? lp.tid2eid : nullptr;
  const float scale = float(cfg_.routed_scaling_factor);
  if (lp.split.n_host > 0) {  // some routed experts on the CPU (model/split_moe.h)
    ops().route(logits, n, E, k, bias, tid2eid, dp.tokens, scale, ids, wts);
    observe_route(l, ids, n, k);
    split_->run(ops(), lp.split, cfg_.hidden_size, x, n, ids, wts, k, float(cfg_.swiglu_limit), qopts(), bf16(), out);
    return;
  }
  // the router and the experts in one op (a backend may route inside the MoE's dispatch)
  ops().route_moe(logits, E, bias, tid2eid, dp.tokens, scale, lp.moe, x, n, k, float(cfg_.swiglu_limit), qopts(),
                  bf16(), ids, wts, out);
  observe_route(l, ids, n, k);
}

void Model::observe_route(int l, const int32_t* ids, int64_t n, int64_t k) const {
  if (!route_observer_ || l >= cfg_.num_hidden_layers) return;
  route_host_.resize(size_t(n * k));
  be_->copy_to_host(route_host_.data(), ids, size_t(n * k) * 4);
  route_observer_(l, route_host_.data(), n, k);
}

}  // namespace dsv4
