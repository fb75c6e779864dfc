// Step plan construction (see step_plan.h for the index spaces).
#include "model/step_plan.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "core/error.h"

namespace dsv4 {

const RatioPlan* StepPlan::ratio(int m) const {
  for (const auto& r : ratios)
    if (r.m == m) return &r;
  return nullptr;
}

std::vector<int64_t> StepPlan::shape_key() const {
  std::vector<int64_t> k{n, window, rd, n_ring, int64_t(mtp), int64_t(dspark), int64_t(pieces.size()),
                         int64_t(ratios.size())};
  auto sz = [&](const auto&... v) { (k.push_back(int64_t(v.size())), ...); };
  sz(tokens, cs_plain, cs_yarn, win_idx, ring_src, ring_dst, group_fwd, group_back, iota, snap_ids, snap_ring_src,
     next, hc_rows, hid_src, hid_dst, stream_rows, cat_rows, spec_ring_src, spec_ring_dst, logit_rows);
  for (int64_t id : snap_ids) k.push_back(id);
  for (const RatioPlan& r : ratios) {
    k.insert(k.end(), {int64_t(r.m), int64_t(r.coff), r.rpp, r.nr, r.n_emit, r.k_all, r.max_run,
                       r.m == 4 ? visible_bucket(r.max_visible) : r.max_visible});
    sz(r.ape_row, r.cand, r.emit_cs, r.emit_dst, r.upd, r.upd_dst, r.n_visible, r.all_idx, r.key_pages, r.key_table,
       r.snap_src, r.bk_src, r.bk_dst, r.sp_src, r.sp_dst);
  }
  return k;
}

namespace {

// Arrays of the plan are rebuilt in place (StepPlan::rebuild): a list grown by push_back starts with clear(), an
// array whose every element is written starts with resize() (no fill when its size is that of the previous step).

// The compressor plan of ratio m for the pieces of a step (spec §5.5; index spaces in step_plan.h), into r.
// R: the layout's speculation rows (verify steps of <= R tokens).
void plan_ratio(RatioPlan& r, int m, int64_t n, const std::vector<PlanPiece>& pieces,
                const std::vector<int64_t>& piece_t0, const RopeCache& yarn, int64_t R) {
  r.m = m;
  r.coff = ModelConfig::compressor_coff(m);
  r.rpp = StateLayout::kPageTokens / m;
  r.nr = int64_t(r.coff) * m;
  r.max_visible = 0;
  r.max_run = 0;
  const bool overlap = r.coff == 2;
  const int64_t nr = r.nr, rpp = r.rpp;
  r.ape_row.resize(size_t(n));
  r.n_visible.resize(size_t(n));
  for (auto* v : {&r.cand, &r.emit_dst, &r.upd, &r.upd_dst, &r.key_pages, &r.snap_src, &r.bk_src, &r.bk_dst,
                  &r.sp_src, &r.sp_dst})
    v->clear();
  std::vector<int64_t> epos;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PlanPiece& pc = pieces[i];
    const int64_t p0 = pc.p0, ni = int64_t(pc.tokens.size()), t0 = piece_t0[i], p_end = p0 + ni;
    const int64_t w0 = p0 / m, w_end = p_end / m, fbase = n + pc.slot * nr;
    for (int64_t t = 0; t < ni; ++t) {
      r.ape_row[size_t(t0 + t)] = int32_t((p0 + t) % m);
      r.n_visible[size_t(t0 + t)] = int32_t((p0 + t + 1) / m);
    }
    r.max_visible = std::max(r.max_visible, p_end / m);
    r.max_run = std::max(r.max_run, ni);

    // Source of position q's projections: this step's row, or the frontier row that holds it at the step's start
    // (window w0 = the partial window: rows [m, 2m) when overlapping, else [0, m); window w0 - 1 = rows [0, m)).
    auto src = [&](int64_t q) -> int32_t {
      if (q < 0) return -1;
      if (q >= p0) return int32_t(t0 + q - p0);
      const int64_t w = q / m;
      if (w == w0) return int32_t(fbase + (overlap ? m : 0) + q % m);
      if (overlap && w == w0 - 1) return int32_t(fbase + q % m);
      return -1;  // not held (never asked for)
    };
    auto pool_row = [&](int64_t w) { return int32_t(int64_t(pc.pages[size_t(w / rpp)]) * rpp + w % rpp); };

    for (int64_t w = w0; w < w_end; ++w) {
      if (overlap) {
        for (int64_t j = 0; j < m; ++j) r.cand.push_back(src((w - 1) * m + j));  // previous window, first half
        for (int64_t j = 0; j < m; ++j) r.cand.push_back(src(w * m + j));        // this window, second half
      } else {
        for (int64_t j = 0; j < m; ++j) r.cand.push_back(src(w * m + j));
      }
      epos.push_back(w * m);
      r.emit_dst.push_back(pool_row(w));
    }

    // The frontier after the step: previous complete window (overlap) + the partial window w_end.
    std::vector<int32_t> upd(static_cast<size_t>(nr));
    for (int64_t j = 0; j < m; ++j) {
      const int64_t cur = w_end * m + j;  // row j of the partial window
      const int32_t keep_cur = int32_t(fbase + (overlap ? m : 0) + j);
      upd[size_t((overlap ? m : 0) + j)] = (cur >= p0 && cur < p_end) ? int32_t(t0 + cur - p0) : keep_cur;
      if (overlap) {
        const int64_t prev = (w_end - 1) * m + j;
        upd[size_t(j)] = w_end == 0 ? int32_t(fbase + j) : src(prev);
      }
    }
    int64_t n_changed = 0;
    const StateLayout::Layer ly{m, r.coff, rpp, m == 4};
    const int64_t U = ly.changed_rows(R), sbase = pc.slot * (U + R);
    for (int64_t j = 0; j < nr; ++j)
      if (upd[size_t(j)] != int32_t(fbase + j)) {  // rows that keep their value need no copy (decode: 1-8 rows)
        r.upd.push_back(upd[size_t(j)]);
        r.upd_dst.push_back(int32_t(pc.slot * nr + j));
        if (pc.spec) {  // verify step: keep the row's old value for a rollback
          r.bk_src.push_back(int32_t(pc.slot * nr + j));
          r.bk_dst.push_back(int32_t(sbase + n_changed));
        }
        ++n_changed;
      }
    if (pc.spec) {
      if (n_changed > U || ni > R)
        fail("internal: a verify step of {} tokens changes {} frontier rows (at most {})", ni, n_changed, U);
      for (int64_t t = 0; t < ni; ++t) {
        r.sp_src.push_back(int32_t(t0 + t));
        r.sp_dst.push_back(int32_t(sbase + U + t));
      }
    }

    // Snapshots: the frontier rows [0, m) at position B are the last complete window [B - m, B).
    if (overlap)
      for (const auto& sn : pc.snapshots)
        for (int64_t j = 0; j < m; ++j) r.snap_src.push_back(src(sn.at - m + j));
  }
  r.n_emit = int64_t(epos.size());
  r.emit_cs.resize(size_t(r.n_emit) * size_t(yarn.rd()));
  yarn.cos_sin(epos, r.emit_cs.data());

