// The DeepSeek V4 forward pass over a batch of sequences (spec §5.1–§5.3, §5.8): validation, ubatch split, step
// plan, embedding into the hc streams, blocks with hyper-connections, final hc_head + norm + head for the wanted rows;
// the single-sequence entry point as a batch of one. Attention, compressor, indexer and MoE live in their own files.
// Everything between the plan upload and the logits copy runs on the backend's device.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <exception>

#include "backend/parallel.h"
#include "core/error.h"
#include "model/model.h"

namespace dsv4 {

void Model::forward(SequenceState& st, std::span<const int32_t> tokens, const std::function<bool(int64_t)>& want_logits,
                    const LogitsSink& sink) const {
  const int64_t n = int64_t(tokens.size());
  if (n == 0) return;
  if (st.backend != be_ || st.pool.backend() != be_) fail("internal: sequence state lives on another backend");
  if (st.n_past + n > cfg_.max_position_embeddings)
    fail("context overflow: {} + {} positions exceed max_position_embeddings {}", st.n_past, n,
         cfg_.max_position_embeddings);
  st.reserve(cfg_, st.n_past + n);
  Batch b;
  BatchSeq& s = b.seqs.emplace_back();
  s.slot = 0;
  s.p0 = st.n_past;
  s.tokens = tokens;
  s.pages = st.pages;
  s.logits = BatchSeq::Logits::mask;
  s.mask.resize(size_t(n));
  for (int64_t j = 0; j < n; ++j) s.mask[size_t(j)] = want_logits ? char(want_logits(st.n_past + j)) : 0;
  forward(b, st.pool, [&](size_t, int64_t p, std::span<const float> lg, bool finite) {
    if (!finite) {
      st.n_past += n;  // the state holds every position of the call (as after a successful one)
      fail("non-finite logits at position {}", p);
    }
    if (sink) sink(p, lg);
  });
  st.n_past += n;
}

void Model::validate(const Batch& b, const StatePool& pool) const {
  if (pool.backend() != be_) fail("internal: state pool lives on another backend");
  const StateLayout& L = pool.layout();
  if (L.layers.size() != size_t(cfg_.num_hidden_layers + L.n_draft_layers))
    fail("internal: state pool does not match the model");
  if (L.has_drafter() && L.drafter != drafter_)
    fail("internal: a state pool with a drafter's layers needs a model loaded with that drafter");
  if (pool.layout().row_format == RowFormat::compact && (!bf16() || !be_->compact_state_rows()))
    fail("internal: a state pool with compact rows needs reference numerics on a backend that reads them");
  std::vector<char> used(size_t(pool.n_slots()), 0);
  for (const BatchSeq& s : b.seqs) {
    const int64_t n = s.n();
    if (n == 0) fail("batch: a sequence without tokens");
    if (s.slot < 0 || s.slot >= pool.n_slots()) fail("batch: slot {} outside [0, {})", s.slot, pool.n_slots());
    if (used[size_t(s.slot)]++) fail("batch: slot {} appears twice", s.slot);
    if (s.p0 < 0) fail("batch: negative position {}", s.p0);
    if (s.p0 + n > cfg_.max_position_embeddings)
      fail("context overflow: {} + {} positions exceed max_position_embeddings {}", s.p0, n,
           cfg_.max_position_embeddings);
    for (int32_t t : s.tokens)
      if (t < 0 || t >= cfg_.vocab_size) fail("token id {} outside the vocabulary [0, {})", t, cfg_.vocab_size);
    const int64_t need = StateLayout::pages_for(s.p0 + n);
    if (pool.layout().any_compressed) {
      if (int64_t(s.pages.size()) < need)
        fail("batch: slot {} has {} pages for {} positions (needs {})", s.slot, s.pages.size(), s.p0 + n, need);
      for (int64_t k = 0; k < need; ++k)
        if (s.pages[size_t(k)] < 0 || s.pages[size_t(k)] >= pool.n_pages())
          fail("batch: page id {} outside [0, {})", s.pages[size_t(k)], pool.n_pages());
    }
    if (s.next_token >= cfg_.vocab_size)
      fail("token id {} outside the vocabulary [0, {})", s.next_token, cfg_.vocab_size);
    if (s.spec) {
      if (!L.has_drafter()) fail("batch: a verify step (spec) needs a state pool with a drafter's layers");
      if (n > L.spec_rows || n > opts_.ubatch)
        fail("batch: a verify step has {} tokens (at most {} and the ubatch {})", n, L.spec_rows, opts_.ubatch);
      for (const auto& sn : s.snapshots)  // only states that every outcome keeps
        if (sn.at != s.p0 + 1) fail("batch: a verify step takes snapshots only after its first token");
    }
    for (const auto& sn : s.snapshots) {
      if (sn.at % StateLayout::kPageTokens != 0 || sn.at <= s.p0 || sn.at > s.p0 + n)
        fail("batch: snapshot at {} is not a multiple of {} in ({}, {}]", sn.at, StateLayout::kPageTokens, s.p0,
             s.p0 + n);
      if (sn.id < 0 || sn.id >= pool.n_snapshots())
        fail("batch: snapshot id {} outside [0, {})", sn.id, pool.n_snapshots());
    }
  }
}

void Model::forward(const Batch& b, StatePool& pool, const BatchLogitsSink& sink) const {
  validate(b, pool);
  std::lock_guard<std::mutex> lock(mu_);
  // ubatches of <= opts_.ubatch tokens, filled in batch order; a sequence that does not fit continues in the next
  // one (its later tokens then see the state its earlier ones left, exactly as a chunked prefill)
  std::vector<PlanPiece> pieces;
  int64_t room = opts_.ubatch;
  auto flush = [&] {
    if (pieces.empty()) return;
    if (const int lanes = lane_count(pieces, pool); lanes > 1)
      forward_lanes(std::move(pieces), lanes, pool, sink);
    else {
      plan_.rebuild(cfg_, pool.layout(), rope_plain_, rope_yarn_, pool.n_slots(), std::move(pieces));
      forward_ubatch(plan_, pool, sink);
      plan_.pieces.clear();  // (they point into the caller's batch)
    }
    pieces.clear();
    room = opts_.ubatch;
  };
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const BatchSeq& s = b.seqs[i];
    if (s.spec && room < s.n()) flush();  // a verify step stays in one ubatch (one set of speculation rows)
    for (int64_t off = 0; off < s.n();) {
      if (room == 0) flush();
      const int64_t m = std::min(room, s.n() - off);
      PlanPiece pc;
      pc.seq = i;
      pc.slot = s.slot;
      pc.p0 = s.p0 + off;
      pc.tokens = s.tokens.subspan(size_t(off), size_t(m));
      pc.pages = s.pages;
      pc.want.resize(size_t(m));
      for (int64_t j = 0; j < m; ++j) pc.want[size_t(j)] = char(s.wants(off + j));
      pc.spec = s.spec;
      if (pool.layout().has_mtp()) {
        pc.next.resize(size_t(m));
        for (int64_t j = 0; j < m; ++j)
          pc.next[size_t(j)] = off + j + 1 < s.n() ? s.tokens[size_t(off + j + 1)] : s.next_token;
      }
      for (const auto& sn : s.snapshots)
        if (sn.at > pc.p0 && sn.at <= pc.p0 + m) pc.snapshots.push_back({sn.at, sn.id});
      pieces.push_back(std::move(pc));
      room -= m;
      off += m;
    }
  }
  flush();
}

