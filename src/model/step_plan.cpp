// Step plan construction (see step_plan.h for the index spaces).
#include "model/step_plan.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace dsv4 {

const RatioPlan* StepPlan::ratio(int m) const {
  for (const auto& r : ratios)
    if (r.m == m) return &r;
  return nullptr;
}

namespace {

// The compressor plan of ratio m for tokens at positions [p0, p0 + n) (spec §5.5).
RatioPlan plan_ratio(int m, int64_t p0, int64_t n, const RopeTable& yarn) {
  RatioPlan r;
  r.m = m;
  r.coff = ModelConfig::compressor_coff(m);
  const int64_t p_end = p0 + n, w0 = p0 / m, w_end = p_end / m;
  const bool overlap = r.coff == 2;
  r.ape_row.resize(size_t(n));
  for (int64_t t = 0; t < n; ++t) r.ape_row[size_t(t)] = int32_t((p0 + t) % m);

  // Source of position q's projections: this step's row, or the frontier row that holds it at the step's start
  // (window w0 = the partial window: rows [m, 2m) when overlapping, else [0, m); window w0 - 1 = rows [0, m)).
  auto src = [&](int64_t q) -> int32_t {
    if (q < 0) return -1;
    if (q >= p0) return int32_t(q - p0);
    const int64_t w = q / m;
    if (w == w0) return int32_t(n + (overlap ? m : 0) + q % m);
    if (overlap && w == w0 - 1) return int32_t(n + q % m);
    return -1;  // not held (never asked for)
  };

  r.n_comp_before = w0;
  r.n_emit = w_end - w0;
  const int64_t nc = r.coff * m;
  r.cand.resize(size_t(r.n_emit * nc));
  std::vector<int64_t> epos;
  for (int64_t e = 0; e < r.n_emit; ++e) {
    const int64_t w = w0 + e;
    int32_t* c = &r.cand[size_t(e * nc)];
    if (overlap) {
      for (int64_t j = 0; j < m; ++j) c[j] = src((w - 1) * m + j);      // previous window, first half
      for (int64_t j = 0; j < m; ++j) c[m + j] = src(w * m + j);        // this window, second half
    } else {
      for (int64_t j = 0; j < m; ++j) c[j] = src(w * m + j);
    }
    epos.push_back(w * m);
  }
  r.emit_cs.resize(size_t(r.n_emit) * size_t(yarn.rd()));
  yarn.cos_sin(epos, r.emit_cs.data());

  // The frontier after the step: previous complete window (overlap) + the partial window w_end.
  r.upd.resize(size_t(nc));
  for (int64_t j = 0; j < m; ++j) {
    const int64_t cur = w_end * m + j;  // row j of the partial window
    const int32_t keep_cur = int32_t(n + (overlap ? m : 0) + j);
    r.upd[size_t((overlap ? m : 0) + j)] = (cur >= p0 && cur < p_end) ? int32_t(cur - p0) : keep_cur;
    if (overlap) {
      const int64_t prev = (w_end - 1) * m + j;
      r.upd[size_t(j)] = w_end == 0 ? int32_t(n + j) : src(prev);
    }
  }

  r.n_visible.resize(size_t(n));
  for (int64_t t = 0; t < n; ++t) r.n_visible[size_t(t)] = int32_t((p0 + t + 1) / m);
  r.max_visible = p_end / m;
  if (m != 4) {
    r.k_all = r.max_visible;
    r.all_idx.assign(size_t(n * r.k_all), -1);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < r.n_visible[size_t(t)]; ++j) r.all_idx[size_t(t * r.k_all + j)] = int32_t(j);
  }
  return r;
}

}  // namespace