  if (m != 4) {
    // A token's HCA candidates are the first n_visible rows of its sequence: one list per piece, each token's row
    // a prefix of it, -1 padded.
    r.k_all = r.max_visible;
    r.all_idx.resize(size_t(n * r.k_all));
    r.key_table.clear();
    std::vector<int32_t> rows;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const PlanPiece& pc = pieces[i];
      const int64_t ni = int64_t(pc.tokens.size()), seen = (pc.p0 + ni) / m;
      rows.resize(size_t(seen));
      for (int64_t j = 0; j < seen; ++j) rows[size_t(j)] = int32_t(int64_t(pc.pages[size_t(j / rpp)]) * rpp + j % rpp);
      for (int64_t t = 0; t < ni; ++t) {
        const int64_t row = piece_t0[i] + t, nv = r.n_visible[size_t(row)];
        int32_t* out = r.all_idx.data() + row * r.k_all;
        std::copy_n(rows.data(), nv, out);
        std::fill(out + nv, out + r.k_all, -1);
      }
    }
  } else {
    r.k_all = 0;
    r.all_idx.clear();
    r.key_table.resize(size_t(n));
    for (size_t i = 0; i < pieces.size(); ++i) {
      const PlanPiece& pc = pieces[i];
      const int32_t start = int32_t(r.key_pages.size());
      const int64_t np = StateLayout::pages_for(pc.p0 + int64_t(pc.tokens.size()));
      r.key_pages.insert(r.key_pages.end(), pc.pages.begin(), pc.pages.begin() + np);
      std::fill_n(r.key_table.begin() + piece_t0[i], pc.tokens.size(), start);
    }
  }
}