// Lanes (CPU). linear_batch runs a product of fewer than 2^21 multiply-adds on the calling thread, and the other ops
// have bars of the same order, so a step of a few tokens of a small model (the demo model's 8 decodes) runs nearly
// all of its layers on one thread while the others wait; larger steps of a small model run each op on the pool, but
// with a fork and join per op (with sleeping workers, a wake-up each) and little work between them. Such a step of
// several sequences runs as lanes instead: the sequences in groups of about equal token counts, each group's layers
// on a thread of its own as a step of its own (its plan, its workspace; the ops inside run on that thread), then one
// head over the wanted rows of all groups on the whole pool. A sequence's results do not depend on what else shares
// its step (batch invariance), so they are bitwise those of the single step, and they reach the head and the sink in
// the single step's order. Each lane reads every layer weight: lanes for steps of more than small products only
// when all the layers' weights are a few MiB (they stay in cache) and the longest lane is shorter than the step over
// the pool's speedup, taken as 2/3 of its threads (measured on the demo model, 2 threads: ~1.3x for a 512-token step).
namespace {
// Pieces to lanes: longest first, each to the lane with the fewest tokens so far. Returns the lane of each piece and
// the tokens of the longest lane.
std::vector<int> assign_lanes(const std::vector<PlanPiece>& pieces, int n_lanes, int64_t* longest) {
  std::vector<size_t> order(pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return pieces[a].tokens.size() > pieces[b].tokens.size(); });
  std::vector<int64_t> lane_tokens(static_cast<size_t>(n_lanes), 0);
  std::vector<int> lane_of(pieces.size());
  for (size_t i : order) {
    const auto it = std::min_element(lane_tokens.begin(), lane_tokens.end());
    lane_of[i] = int(it - lane_tokens.begin());
    *it += int64_t(pieces[i].tokens.size());
  }
  *longest = *std::max_element(lane_tokens.begin(), lane_tokens.end());
  return lane_of;
}
}  // namespace

