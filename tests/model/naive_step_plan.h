// A straightforward reference of the step plan (model/step_plan.h): every array built element by element from the
// definitions in step_plan.h and spec §5.4-4 / §5.5, with fresh vectors, RoPE rows computed per position by
// RopeTable::cos_sin, and no reuse, caching or threads. StepPlan::build / rebuild must give exactly this plan.
#pragma once
#include <algorithm>
#include <set>
#include <vector>

#include "loader/config.h"
#include "model/rope.h"
#include "model/state_layout.h"
#include "model/step_plan.h"

namespace dsv4::test {

inline std::vector<float> naive_rope_rows(const RopeTable& t, const std::vector<int64_t>& pos) {
  std::vector<float> out(pos.size() * size_t(t.rd()));
  for (size_t i = 0; i < pos.size(); ++i) t.cos_sin(pos[i], out.data() + i * size_t(t.rd()));
  return out;
}

inline RatioPlan naive_ratio_plan(int m, int64_t n, const std::vector<PlanPiece>& pieces,
                                  const std::vector<int64_t>& t0s, const RopeTable& yarn, int64_t R) {
  RatioPlan r;
  r.m = m;
  r.coff = ModelConfig::compressor_coff(m);
  r.rpp = StateLayout::kPageTokens / m;
  r.nr = int64_t(r.coff) * m;
  const bool overlap = r.coff == 2;
  r.ape_row.assign(size_t(n), 0);
  r.n_visible.assign(size_t(n), 0);
  std::vector<int64_t> epos;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PlanPiece& pc = pieces[i];
    const int64_t p0 = pc.p0, ni = int64_t(pc.tokens.size()), t0 = t0s[i], p_end = p0 + ni;
    const int64_t w0 = p0 / m, w_end = p_end / m, fbase = n + pc.slot * r.nr;
    for (int64_t t = 0; t < ni; ++t) {
      r.ape_row[size_t(t0 + t)] = int32_t((p0 + t) % m);
      r.n_visible[size_t(t0 + t)] = int32_t((p0 + t + 1) / m);
    }
    r.max_visible = std::max(r.max_visible, p_end / m);
    r.max_run = std::max(r.max_run, ni);
    auto src = [&](int64_t q) -> int32_t {  // where position q's projections are at the step's start
      if (q < 0) return -1;
      if (q >= p0) return int32_t(t0 + q - p0);
      if (q / m == w0) return int32_t(fbase + (overlap ? m : 0) + q % m);
      if (overlap && q / m == w0 - 1) return int32_t(fbase + q % m);
      return -1;
    };
    auto pool_row = [&](int64_t w) { return int32_t(int64_t(pc.pages[size_t(w / r.rpp)]) * r.rpp + w % r.rpp); };
    for (int64_t w = w0; w < w_end; ++w) {
      if (overlap)
        for (int64_t j = 0; j < m; ++j) r.cand.push_back(src((w - 1) * m + j));
      for (int64_t j = 0; j < m; ++j) r.cand.push_back(src(w * m + j));
      epos.push_back(w * m);
      r.emit_dst.push_back(pool_row(w));
    }
    std::vector<int32_t> upd(size_t(r.nr));
    for (int64_t j = 0; j < m; ++j) {
      const int64_t cur = w_end * m + j;
      upd[size_t((overlap ? m : 0) + j)] =
          (cur >= p0 && cur < p_end) ? int32_t(t0 + cur - p0) : int32_t(fbase + (overlap ? m : 0) + j);
      if (overlap) upd[size_t(j)] = w_end == 0 ? int32_t(fbase + j) : src((w_end - 1) * m + j);
    }
    const StateLayout::Layer ly{m, r.coff, r.rpp, m == 4};
    const int64_t U = ly.changed_rows(R), sbase = pc.slot * (U + R);
    int64_t changed = 0;
    for (int64_t j = 0; j < r.nr; ++j)
      if (upd[size_t(j)] != int32_t(fbase + j)) {
        r.upd.push_back(upd[size_t(j)]);
        r.upd_dst.push_back(int32_t(pc.slot * r.nr + j));
        if (pc.spec) {
          r.bk_src.push_back(int32_t(pc.slot * r.nr + j));
          r.bk_dst.push_back(int32_t(sbase + changed));
        }
        ++changed;
      }
    if (pc.spec)
      for (int64_t t = 0; t < ni; ++t) {
        r.sp_src.push_back(int32_t(t0 + t));
        r.sp_dst.push_back(int32_t(sbase + U + t));
      }
    if (overlap)
      for (const auto& sn : pc.snapshots)
        for (int64_t j = 0; j < m; ++j) r.snap_src.push_back(src(sn.at - m + j));
  }
  r.n_emit = int64_t(epos.size());
  r.emit_cs = naive_rope_rows(yarn, epos);
  if (m != 4) {
    r.k_all = r.max_visible;
    r.all_idx.assign(size_t(n * r.k_all), -1);
    for (size_t i = 0; i < pieces.size(); ++i)
      for (int64_t t = 0; t < int64_t(pieces[i].tokens.size()); ++t) {
        const int64_t row = t0s[i] + t;
        for (int64_t j = 0; j < r.n_visible[size_t(row)]; ++j)
          r.all_idx[size_t(row * r.k_all + j)] =
              int32_t(int64_t(pieces[i].pages[size_t(j / r.rpp)]) * r.rpp + j % r.rpp);
      }
  } else {
    r.key_table.assign(size_t(n), 0);
    for (size_t i = 0; i < pieces.size(); ++i) {
      const int32_t start = int32_t(r.key_pages.size());
      const int64_t np = StateLayout::pages_for(pieces[i].p0 + int64_t(pieces[i].tokens.size()));
      for (int64_t k = 0; k < np; ++k) r.key_pages.push_back(pieces[i].pages[size_t(k)]);
      for (int64_t t = 0; t < int64_t(pieces[i].tokens.size()); ++t) r.key_table[size_t(t0s[i] + t)] = start;
    }
  }
  return r;
}