// The window candidates of the token at position q of a piece starting at p0 (spec §5.4-4): positions
// max(0, q - W + 1) .. q, oldest -> newest, then -1 padding. Earlier positions are the slot's ring rows
// (ring0 + position % W), this step's are its fresh rows (fresh0 + position - p0).
void window_row(int32_t* row, int64_t q, int64_t p0, int64_t W, int64_t ring0, int64_t fresh0) {
  const int64_t lo = std::max<int64_t>(0, q - W + 1), mid = std::max(lo, p0);
  int32_t* out = row;
  for (int64_t qp = lo; qp < mid; ++qp) *out++ = int32_t(ring0 + qp % W);
  const int32_t f = int32_t(fresh0 + mid - p0);
  for (int64_t k = 0; k <= q - mid; ++k) *out++ = f + int32_t(k);
  std::fill(out, row + W, -1);
}

}  // namespace

StepPlan StepPlan::build(const ModelConfig& cfg, const StateLayout& layout, const RopeCache& plain,
                         const RopeCache& yarn, int64_t n_slots, std::vector<PlanPiece> pieces) {
  StepPlan p;
  p.rebuild(cfg, layout, plain, yarn, n_slots, std::move(pieces));
  return p;
}

void StepPlan::rebuild(const ModelConfig& cfg, const StateLayout& layout, const RopeCache& plain,
                       const RopeCache& yarn, int64_t n_slots, std::vector<PlanPiece> new_pieces) {
  const int64_t W = cfg.sliding_window;
  window = W;
  rd = cfg.qk_rope_head_dim;
  n_ring = n_slots * W;
  pieces = std::move(new_pieces);
  piece_t0.clear();
  n = 0;
  for (const PlanPiece& pc : pieces) {
    piece_t0.push_back(n);
    n += int64_t(pc.tokens.size());
  }
  std::vector<int64_t> pos(static_cast<size_t>(n));
  tokens.clear();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PlanPiece& pc = pieces[i];
    tokens.insert(tokens.end(), pc.tokens.begin(), pc.tokens.end());
    std::iota(pos.begin() + piece_t0[i], pos.begin() + piece_t0[i] + int64_t(pc.tokens.size()), pc.p0);
  }
  cs_plain.resize(size_t(n * rd));
  cs_yarn.resize(size_t(n * rd));
  plain.cos_sin(pos, cs_plain.data());
  yarn.cos_sin(pos, cs_yarn.data());

  // window candidates; ring writes; snapshots
  win_idx.resize(size_t(n * W));
  for (auto* v : {&ring_src, &ring_dst, &snap_ring_src}) v->clear();
  snap_ids.clear();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PlanPiece& pc = pieces[i];
    const int64_t p0 = pc.p0, ni = int64_t(pc.tokens.size()), t0 = piece_t0[i];
    for (int64_t t = 0; t < ni; ++t)
      window_row(&win_idx[size_t((t0 + t) * W)], p0 + t, p0, W, pc.slot * W, n_ring + t0);
    for (int64_t t = std::max<int64_t>(0, ni - W); t < ni; ++t) {
      ring_src.push_back(int32_t(t0 + t));
      ring_dst.push_back(int32_t(pc.slot * W + (p0 + t) % W));
    }
    for (const auto& sn : pc.snapshots) {
      snap_ids.push_back(sn.id);
      // ring slot r at position B holds the position q in [B - W, B) with q % W == r (none when q < 0: row 0,
      // never read)
      const size_t at = snap_ring_src.size();
      snap_ring_src.resize(at + size_t(W), 0);
      for (int64_t q = std::max<int64_t>(0, sn.at - W); q < sn.at; ++q)
        snap_ring_src[at + size_t(q % W)] = int32_t(q >= p0 ? n_ring + t0 + (q - p0) : pc.slot * W + q % W);
    }
  }

  // MTP inputs and hidden rows; DSpark capture rows; verify steps' ring backups (state_pool.h, speculation rows)
  const int64_t R = layout.spec_rows;
  mtp = layout.has_mtp();
  for (auto* v : {&next, &hc_rows, &hid_src, &hid_dst}) v->clear();
  if (mtp) {
    const int64_t HC = cfg.hc_mult;
    next.resize(size_t(n));
    hc_rows.resize(size_t(n * HC));
    for (int64_t i = 0; i < n * HC; ++i) hc_rows[size_t(i)] = int32_t(i / HC);
    for (size_t i = 0; i < pieces.size(); ++i) {
      const PlanPiece& pc = pieces[i];
      const int64_t p0 = pc.p0, ni = int64_t(pc.tokens.size()), t0 = piece_t0[i];
      for (int64_t t = 0; t < ni; ++t) {  // 0 where unknown
        const bool known = t < int64_t(pc.next.size()) && pc.next[size_t(t)] >= 0;
        next[size_t(t0 + t)] = known ? pc.next[size_t(t)] : 0;
      }
      for (int64_t t = std::max<int64_t>(0, ni - R); t < ni; ++t) {
        hid_src.push_back(int32_t(t0 + t));
        hid_dst.push_back(int32_t(pc.slot * R + (p0 + t) % R));
      }
    }
  }
  dspark = layout.has_dspark();
  stream_rows.clear();
  cat_rows.clear();
  if (dspark) {
    const int64_t HC = cfg.hc_mult, T = int64_t(cfg.dspark.target_layer_ids.size());
    stream_rows.resize(size_t(HC * n));
    for (int64_t j = 0; j < HC; ++j)
      for (int64_t t = 0; t < n; ++t) stream_rows[size_t(j * n + t)] = int32_t(t * HC + j);
    cat_rows.resize(size_t(T * n));
    for (int64_t i = 0; i < T; ++i)
      for (int64_t t = 0; t < n; ++t) cat_rows[size_t(i * n + t)] = int32_t(t * T + i);
  }
  spec_ring_src.clear();
  spec_ring_dst.clear();
  if (layout.has_drafter())
    for (const PlanPiece& pc : pieces) {
      if (!pc.spec) continue;
      for (int64_t t = 0; t < int64_t(pc.tokens.size()); ++t) {
        spec_ring_src.push_back(int32_t(pc.slot * W + (pc.p0 + t) % W));
        spec_ring_dst.push_back(int32_t(pc.slot * R + t));
      }
    }

  const int64_t G = cfg.o_groups;
  group_fwd.resize(size_t(n * G));
  group_back.resize(size_t(n * G));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t = 0; t < n; ++t) group_fwd[size_t(g * n + t)] = int32_t(t * G + g);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < G; ++g) group_back[size_t(t * G + g)] = int32_t(g * n + t);

  std::set<int> ms;
  for (const auto& l : layout.layers)
    if (l.ratio > 0) ms.insert(l.ratio);
  ratios.resize(ms.size());
  size_t n_iota = dspark ? size_t(std::max<int64_t>(n, 1)) : 1, k = 0;
  for (int m : ms) {
    RatioPlan& r = ratios[k++];
    plan_ratio(r, m, n, pieces, piece_t0, yarn, R);
    n_iota = std::max({n_iota, size_t(r.n_emit), r.upd.size()});
  }
  iota.resize(n_iota);
  std::iota(iota.begin(), iota.end(), 0);

  logit_rows.clear();
  logit_seq.clear();
  logit_pos.clear();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PlanPiece& pc = pieces[i];
    for (int64_t t = 0; t < int64_t(pc.tokens.size()); ++t)
      if (t < int64_t(pc.want.size()) && pc.want[size_t(t)]) {
        logit_rows.push_back(int32_t(piece_t0[i] + t));
        logit_seq.push_back(pc.seq);
        logit_pos.push_back(pc.p0 + t);
      }
  }
}