int Model::lane_count(const std::vector<PlanPiece>& pieces, const StatePool& pool) const {
  constexpr int64_t kSmallProduct = int64_t(1) << 21;          // linear_batch's bar for the pool
  constexpr uint64_t kCachedWeights = uint64_t(16) << 20;      // "a few MiB" of layer weights
  if (!be_->device().is_cpu() || graphs_ || hook_ || route_observer_ || split_ || pool.layout().has_drafter() ||
      pieces.size() < 2)
    return 1;
  int64_t n = 0;
  for (const PlanPiece& pc : pieces) {
    if (pc.spec) return 1;
    n += int64_t(pc.tokens.size());
  }
  const int threads = max_threads();
  const int lanes = int(std::min<int64_t>(threads, int64_t(pieces.size())));
  if (lanes < 2) return 1;
  if (n * largest_layer_product_ < kSmallProduct) return lanes;
  if (layer_weight_bytes_ > kCachedWeights) return 1;
  int64_t longest = 0;
  assign_lanes(pieces, lanes, &longest);
  return 2 * int64_t(threads) * longest < 3 * n ? lanes : 1;
}

void Model::forward_lanes(std::vector<PlanPiece> pieces, int n_lanes, StatePool& pool,
                          const BatchLogitsSink& sink) const {
  const int64_t D = cfg_.hidden_size, HC = cfg_.hc_mult;
  const size_t lanes = static_cast<size_t>(n_lanes);
  int64_t longest = 0;
  const std::vector<int> lane_of = assign_lanes(pieces, n_lanes, &longest);  // (a lane keeps batch order)
  // the wanted rows in the single step's order (pieces in batch order, positions ascending); per lane, the place of
  // each of its wanted rows in that order (its plan lists them in its own piece order, positions ascending)
  std::vector<std::vector<PlanPiece>> lane_pieces(lanes);
  std::vector<std::vector<int32_t>> dst(lanes);
  std::vector<size_t> seq;
  std::vector<int64_t> pos;
  for (size_t i = 0; i < pieces.size(); ++i) {
    PlanPiece& pc = pieces[i];
    const size_t lane = size_t(lane_of[i]);
    for (size_t j = 0; j < pc.want.size(); ++j)
      if (pc.want[j]) {
        dst[lane].push_back(int32_t(seq.size()));
        seq.push_back(pc.seq);
        pos.push_back(pc.p0 + int64_t(j));
      }
    lane_pieces[lane].push_back(std::move(pc));
  }
  const int64_t nl = int64_t(seq.size());
  ++lane_steps_;
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* rows = ws.alloc<float>(std::max<int64_t>(nl, 1) * HC * D);  // [nl, HC, D] the streams of the wanted rows
  std::vector<Workspace*> lane_ws(lanes);
  for (int i = 0; i < n_lanes; ++i) lane_ws[size_t(i)] = &be_->lane_workspace(i);
  std::vector<std::exception_ptr> errors(lanes);
  parallel_tasks(n_lanes, [&](int i) {
    try {
      Backend::LaneScope use(*be_, *lane_ws[size_t(i)]);
      Workspace& lw = be_->workspace();
      Workspace::Scope ls(lw);
      const StepPlan plan = StepPlan::build(cfg_, pool.layout(), rope_plain_, rope_yarn_, pool.n_slots(),
                                            std::move(lane_pieces[size_t(i)]));
      const DevicePlan dp = DevicePlan::upload(plan, *be_, lw);
      float* X = lw.alloc<float>(plan.n * HC * D);
      ops().embed(embed_, dp.tokens, plan.n, int(HC), X);  // §5.1
      for (int l = 0; l < cfg_.num_hidden_layers; ++l) block(l, pool, plan, dp, X);
      // (dst: host memory, which is the CPU backend's)
      ops().scatter_rows(X, dp.logit_rows, rows, dst[size_t(i)].data(), int64_t(dst[size_t(i)].size()), HC * D);
    } catch (...) {
      errors[size_t(i)] = std::current_exception();
    }
  });
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<int32_t> all(seq.size());
  for (int64_t r = 0; r < nl; ++r) all[size_t(r)] = int32_t(r);
  head_rows(rows, nl, all.data(), seq, pos, sink);
}

