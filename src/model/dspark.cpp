// The DSpark block drafter of the 0731 / 0813 checkpoints (docs/dspark.md): its context rows in forward steps and
// the block draft. Everything runs through the op interface (backend/ops.h) on the backend's device.
//
// Forward steps (pools with the DSpark stages): for every position p, the mean of the hidden streams entering each
// target layer, concatenated, is projected to main_x(p) = main_norm(main_proj(H(p))); each stage s keeps
// kv_norm_s(wkv_s(main_x(p))) with RoPE at p (FP8-simulated like any window row) in its own ring, row p mod W — with
// the same snapshots, verify-step backups and rollback as the main layers' rings.
//
// A draft of sequence (slot, pos = P - 1, token x_P): the block [x_P, noise x (B-1)] at positions P .. P+B-1, embedded
// into the 4 streams, runs through the stages; each stage attends from every block row to its ring rows of positions
// max(0, P-W) .. P-1 and to all B block rows (non-causal, block rows not stored); the last stage's hc_head and norm
// feed the shared head: base logits U_j of every block row. Then sequentially, for j = 0 .. k-1:
// logits_j = U_j + markov_w2 · markov_w1[prev_j] (prev_0 = x_P, prev_j = the draft the sink chose at j-1), and the
// confidence c_j = sigmoid(conf · [u_j ; markov_w1[prev_j]]) with u_j the pre-norm hc_head output.
#include <algorithm>
#include <cmath>
#include <mutex>

#include "core/error.h"
#include "model/device_lists.h"
#include "model/model.h"