StepPlan StepPlan::build(const ModelConfig& cfg, const RopeTable& plain, const RopeTable& yarn, int64_t p0,
                         std::span<const int32_t> tokens, const std::vector<char>& want_logits) {
  StepPlan p;
  const int64_t n = int64_t(tokens.size()), W = cfg.sliding_window;
  p.n = n;
  p.p0 = p0;
  p.window = W;
  p.rd = cfg.qk_rope_head_dim;
  p.tokens.assign(tokens.begin(), tokens.end());
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[size_t(t)] = p0 + t;
  p.cs_plain.resize(size_t(n * p.rd));
  p.cs_yarn.resize(size_t(n * p.rd));
  plain.cos_sin(pos, p.cs_plain.data());
  yarn.cos_sin(pos, p.cs_yarn.data());

  // window candidates: positions max(0, p-W+1) .. p, oldest -> newest (spec §5.4-4)
  p.win_idx.assign(size_t(n * W), -1);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t q_pos = p0 + t;
    int32_t* row = &p.win_idx[size_t(t * W)];
    int64_t c = 0;
    for (int64_t qp = std::max<int64_t>(0, q_pos - W + 1); qp <= q_pos; ++qp)
      row[c++] = int32_t(qp >= p0 ? W + (qp - p0) : qp % W);
  }
  for (int64_t t = std::max<int64_t>(0, n - W); t < n; ++t) {
    p.ring_src.push_back(int32_t(t));
    p.ring_dst.push_back(int32_t((p0 + t) % W));
  }

  const int64_t G = cfg.o_groups;
  p.group_fwd.resize(size_t(n * G));
  p.group_back.resize(size_t(n * G));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < G; ++g) {
      p.group_fwd[size_t(g * n + t)] = int32_t(t * G + g);
      p.group_back[size_t(t * G + g)] = int32_t(g * n + t);
    }

  std::set<int> ms;
  for (int l = 0; l < cfg.num_hidden_layers; ++l)
    if (cfg.compress_ratio(l) > 0) ms.insert(cfg.compress_ratio(l));
  for (int m : ms) p.ratios.push_back(plan_ratio(m, p0, n, yarn));

  for (int64_t t = 0; t < n; ++t)
    if (t < int64_t(want_logits.size()) && want_logits[size_t(t)]) {
      p.logit_rows.push_back(int32_t(t));
      p.logit_pos.push_back(p0 + t);
    }
  return p;
}

namespace {

// Packs arrays into one staging buffer (256-byte aligned offsets), then one copy to the device.
class Packer {
 public:
  template <class T>
  size_t add(const std::vector<T>& v) {
    if (v.empty()) return kNone;
    const size_t off = (bytes_.size() + 255) / 256 * 256;
    bytes_.resize(off + v.size() * sizeof(T));
    std::memcpy(bytes_.data() + off, v.data(), v.size() * sizeof(T));
    return off;
  }
  static constexpr size_t kNone = size_t(-1);
  std::vector<uint8_t> bytes_;
};

}  // namespace

DevicePlan DevicePlan::upload(const StepPlan& p, Backend& be, Workspace& ws) {
  Packer pk;
  const size_t o_tok = pk.add(p.tokens), o_win = pk.add(p.win_idx), o_rs = pk.add(p.ring_src),
               o_rd = pk.add(p.ring_dst), o_gf = pk.add(p.group_fwd), o_gb = pk.add(p.group_back),
               o_lr = pk.add(p.logit_rows), o_cp = pk.add(p.cs_plain), o_cy = pk.add(p.cs_yarn);
  struct R {
    size_t ape, cand, upd, nv, all, cs;
  };
  std::vector<R> ro;
  for (const auto& r : p.ratios)
    ro.push_back({pk.add(r.ape_row), pk.add(r.cand), pk.add(r.upd), pk.add(r.n_visible), pk.add(r.all_idx),
                  pk.add(r.emit_cs)});
  uint8_t* dev = static_cast<uint8_t*>(ws.alloc_bytes(std::max<size_t>(pk.bytes_.size(), 1)));
  be.copy_to_device(dev, pk.bytes_.data(), pk.bytes_.size());
  auto at = [&](size_t off) -> const void* { return off == Packer::kNone ? nullptr : dev + off; };
  DevicePlan d;
  d.tokens = static_cast<const int32_t*>(at(o_tok));
  d.win_idx = static_cast<const int32_t*>(at(o_win));
  d.ring_src = static_cast<const int32_t*>(at(o_rs));
  d.ring_dst = static_cast<const int32_t*>(at(o_rd));
  d.group_fwd = static_cast<const int32_t*>(at(o_gf));
  d.group_back = static_cast<const int32_t*>(at(o_gb));
  d.logit_rows = static_cast<const int32_t*>(at(o_lr));
  d.cs_plain = static_cast<const float*>(at(o_cp));
  d.cs_yarn = static_cast<const float*>(at(o_cy));
  for (const auto& r : ro)
    d.ratios.push_back({static_cast<const int32_t*>(at(r.ape)), static_cast<const int32_t*>(at(r.cand)),
                        static_cast<const int32_t*>(at(r.upd)), static_cast<const int32_t*>(at(r.nv)),
                        static_cast<const int32_t*>(at(r.all)), static_cast<const float*>(at(r.cs))});
  return d;
}

}  // namespace dsv4
