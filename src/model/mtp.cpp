// The MTP module (spec §3.5, §5.9; [REF-model] MTPBlock): the block input from the main model's pre-head streams
// H_t and the embedding of the token at t + 1,
//   e = enorm(embed[x_{t+1}]);  X = e_proj(e)[None] + h_proj(hnorm(H_t))   (hnorm per stream, e_proj broadcast)
// then one window-only block (Model::block on the MTP layer, its own ring in the state pool) and the MTP head
//   logits(x_{t+2}) = head(mtp.norm(hc_head(X; mtp.hc_head_*)))             (embed and head shared with the model)
// Reference numerics: bf16 embedding, bf16 norms, FP8 e_proj / h_proj with bf16 outputs, a bf16 sum.
#include "model/model.h"

namespace dsv4 {

void Model::mtp_input(const float* H, const int32_t* next, const int32_t* hc_rows, int64_t n, float* Xm) const {
  const int64_t D = cfg_.hidden_size, HC = cfg_.hc_mult;
  const float eps = float(cfg_.rms_norm_eps);
  const bool bf = bf16();
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* e = ws.alloc<float>(n * D);         // [n, D]
  float* ep = ws.alloc<float>(n * D);        // [n, D]
  float* hs = ws.alloc<float>(n * HC * D);   // [n, HC, D]
  ops().embed(embed_, next, n, 1, e);
  ops().rmsnorm(e, n, D, mtp_.enorm, eps, bf, e);
  ops().linear(mtp_.e_proj, e, n, ep, qopts());
  ops().rmsnorm(H, n * HC, D, mtp_.hnorm, eps, bf, hs);
  ops().linear(mtp_.h_proj, hs, n * HC, Xm, qopts());
  ops().add_rows(Xm, n * HC, D, ep, hc_rows);  // e_proj(e) added to every stream
  if (bf) ops().round_bf16(Xm, n * HC * D);
}

void Model::mtp_head(const float* X, int64_t n, float* logits) const {
  const int64_t D = cfg_.hidden_size;
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* u = ws.alloc<float>(n * D);
  ops().hc_head(X, n, cfg_.hc_mult, D, mtp_.hc_head_fn, mtp_.hc_head_scale, mtp_.hc_head_base, float(cfg_.hc_eps),
                float(cfg_.rms_norm_eps), bf16(), u);
  ops().rmsnorm(u, n, D, mtp_.norm, float(cfg_.rms_norm_eps), bf16(), u);
  ops().linear(head_, u, n, logits, bf16_weight_opts());
}

}  // namespace dsv4