namespace dsv4 {

void Model::dspark_capture(const StepPlan& plan, const DevicePlan& dp, const float* X, int i, float* MH) const {
  const int64_t n = plan.n, HC = cfg_.hc_mult, D = cfg_.hidden_size;
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* m = ws.alloc<float>(n * D);  // [n, D]
  // mean over the streams: ((X_0 + X_1) + X_2) + X_3 in fp32, times 1/HC (HC = 4: exact), bf16 in reference numerics
  // (the reference's bf16 mean: an fp32 sum of bf16 values, divided, rounded)
  ops().gather_rows(X, n * HC, nullptr, dp.stream_rows, n, D, m);
  for (int64_t j = 1; j < HC; ++j) ops().add_rows(m, n, D, X, dp.stream_rows + j * n);
  ops().scale(m, n * D, 1.0f / float(HC), bf16());
  ops().scatter_rows(m, dp.iota, MH, dp.cat_rows + int64_t(i) * n, n, D);  // columns [i D, (i+1) D) of MH
}

void Model::dspark_context(StatePool& pool, const StepPlan& plan, const DevicePlan& dp, const float* MH) const {
  const int64_t n = plan.n, D = cfg_.hidden_size, Dh = cfg_.head_dim;
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* x = ws.alloc<float>(n * D);  // main_x [n, D]
  ops().linear(dspark_.main_proj, MH, n, x, qopts());
  ops().rmsnorm(x, n, D, dspark_.main_norm, float(cfg_.rms_norm_eps), bf16(), x);
  const RowCodec& kc = pool.layout().kv_row;
  float* kv = ws.alloc<float>(n * Dh);
  float* kv_st = kc.compact() ? ws.alloc<float>(n * kc.words()) : kv;
  for (int s = 0; s < cfg_.dspark.n_stages; ++s) {
    const int l = draft_layer_ + s;
    const LayerResident& lp = lr_[size_t(l)];
    ops().linear(lp.wkv, x, n, kv, qopts());
    window_rows(lp, kv, n, dp.cs_plain, kc, kv_st);
    store_window(l, pool, plan, dp, kv_st);
  }
}

namespace {

// The device inputs of one block pass (a group of sequences, n = sequences * B rows).
struct BlockPass {
  int64_t n = 0;
  const int32_t *tokens = nullptr, *cand = nullptr, *group_fwd = nullptr, *group_back = nullptr;
  const float* cs = nullptr;  // [n, rd] RoPE (ratio-0 table) of the block positions
  int64_t k_cand = 0;         // candidates per row: window + block
};

}  // namespace

void Model::dspark_draft(std::span<const DraftSeq> seqs, StatePool& pool, const DraftSink& sink,
                         std::vector<std::vector<float>>* confidence) const {
  const StateLayout& L = pool.layout();
  const int64_t HC = cfg_.hc_mult, D = cfg_.hidden_size, H = cfg_.num_attention_heads, Dh = cfg_.head_dim;
  const int64_t W = L.window, V = cfg_.vocab_size, B = cfg_.dspark.block_size, G = cfg_.o_groups;
  const int64_t QL = cfg_.q_lora_rank, r = cfg_.dspark.markov_rank, rd = cfg_.qk_rope_head_dim;
  const int64_t n_ring = pool.n_slots() * W;
  const int HCi = int(HC);
  const float eps = float(cfg_.rms_norm_eps), hc_eps = float(cfg_.hc_eps);
  const bool bf = bf16();
  std::vector<size_t> act;  // sequences with drafts (n_draft 0: nothing to do, the rings are exact already)
  for (size_t i = 0; i < seqs.size(); ++i)
    if (seqs[i].n_draft > 0) act.push_back(i);
  if (act.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  Workspace& ws = be_->workspace();
  // groups of sequences whose block rows fit one ubatch (bounded scratch, as a forward step)
  const size_t per = size_t(std::max<int64_t>(1, opts_.ubatch / B));
  std::vector<float> logits_host;
  std::vector<int32_t> bad_host;
  std::vector<float> conf_host;
  for (size_t g0 = 0; g0 < act.size(); g0 += per) {
    const size_t g1 = std::min(act.size(), g0 + per);
    const int64_t na = int64_t(g1 - g0), n = na * B;
    Workspace::Scope scope(ws);

    // host lists: block tokens, positions, candidates (ring rows oldest -> newest, -1 padded to W, then the block's
    // B rows), the wo_a group maps
    std::vector<int32_t> tokens(static_cast<size_t>(n)), cand(static_cast<size_t>(n * (W + B)), -1);
    std::vector<int32_t> gfwd(static_cast<size_t>(n * G)), gback(static_cast<size_t>(n * G));
    std::vector<int64_t> pos(static_cast<size_t>(n));
    int max_k = 0;
    for (int64_t a = 0; a < na; ++a) {
      const DraftSeq& s = seqs[act[g0 + size_t(a)]];
      const int64_t P = s.pos + 1;  // the anchor's position
      max_k = std::max(max_k, s.n_draft);
      std::vector<int32_t> window;
      for (int64_t q = std::max<int64_t>(0, P - W); q < P; ++q) window.push_back(int32_t(s.slot * W + q % W));
      for (int64_t b = 0; b < B; ++b) {
        const int64_t row = a * B + b;
        tokens[size_t(row)] = b == 0 ? s.token : int32_t(cfg_.dspark.noise_token_id);
        pos[size_t(row)] = P + b;
        int32_t* c = &cand[size_t(row * (W + B))];
        std::copy(window.begin(), window.end(), c);
        for (int64_t b2 = 0; b2 < B; ++b2) c[W + b2] = int32_t(n_ring + a * B + b2);
      }
    }
    for (int64_t t = 0; t < n; ++t)
      for (int64_t g = 0; g < G; ++g) {
        gfwd[size_t(g * n + t)] = int32_t(t * G + g);
        gback[size_t(t * G + g)] = int32_t(g * n + t);
      }
    std::vector<float> cs_host(static_cast<size_t>(n * rd));
    rope_plain_.cos_sin(pos, cs_host.data());
    DeviceLists dl;
    const size_t i_tok = dl.add(tokens), i_cand = dl.add(cand), i_gf = dl.add(gfwd), i_gb = dl.add(gback);
    dl.upload(*be_, ws);
    float* cs = ws.alloc<float>(std::max<int64_t>(n * rd, 1));
    if (!cs_host.empty()) be_->copy_to_device(cs, cs_host.data(), cs_host.size() * 4);
    BlockPass bp{n, dl[i_tok], dl[i_cand], dl[i_gf], dl[i_gb], cs, W + B};
    DevicePlan dp;  // what moe() reads of a plan: the tokens (hash routing only; the stages never hash)
    dp.tokens = bp.tokens;

    // the block through the stages (docs/dspark.md steps 4-5)
    float* X = ws.alloc<float>(n * HC * D);  // [n, HC, D]
    ops().embed(embed_, bp.tokens, n, HCi, X);
    for (int s = 0; s < cfg_.dspark.n_stages; ++s) {
      const int l = draft_layer_ + s;
      const LayerResident& p = lr_[size_t(l)];
      Workspace::Scope ss(ws);
      float* u = ws.alloc<float>(n * D);
      float* post = ws.alloc<float>(n * HC);
      float* comb = ws.alloc<float>(n * HC * HC);
      float* y = ws.alloc<float>(n * D);
      ops().hc_pre_norm(X, n, HCi, D, p.hc_attn_fn, p.hc_attn_scale, p.hc_attn_base, cfg_.hc_sinkhorn_iters, hc_eps,
                        eps, bf, p.attn_norm, u, post, comb);
      {  // attention: queries and block rows from u; candidates: the stage's ring + the block rows, both directions
        Workspace::Scope as(ws);
        float* qr = ws.alloc<float>(n * QL);
        float* q = ws.alloc<float>(n * H * Dh);
        float* kv = ws.alloc<float>(n * Dh);
        float* o = ws.alloc<float>(n * H * Dh);
        attn_project(p, u, n, qr, kv);
        attn_query(p, qr, n, bp.cs, q);
        window_rows(p, kv, n, bp.cs, RowCodec::f32(Dh), kv);  // fresh fp32 rows, not stored
        KvRows rows{pool.layer(l).ring.as<float>(), n_ring, kv, n, nullptr, 0, Dh, L.kv_row};
        ops().sparse_attention(q, n, H, rows, bp.cand, bp.k_cand, nullptr, 0, p.attn_sink,
                               float(cfg_.softmax_scale()), bf, o);
        attn_output(p, o, n, bp.cs, bp.group_fwd, bp.group_back, y);
      }
      ops().hc_post(y, X, post, comb, n, HCi, D, bf, X);
      ops().hc_pre_norm(X, n, HCi, D, p.hc_ffn_fn, p.hc_ffn_scale, p.hc_ffn_base, cfg_.hc_sinkhorn_iters, hc_eps,
                        eps, bf, p.ffn_norm, u, post, comb);
      moe(l, dp, n, u, y);
      ops().hc_post(y, X, post, comb, n, HCi, D, bf, X);
    }
    // step 6: u = hc_head(X; the last stage's hc_head) (pre-norm, the confidence input), h = norm(u)
    float* uh = ws.alloc<float>(n * D);
    float* h = ws.alloc<float>(n * D);
    ops().hc_head(X, n, HCi, D, dspark_.hc_head_fn, dspark_.hc_head_scale, dspark_.hc_head_base, hc_eps, eps, bf, uh);
    ops().rmsnorm(uh, n, D, dspark_.norm, eps, bf, h);

    // steps 7-8: the sequential Markov loop, a few rows at a time (bounded scratch); one copy back per group
    constexpr int64_t kHeadRows = 16;
    std::vector<int32_t> prev(static_cast<size_t>(na));
    std::vector<char> live(static_cast<size_t>(na), 1);
    for (int64_t a = 0; a < na; ++a) prev[size_t(a)] = seqs[act[g0 + size_t(a)]].token;
    for (int j = 0; j < max_k; ++j) {
      std::vector<int64_t> run;  // sequences of the group still drafting at j
      for (int64_t a = 0; a < na; ++a)
        if (live[size_t(a)] && seqs[act[g0 + size_t(a)]].n_draft > j) run.push_back(a);
      for (size_t c0 = 0; c0 < run.size(); c0 += size_t(kHeadRows)) {
        const size_t c1 = std::min(run.size(), c0 + size_t(kHeadRows));
        const int64_t m = int64_t(c1 - c0);
        Workspace::Scope hs(ws);
        std::vector<int32_t> rows, toks, iota;
        for (size_t c = c0; c < c1; ++c) {
          rows.push_back(int32_t(run[c] * B + j));
          toks.push_back(prev[size_t(run[c])]);
          iota.push_back(int32_t(c - c0));
        }
        DeviceLists hl;
        const size_t i_rows = hl.add(rows), i_toks = hl.add(toks), i_iota = hl.add(iota);
        hl.upload(*be_, ws);
        float* hj = ws.alloc<float>(m * D);
        float* logits = ws.alloc<float>(m * V);
        float* e = ws.alloc<float>(m * r);
        float* bias = ws.alloc<float>(m * V);
        ops().gather_rows(h, n, nullptr, hl[i_rows], m, D, hj);
        ops().linear(head_, hj, m, logits, bf16_weight_opts());  // fp32 base logits U_j
        ops().embed(dspark_.markov_w1, hl[i_toks], m, 1, e);      // W1[prev_j]
        LinearOpts mo = bf16_weight_opts();                        // fp32 product of bf16 values
        ops().linear(dspark_.markov_w2, e, m, bias, mo);
        ops().add_rows(logits, m, V, bias, hl[i_iota]);           // U_j + W2 · W1[prev_j]
        if (confidence) {  // c_j = sigmoid(conf_h · u_j + conf_e · W1[prev_j]), fp32
          float* uj = ws.alloc<float>(m * D);
          float* c = ws.alloc<float>(2 * m);
          ops().gather_rows(uh, n, nullptr, hl[i_rows], m, D, uj);
          ops().linear(dspark_.conf_h, uj, m, c, LinearOpts{});
          ops().linear(dspark_.conf_e, e, m, c + m, LinearOpts{});
          conf_host.resize(size_t(2 * m));
          be_->copy_to_host(conf_host.data(), c, size_t(2 * m) * 4);
        }
        int32_t* bad = ws.alloc<int32_t>(m);
        ops().check_finite(logits, m, V, bad);
        bad_host.resize(size_t(m));
        be_->copy_to_host(bad_host.data(), bad, size_t(m) * 4);
        const float* host = logits;  // the CPU backend's memory is host memory: no copy
        if (!be_->device().is_cpu()) {
          logits_host.resize(size_t(m * V));
          be_->copy_to_host(logits_host.data(), logits, size_t(m * V) * 4);
          host = logits_host.data();
        }
        for (int64_t x = 0; x < m; ++x) {
          const int64_t a = run[c0 + size_t(x)];
          const size_t i = act[g0 + size_t(a)];
          if (confidence) {
            const double z = double(conf_host[size_t(x)]) + double(conf_host[size_t(m + x)]);
            (*confidence)[i].push_back(float(1.0 / (1.0 + std::exp(-z))));
          }
          const int32_t t = sink ? sink(i, j, std::span<const float>(host + x * V, size_t(V)), bad_host[size_t(x)] == 0)
                                 : -1;
          if (t < 0 || t >= V) live[size_t(a)] = 0;
          else prev[size_t(a)] = t;
        }
      }
    }
  }
}

}  // namespace dsv4