inline StepPlan naive_step_plan(const ModelConfig& cfg, const StateLayout& layout, const RopeTable& plain,
                                const RopeTable& yarn, int64_t n_slots, const std::vector<PlanPiece>& pieces) {
  StepPlan p;
  const int64_t W = cfg.sliding_window, R = layout.spec_rows;
  p.window = W;
  p.rd = cfg.qk_rope_head_dim;
  p.n_ring = n_slots * W;
  p.pieces = pieces;
  std::vector<int64_t> pos;
  for (const PlanPiece& pc : pieces) {
    p.piece_t0.push_back(p.n);
    p.n += int64_t(pc.tokens.size());
    for (size_t t = 0; t < pc.tokens.size(); ++t) {
      p.tokens.push_back(pc.tokens[t]);
      pos.push_back(pc.p0 + int64_t(t));
    }
  }
  const int64_t n = p.n;
  p.cs_plain = naive_rope_rows(plain, pos);
  p.cs_yarn = naive_rope_rows(yarn, pos);
  p.win_idx.assign(size_t(n * W), -1);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PlanPiece& pc = pieces[i];
    const int64_t p0 = pc.p0, ni = int64_t(pc.tokens.size()), t0 = p.piece_t0[i];
    auto row_of = [&](int64_t q) {  // this step's fresh row of position q, or its ring row in the slot
      return int32_t(q >= p0 ? p.n_ring + t0 + (q - p0) : pc.slot * W + q % W);
    };
    for (int64_t t = 0; t < ni; ++t) {
      int64_t c = 0;
      for (int64_t q = std::max<int64_t>(0, p0 + t - W + 1); q <= p0 + t; ++q)
        p.win_idx[size_t((t0 + t) * W + c++)] = row_of(q);
    }
    for (int64_t t = std::max<int64_t>(0, ni - W); t < ni; ++t) {
      p.ring_src.push_back(int32_t(t0 + t));
      p.ring_dst.push_back(int32_t(pc.slot * W + (p0 + t) % W));
    }
    for (const auto& sn : pc.snapshots) {
      p.snap_ids.push_back(sn.id);
      std::vector<int32_t> ring(size_t(W), 0);
      for (int64_t q = std::max<int64_t>(0, sn.at - W); q < sn.at; ++q) ring[size_t(q % W)] = row_of(q);
      p.snap_ring_src.insert(p.snap_ring_src.end(), ring.begin(), ring.end());
    }
  }
  if (layout.has_mtp()) {
    p.mtp = true;
    const int64_t HC = cfg.hc_mult;
    p.next.assign(size_t(n), 0);
    for (int64_t i = 0; i < n * HC; ++i) p.hc_rows.push_back(int32_t(i / HC));
    for (size_t i = 0; i < pieces.size(); ++i) {
      const PlanPiece& pc = pieces[i];
      const int64_t ni = int64_t(pc.tokens.size()), t0 = p.piece_t0[i];
      for (int64_t t = 0; t < ni && t < int64_t(pc.next.size()); ++t)
        if (pc.next[size_t(t)] >= 0) p.next[size_t(t0 + t)] = pc.next[size_t(t)];
      for (int64_t t = std::max<int64_t>(0, ni - R); t < ni; ++t) {
        p.hid_src.push_back(int32_t(t0 + t));
        p.hid_dst.push_back(int32_t(pc.slot * R + (pc.p0 + t) % R));
      }
    }
  }
  if (layout.has_dspark()) {
    p.dspark = true;
    const int64_t HC = cfg.hc_mult, T = int64_t(cfg.dspark.target_layer_ids.size());
    for (int64_t j = 0; j < HC; ++j)
      for (int64_t t = 0; t < n; ++t) p.stream_rows.push_back(int32_t(t * HC + j));
    for (int64_t i = 0; i < T; ++i)
      for (int64_t t = 0; t < n; ++t) p.cat_rows.push_back(int32_t(t * T + i));
  }
  if (layout.has_drafter())
    for (const PlanPiece& pc : pieces)
      if (pc.spec)
        for (int64_t t = 0; t < int64_t(pc.tokens.size()); ++t) {
          p.spec_ring_src.push_back(int32_t(pc.slot * W + (pc.p0 + t) % W));
          p.spec_ring_dst.push_back(int32_t(pc.slot * R + t));
        }
  const int64_t G = cfg.o_groups;
  p.group_fwd.assign(size_t(n * G), 0);
  p.group_back.assign(size_t(n * G), 0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < G; ++g) {
      p.group_fwd[size_t(g * n + t)] = int32_t(t * G + g);
      p.group_back[size_t(t * G + g)] = int32_t(g * n + t);
    }
  std::set<int> ms;
  for (const auto& l : layout.layers)
    if (l.ratio > 0) ms.insert(l.ratio);
  size_t n_iota = p.dspark ? size_t(std::max<int64_t>(n, 1)) : 1;
  for (int m : ms) {
    p.ratios.push_back(naive_ratio_plan(m, n, pieces, p.piece_t0, yarn, R));
    n_iota = std::max({n_iota, size_t(p.ratios.back().n_emit), p.ratios.back().upd.size()});
  }
  for (size_t i = 0; i < n_iota; ++i) p.iota.push_back(int32_t(i));
  for (size_t i = 0; i < pieces.size(); ++i)
    for (int64_t t = 0; t < int64_t(pieces[i].tokens.size()); ++t)
      if (t < int64_t(pieces[i].want.size()) && pieces[i].want[size_t(t)]) {
        p.logit_rows.push_back(int32_t(p.piece_t0[i] + t));
        p.logit_seq.push_back(pieces[i].seq);
        p.logit_pos.push_back(pieces[i].p0 + t);
      }
  return p;
}

}  // namespace dsv4::test
