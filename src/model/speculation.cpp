// Draft and rollback of speculative decoding (model/speculation.h). Host side: index lists from positions; device
// side: row gathers / scatters between the state pool's rings, frontiers and speculation rows, and the MTP block.
#include <algorithm>
#include <set>

#include "core/error.h"
#include "model/device_lists.h"
#include "model/model.h"

namespace dsv4 {

namespace {

// The frontier rows a step of n tokens at p0 changes (the step plan's frontier update, step_plan.cpp), as a map
// row -> index among the changed rows (ascending row order), -1 where unchanged.
std::vector<int64_t> changed_rows(int m, int coff, int64_t p0, int64_t n) {
  const int64_t nr = int64_t(coff) * m, base = coff == 2 ? m : 0, p_end = p0 + n, w0 = p0 / m, w_end = p_end / m;
  std::vector<int64_t> idx(static_cast<size_t>(nr), -1);
  int64_t k = 0;
  for (int64_t j = 0; j < nr; ++j) {
    bool changed;
    if (coff == 2 && j < m) {
      const int64_t prev = (w_end - 1) * m + j;
      changed = w_end > 0 && (prev >= p0 || prev / m != w0 - 1);
    } else {
      const int64_t cur = w_end * m + (j - base);
      changed = cur >= p0 && cur < p_end;
    }
    if (changed) idx[size_t(j)] = k++;
  }
  return idx;
}

}  // namespace

void Model::rollback(std::span<const SpecRollback> seqs, StatePool& pool) const {
  const StateLayout& L = pool.layout();
  if (!L.has_drafter() || pool.backend() != be_)
    fail("rollback: the state pool has no speculation rows of this model");
  const int64_t R = L.spec_rows, W = L.window;
  std::set<int64_t> slots;
  for (const SpecRollback& s : seqs) {
    if (s.slot < 0 || s.slot >= pool.n_slots()) fail("rollback: slot {} outside [0, {})", s.slot, pool.n_slots());
    if (!slots.insert(s.slot).second) fail("rollback: slot {} appears twice", s.slot);
    if (s.n < 1 || s.n > R || s.keep < 1 || s.keep > s.n || s.p0 < 0)
      fail("rollback: a verify step of {} tokens at {} keeping {} (1 <= keep <= n <= {})", s.n, s.p0, s.keep, R);
  }
  std::lock_guard<std::mutex> lock(mu_);
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  DeviceLists dl;
  // rings: the rows of the dropped positions get back what the verify step overwrote
  std::vector<int32_t> rs, rd;
  for (const SpecRollback& s : seqs)
    for (int64_t j = s.keep; j < s.n; ++j) {
      rs.push_back(int32_t(s.slot * R + j));
      rd.push_back(int32_t(s.slot * W + (s.p0 + j) % W));
    }
  const size_t i_rs = dl.add(rs), i_rd = dl.add(rd);
  // frontiers per compress ratio: each row the kept state needs, from the saved rows, the step's projections or
  // the frontier itself (sources: [0, n_slots * (U + R)) speculation rows, then frontier rows)
  struct RatioLists {
    int m = 0, coff = 1;
    int64_t U = 0;
    size_t src = 0, dst = 0;
  };
  std::vector<RatioLists> rls;
  std::set<int> ms;
  for (const auto& ly : L.layers)
    if (ly.ratio > 0 && !ms.count(ly.ratio)) {
      ms.insert(ly.ratio);
      RatioLists r;
      r.m = ly.ratio;
      r.coff = ly.coff;
      r.U = ly.changed_rows(R);
      const int64_t m = r.m, nr = int64_t(r.coff) * m, base = r.coff == 2 ? m : 0, U = r.U;
      const int64_t n_a = pool.n_slots() * (U + R);
      std::vector<int32_t> src, dst;
      for (const SpecRollback& s : seqs) {
        if (s.keep == s.n) continue;
        const std::vector<int64_t> ch = changed_rows(r.m, r.coff, s.p0, s.n);
        const int64_t P = s.p0, Pk = s.p0 + s.keep, w0 = P / m, wk = Pk / m, sb = s.slot * (U + R);
        for (int64_t j = 0; j < nr; ++j) {
          int64_t q;
          if (r.coff == 2 && j < m) {
            if (wk == 0) continue;
            q = (wk - 1) * m + j;
          } else {
            q = wk * m + (j - base);
            if (q >= Pk) continue;  // not a position of the kept state: never read
          }
          int64_t from;
          if (q >= P) {
            from = sb + U + (q - P);
          } else {
            int64_t r_old;
            if (q / m == w0) r_old = base + q % m;
            else if (r.coff == 2 && q / m == w0 - 1) r_old = q % m;
            else fail("internal: rollback needs position {} that the frontier at {} does not hold", q, P);
            from = ch[size_t(r_old)] >= 0 ? sb + ch[size_t(r_old)] : n_a + s.slot * nr + r_old;
          }
          if (from == n_a + s.slot * nr + j) continue;  // unchanged
          src.push_back(int32_t(from));
          dst.push_back(int32_t(s.slot * nr + j));
        }
      }
      r.src = dl.add(src);
      r.dst = dl.add(dst);
      rls.push_back(r);
    }
  int64_t n_iota = 1;
  for (const auto& r : rls) n_iota = std::max(n_iota, dl.size(r.src));
  std::vector<int32_t> iota(static_cast<size_t>(n_iota));
  for (int64_t i = 0; i < n_iota; ++i) iota[size_t(i)] = int32_t(i);
  const size_t i_iota = dl.add(iota);
  dl.upload(*be_, ws);

  for (size_t l = 0; l < L.layers.size(); ++l) {
    const StateLayout::Layer& ly = L.layers[l];
    StatePool::LayerBuffers& b = pool.layer(int(l));
    if (dl.size(i_rs))
      ops().scatter_rows(b.spec_ring.as<float>(), dl[i_rs], b.ring.as<float>(), dl[i_rd], dl.size(i_rs),
                         L.kv_row.words());
    if (ly.ratio == 0) continue;
    const RatioLists& r = *std::find_if(rls.begin(), rls.end(), [&](const RatioLists& x) { return x.m == ly.ratio; });
    const int64_t nn = dl.size(r.src);
    if (nn == 0) continue;
    const int64_t n_a = pool.n_slots() * (r.U + R);
    auto restore = [&](const Buffer& spec, Buffer& fr, int64_t width) {
      Workspace::Scope s2(ws);
      float* tmp = ws.alloc<float>(nn * width);
      ops().gather_rows(spec.as<float>(), n_a, fr.as<float>(), dl[r.src], nn, width, tmp);
      ops().scatter_rows(tmp, dl[i_iota], fr.as<float>(), dl[r.dst], nn, width);
    };
    restore(b.spec_cmp_k, b.cmp_k, ly.coff * L.head_dim);
    restore(b.spec_cmp_s, b.cmp_s, ly.coff * L.head_dim);
    if (ly.indexer) {
      restore(b.spec_idx_k, b.idx_k, ly.coff * L.index_head_dim);
      restore(b.spec_idx_s, b.idx_s, ly.coff * L.index_head_dim);
    }
  }
}

void Model::draft(std::span<const DraftSeq> seqs, StatePool& pool, const DraftSink& sink,
                  std::vector<std::vector<float>>* confidence) const {
  const StateLayout& L = pool.layout();
  if (!has_drafter() || L.drafter != drafter_ || pool.backend() != be_)
    fail("draft: needs a model loaded with its drafter and a state pool with the drafter's layers");
  if (confidence) confidence->assign(seqs.size(), {});
  std::set<int64_t> slots;
  for (const DraftSeq& s : seqs) {
    if (s.slot < 0 || s.slot >= pool.n_slots()) fail("draft: slot {} outside [0, {})", s.slot, pool.n_slots());
    if (!slots.insert(s.slot).second) fail("draft: slot {} appears twice", s.slot);
    if (s.n_draft < 0 || s.n_draft > max_draft()) fail("draft: {} draft tokens (0 .. {})", s.n_draft, max_draft());
    if (s.token < 0 || s.token >= cfg_.vocab_size)
      fail("token id {} outside the vocabulary [0, {})", s.token, cfg_.vocab_size);
    if (s.pos < 0 || s.pos + s.n_draft > cfg_.max_position_embeddings) fail("draft: position {} out of range", s.pos);
    if (s.snapshot >= pool.n_snapshots()) fail("draft: snapshot {} outside [0, {})", s.snapshot, pool.n_snapshots());
  }
  if (seqs.empty()) return;
  if (drafter_ == StateLayout::Drafter::dspark) return dspark_draft(seqs, pool, sink, confidence);
  mtp_draft(seqs, pool, sink);
}

void Model::mtp_draft(std::span<const DraftSeq> seqs, StatePool& pool, const DraftSink& sink) const {
  const StateLayout& L = pool.layout();
  const int64_t ns = int64_t(seqs.size()), HC = cfg_.hc_mult, D = cfg_.hidden_size, W = L.window;
  const int64_t R = L.spec_rows, V = cfg_.vocab_size;
  int max_k = 0;
  for (const DraftSeq& s : seqs) max_k = std::max(max_k, s.n_draft);
  std::lock_guard<std::mutex> lock(mu_);
  Workspace& ws = be_->workspace();
  Workspace::Scope scope(ws);
  StatePool::LayerBuffers& mb = pool.layer(draft_layer_);
  // the plan of an MTP-only step: the MTP layer alone (window only: no pages), no hidden rows kept
  StateLayout ml = L;
  ml.layers = {L.layers[size_t(draft_layer_)]};
  ml.drafter = StateLayout::Drafter::none;
  ml.draft_layer = -1;
  ml.n_draft_layers = 0;
  ml.any_compressed = false;

  // ring rows the chained drafts (positions pos + 1 .. pos + k - 1) overwrite, saved in the MTP layer's speculation
  // rows and put back at the end
  DeviceLists dl;
  std::vector<int32_t> ring_rows, spec_rows, hc_rows(static_cast<size_t>(ns * HC)), iota(static_cast<size_t>(ns));
  std::vector<int32_t> snap_src, snap_dst;  // the exact MTP row of pos into snapshots taken at pos + 1
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int j = 1; j < seqs[i].n_draft; ++j) {
      ring_rows.push_back(int32_t(seqs[i].slot * W + (seqs[i].pos + j) % W));
      spec_rows.push_back(int32_t(seqs[i].slot * R + j));
    }
    if (seqs[i].snapshot >= 0) {
      snap_src.push_back(int32_t(seqs[i].slot * W + seqs[i].pos % W));
      snap_dst.push_back(int32_t(seqs[i].snapshot * W + seqs[i].pos % W));
    }
  }
  for (int64_t i = 0; i < ns * HC; ++i) hc_rows[size_t(i)] = int32_t(i / HC);
  for (int64_t i = 0; i < ns; ++i) iota[size_t(i)] = int32_t(i);
  const size_t i_ring = dl.add(ring_rows), i_spec = dl.add(spec_rows), i_hc = dl.add(hc_rows), i_iota = dl.add(iota);
  const size_t i_ssrc = dl.add(snap_src), i_sdst = dl.add(snap_dst);
  dl.upload(*be_, ws);
  const int64_t n_save = dl.size(i_ring);
  if (n_save)
    ops().scatter_rows(mb.ring.as<float>(), dl[i_ring], mb.spec_ring.as<float>(), dl[i_spec], n_save,
                       L.kv_row.words());

  float* Y = ws.alloc<float>(ns * HC * D);  // [ns, HC, D] each sequence's last MTP block output
  std::vector<int32_t> tok(static_cast<size_t>(ns));
  std::vector<char> live(static_cast<size_t>(ns), 1);
  for (int64_t i = 0; i < ns; ++i) tok[size_t(i)] = seqs[size_t(i)].token;
  std::vector<float> logits_host;
  std::vector<int32_t> bad_host;
  for (int j = 0; j < std::max(max_k, 1); ++j) {
    std::vector<int64_t> act;  // step 0 runs for every sequence (n_draft 0: the MTP row of pos only)
    for (int64_t i = 0; i < ns; ++i)
      if (live[size_t(i)] && (j == 0 || seqs[size_t(i)].n_draft > j)) act.push_back(i);
    for (size_t g0 = 0; g0 < act.size(); g0 += size_t(opts_.ubatch)) {
      const size_t g1 = std::min(act.size(), g0 + size_t(opts_.ubatch));
      const int64_t na = int64_t(g1 - g0);
      std::vector<PlanPiece> pieces;
      std::vector<int32_t> in_idx, y_dst;
      for (size_t a = g0; a < g1; ++a) {
        const int64_t i = act[a];
        const DraftSeq& s = seqs[size_t(i)];
        PlanPiece pc;
        pc.seq = size_t(i);
        pc.slot = s.slot;
        pc.p0 = s.pos + j;
        pc.tokens = std::span<const int32_t>(&tok[size_t(i)], 1);
        pc.want = {1};
        pieces.push_back(std::move(pc));
        in_idx.push_back(int32_t(j == 0 ? ns + s.slot * R + s.pos % R : i));  // hidden row, then own output
        y_dst.push_back(int32_t(i));
      }
      const StepPlan plan = StepPlan::build(cfg_, ml, rope_plain_, rope_yarn_, pool.n_slots(), std::move(pieces));
      Workspace::Scope ss(ws);
      const DevicePlan dp = DevicePlan::upload(plan, *be_, ws);
      DeviceLists sl;
      const size_t i_in = sl.add(in_idx), i_y = sl.add(y_dst);
      sl.upload(*be_, ws);
      float* H = ws.alloc<float>(na * HC * D);
      ops().gather_rows(Y, ns, pool.hidden().as<float>(), sl[i_in], na, HC * D, H);
      float* Xm = ws.alloc<float>(na * HC * D);
      mtp_input(H, dp.tokens, dl[i_hc], na, Xm);
      block(draft_layer_, pool, plan, dp, Xm);
      ops().scatter_rows(Xm, dl[i_iota], Y, sl[i_y], na, HC * D);
      if (j == 0 && g1 == act.size() && dl.size(i_ssrc))  // every row of pos written: patch the snapshots
        ops().scatter_rows(mb.ring.as<float>(), dl[i_ssrc], mb.snap_ring.as<float>(), dl[i_sdst], dl.size(i_ssrc),
                           L.kv_row.words());
      if (j >= max_k) continue;  // only n_draft == 0 sequences: no logits wanted
      float* logits = ws.alloc<float>(na * V);
      mtp_head(Xm, na, logits);
      int32_t* bad = ws.alloc<int32_t>(na);
      ops().check_finite(logits, na, V, bad);
      bad_host.resize(size_t(na));
      be_->copy_to_host(bad_host.data(), bad, size_t(na) * 4);
      const float* host = logits;
      if (!be_->device().is_cpu()) {
        logits_host.resize(size_t(na * V));
        be_->copy_to_host(logits_host.data(), logits, size_t(na * V) * 4);
        host = logits_host.data();
      }
      for (int64_t a = 0; a < na; ++a) {
        const int64_t i = act[g0 + size_t(a)];
        if (seqs[size_t(i)].n_draft <= j) {
          live[size_t(i)] = 0;
          continue;
        }
        const int32_t t = sink ? sink(size_t(i), j, std::span<const float>(host + a * V, size_t(V)),
                                      bad_host[size_t(a)] == 0)
                               : -1;
        if (t < 0 || t >= V) live[size_t(i)] = 0;
        else tok[size_t(i)] = t;
      }
    }
  }
  if (n_save)
    ops().scatter_rows(mb.spec_ring.as<float>(), dl[i_spec], mb.ring.as<float>(), dl[i_ring], n_save,
                       L.kv_row.words());
}

}  // namespace dsv4