namespace {

// Lays arrays out at 256-byte aligned offsets of one staging buffer (add: the offset), then copies them there
// (pack) for one copy to the device. The whole size is known before any byte moves, so a buffer kept across steps
// is filled in place (no regrowth, no fresh pages: an 8,192-token V4-Flash plan is ~12 MB).
class Packer {
 public:
  template <class T>
  size_t add(const std::vector<T>& v) {
    if (v.empty()) return kNone;
    const size_t off = (size_ + 255) / 256 * 256;
    items_.push_back({v.data(), off, v.size() * sizeof(T)});
    size_ = off + v.size() * sizeof(T);
    return off;
  }
  // Copies the arrays into buf (grown when smaller; bytes between the arrays are left as they are: never read).
  void pack(std::vector<uint8_t>& buf) const {
    if (buf.size() < size_) buf.resize(size_);
    for (const Item& it : items_) std::memcpy(buf.data() + it.off, it.src, it.bytes);
  }
  size_t size() const { return size_; }
  static constexpr size_t kNone = size_t(-1);

 private:
  struct Item {
    const void* src;
    size_t off, bytes;
  };
  std::vector<Item> items_;
  size_t size_ = 0;
};

}  // namespace

DevicePlan DevicePlan::upload(const StepPlan& p, Backend& be, Workspace& ws, std::vector<uint8_t>* staging) {
  Packer pk;
  const size_t o_tok = pk.add(p.tokens), o_win = pk.add(p.win_idx), o_rs = pk.add(p.ring_src),
               o_rd = pk.add(p.ring_dst), o_gf = pk.add(p.group_fwd), o_gb = pk.add(p.group_back),
               o_lr = pk.add(p.logit_rows), o_io = pk.add(p.iota), o_sr = pk.add(p.snap_ring_src),
               o_cp = pk.add(p.cs_plain), o_cy = pk.add(p.cs_yarn), o_nx = pk.add(p.next),
               o_hr = pk.add(p.hc_rows), o_hs = pk.add(p.hid_src), o_hd = pk.add(p.hid_dst),
               o_srs = pk.add(p.spec_ring_src), o_srd = pk.add(p.spec_ring_dst), o_str = pk.add(p.stream_rows),
               o_cat = pk.add(p.cat_rows);
  struct R {
    size_t ape, cand, edst, upd, udst, nv, all, kp, kt, ss, cs, bs, bd, ss2, sd;
  };
  std::vector<R> ro;
  for (const auto& r : p.ratios)
    ro.push_back({pk.add(r.ape_row), pk.add(r.cand), pk.add(r.emit_dst), pk.add(r.upd), pk.add(r.upd_dst),
                  pk.add(r.n_visible), pk.add(r.all_idx), pk.add(r.key_pages), pk.add(r.key_table),
                  pk.add(r.snap_src), pk.add(r.emit_cs), pk.add(r.bk_src), pk.add(r.bk_dst), pk.add(r.sp_src),
                  pk.add(r.sp_dst)});
  std::vector<uint8_t> local;
  std::vector<uint8_t>& buf = staging ? *staging : local;
  pk.pack(buf);
  uint8_t* dev = static_cast<uint8_t*>(ws.alloc_bytes(std::max<size_t>(pk.size(), 1)));
  be.copy_to_device(dev, buf.data(), pk.size());  // (the source may be reused once this returns)
  auto at = [&](size_t off) -> const void* { return off == Packer::kNone ? nullptr : dev + off; };
  auto i32 = [&](size_t off) { return static_cast<const int32_t*>(at(off)); };
  DevicePlan d;
  d.tokens = i32(o_tok);
  d.win_idx = i32(o_win);
  d.ring_src = i32(o_rs);
  d.ring_dst = i32(o_rd);
  d.group_fwd = i32(o_gf);
  d.group_back = i32(o_gb);
  d.logit_rows = i32(o_lr);
  d.iota = i32(o_io);
  d.snap_ring_src = i32(o_sr);
  d.cs_plain = static_cast<const float*>(at(o_cp));
  d.cs_yarn = static_cast<const float*>(at(o_cy));
  d.next = i32(o_nx);
  d.hc_rows = i32(o_hr);
  d.hid_src = i32(o_hs);
  d.hid_dst = i32(o_hd);
  d.spec_ring_src = i32(o_srs);
  d.spec_ring_dst = i32(o_srd);
  d.stream_rows = i32(o_str);
  d.cat_rows = i32(o_cat);
  for (const auto& r : ro) {
    DeviceRatioPlan x;
    x.ape_row = i32(r.ape);
    x.cand = i32(r.cand);
    x.emit_dst = i32(r.edst);
    x.upd = i32(r.upd);
    x.upd_dst = i32(r.udst);
    x.n_visible = i32(r.nv);
    x.all_idx = i32(r.all);
    x.key_pages = i32(r.kp);
    x.key_table = i32(r.kt);
    x.snap_src = i32(r.ss);
    x.emit_cs = static_cast<const float*>(at(r.cs));
    x.bk_src = i32(r.bs);
    x.bk_dst = i32(r.bd);
    x.sp_src = i32(r.ss2);
    x.sp_dst = i32(r.sd);
    d.ratios.push_back(x);
  }
  return d;
}

}  // namespace dsv4