void Model::forward_ubatch(const StepPlan& plan, StatePool& pool, const BatchLogitsSink& sink) const {
  const int64_t n = plan.n, D = cfg_.hidden_size, HC = cfg_.hc_mult;
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  const Workspace::Mark ws_at = ws.mark();
  const DevicePlan dp = DevicePlan::upload(plan, *be_, ws, &plan_staging_);

  float* X = ws.alloc<float>(n * HC * D);
  const std::vector<int>& targets = cfg_.dspark.target_layer_ids;
  float* MH = plan.dspark ? ws.alloc<float>(n * int64_t(targets.size()) * D) : nullptr;  // [n, T*D]
  // The step's layers in segments [l0, l1): the embedding joins the first, the drafter's context rows and the MTP
  // block the last. A layer whose experts are split with the host (its MoE waits on the host's experts inside the
  // step) is a segment of its own that always runs eagerly; any other segment may be recorded as a CUDA graph.
  const int L = cfg_.num_hidden_layers;
  auto segment = [&](int l0, int l1) {
    if (l0 == 0) ops().embed(embed_, dp.tokens, n, int(HC), X);  // §5.1: e = embed[token]; X = [e, e, e, e]
    for (int l = l0; l < l1; ++l) {
      if (plan.dspark)  // DSpark: the streams entering its target layers (docs/dspark.md step 1)
        for (size_t i = 0; i < targets.size(); ++i)
          if (targets[i] == l) dspark_capture(plan, dp, X, int(i), MH);
      block(l, pool, plan, dp, X);
    }
    // DSpark: every stage's context row of every position (docs/dspark.md steps 2-3)
    if (l1 == L && plan.dspark) dspark_context(pool, plan, dp, MH);
    // §5.9 the MTP block on every position (its window ring must hold the rows of every position a draft attends
    // to); the hidden streams of each sequence's last positions are kept as the input of the next draft
    if (l1 == L && plan.mtp) {
      Workspace::Scope ms(ws);
      ops().scatter_rows(X, dp.hid_src, pool.hidden().as<float>(), dp.hid_dst, int64_t(plan.hid_src.size()), HC * D);
      float* Xm = ws.alloc<float>(n * HC * D);
      mtp_input(X, dp.next, dp.hc_rows, n, Xm);
      block(draft_layer_, pool, plan, dp, Xm);
    }
  };
  auto split = [&](int l) { return lr_[size_t(l)].split.n_host > 0; };
  // Recorded steps (CUDA graphs) for decode-sized steps (<= kGraphMaxTokens tokens, where launches dominate), verify
  // steps of speculative decoding included: each segment up to the head, keyed by the plan's shape (its sizes decide
  // every host-side branch, the verify steps' saves of what a rollback needs too), the buffers it reaches (the
  // pool's, the workspace mark: the plan upload and every scratch address follow from it) and its layers. Steps
  // with an op hook (profiling: synchronizes per op) run eagerly.
  constexpr int64_t kGraphMaxTokens = 128;
  std::vector<int64_t> key;
  if (graphs_ && !hook_ && n <= kGraphMaxTokens) {
    key = plan.shape_key();
    key.insert(key.end(), {int64_t(ws_at.chunk), int64_t(ws_at.offset), pool.n_slots(), pool.n_pages(),
                           pool.n_snapshots()});
    auto addr = [&](const Buffer& b) { key.push_back(int64_t(reinterpret_cast<uintptr_t>(b.data()))); };
    addr(pool.hidden());
    for (int l = 0; l < int(pool.layout().layers.size()); ++l) {
      const StatePool::LayerBuffers& lb = pool.layer(l);
      for (const Buffer* b : {&lb.ring, &lb.cmp_k, &lb.cmp_s, &lb.idx_k, &lb.idx_s, &lb.comp, &lb.keys, &lb.snap_ring,
                              &lb.snap_cmp_k, &lb.snap_cmp_s, &lb.snap_idx_k, &lb.snap_idx_s, &lb.spec_ring,
                              &lb.spec_cmp_k, &lb.spec_cmp_s, &lb.spec_idx_k, &lb.spec_idx_s})
        addr(*b);
    }
  }
  for (int l0 = 0; l0 < L;) {
    int l1 = l0 + 1;
    if (!split(l0))
      while (l1 < L && !split(l1)) ++l1;
    if (key.empty() || split(l0)) {
      segment(l0, l1);
    } else {
      std::vector<int64_t> k2 = key;
      k2.insert(k2.end(), {l0, l1});
      graphs_->run(k2, [&] { segment(l0, l1); });
    }
    l0 = l1;
  }

  head_rows(X, n, dp.logit_rows, plan.logit_seq, plan.logit_pos, sink);
}

void Model::head_rows(const float* X, int64_t n, const int32_t* rows, std::span<const size_t> seq,
                      std::span<const int64_t> pos, const BatchLogitsSink& sink) const {
  // §5.8 head for the requested positions, a few rows at a time (bounded scratch); one copy back per group.
  constexpr int64_t kHeadRows = 16;
  const int64_t D = cfg_.hidden_size, HC = cfg_.hc_mult;
  const int64_t V = cfg_.vocab_size, nl = int64_t(seq.size());
  Workspace& ws = be_->workspace();
  for (int64_t r0 = 0; r0 < nl; r0 += kHeadRows) {
    Workspace::Scope hs(ws);
    const int64_t nr = std::min<int64_t>(kHeadRows, nl - r0);
    float* xs = ws.alloc<float>(nr * HC * D);
    ops().gather_rows(X, n, nullptr, rows + r0, nr, HC * D, xs);
    float* logits = ws.alloc<float>(nr * V);
    int32_t* bad = ws.alloc<int32_t>(nr);
    head(xs, nr, logits, bad);
    bad_host_.resize(size_t(nr));
    be_->copy_to_host(bad_host_.data(), bad, size_t(nr) * 4);
    const float* host = logits;  // the CPU backend's memory is host memory: no copy
    if (!be_->device().is_cpu()) {
      logits_host_.resize(size_t(nr * V));
      be_->copy_to_host(logits_host_.data(), logits, size_t(nr * V) * 4);
      host = logits_host_.data();
    }
    for (int64_t i = 0; i < nr; ++i) {
      const size_t k = size_t(r0 + i);
      if (sink) sink(seq[k], pos[k], std::span<const float>(host + i * V, size_t(V)), bad_host_[size_t(i)] == 0);
    }
  }
}

void Model::block(int l, StatePool& pool, const StepPlan& plan, const DevicePlan& dp, float* X) const {
  const LayerResident& p = lr_[size_t(l)];
  const int64_t n = plan.n, D = cfg_.hidden_size;
  const int HC = cfg_.hc_mult;
  const float hc_eps = float(cfg_.hc_eps), eps = float(cfg_.rms_norm_eps);
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* u = ws.alloc<float>(n * D);
  float* post = ws.alloc<float>(n * HC);
  float* comb = ws.alloc<float>(n * HC * HC);
  float* y = ws.alloc<float>(n * D);
  // §5.2 attention sublayer
  ops().hc_pre_norm(X, n, HC, D, p.hc_attn_fn, p.hc_attn_scale, p.hc_attn_base, cfg_.hc_sinkhorn_iters, hc_eps, eps,
                    bf16(), p.attn_norm, u, post, comb);
  attention(l, pool, plan, dp, u, y);
  ops().hc_post(y, X, post, comb, n, HC, D, bf16(), X);
  // §5.2 FFN sublayer
  ops().hc_pre_norm(X, n, HC, D, p.hc_ffn_fn, p.hc_ffn_scale, p.hc_ffn_base, cfg_.hc_sinkhorn_iters, hc_eps, eps,
                    bf16(), p.ffn_norm, u, post, comb);
  moe(l, dp, n, u, y);
  ops().hc_post(y, X, post, comb, n, HC, D, bf16(), X);
}

void Model::head(const float* X, int64_t n, float* logits, int32_t* bad) const {
  const int64_t D = cfg_.hidden_size;
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  float* u = ws.alloc<float>(n * D);
  ops().hc_head(X, n, cfg_.hc_mult, D, hc_head_fn_, hc_head_scale_, hc_head_base_, float(cfg_.hc_eps),
                float(cfg_.rms_norm_eps), bf16(), u);
  ops().rmsnorm(u, n, D, norm_, float(cfg_.rms_norm_eps), bf16(), u);
  // fp32 logits from the upcast bf16 head (§5.8), and which rows hold a NaN or inf
  ops().linear_check_finite(head_, u, n, logits, bf16_weight_opts(), bad);
}

std::vector<float> Model::logits_all(std::span<const int32_t> tokens) const {
  SequenceState st = fresh_state();
  const int64_t V = cfg_.vocab_size;
  std::vector<float> out(tokens.size() * size_t(V));
  forward(st, tokens, [](int64_t) { return true; },
          [&](int64_t p, std::span<const float> lg) { std::copy(lg.begin(), lg.end(), out.begin() + p * V); });
  return out;
}

}  // namespace dsv4
