// CPU MoE ops (ops.h `moe`, `moe_resident`, `moe_combine`; spec §5.7) over one expert runner, cpu_expert_rows
// (cpu_ops.h), which the host half of a split MoE layer (model/split_moe.h) runs too.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/act_quant.h"
#include "backend/cpu_ops.h"
#include "backend/gemm.h"
#include "backend/parallel.h"
#include "format/numeric.h"

namespace dsv4 {

int64_t cpu_expert_rows(const MoeWeights& w, int64_t D, const uint8_t* use, const float* x, int64_t n_tok,
                        const int32_t* ids, const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q,
                        bool bf16, bool with_shared, int32_t* pair_of_row, float* out) {
  static const CpuOps ops;
  const int64_t E = w.n_experts;
  const bool shared = with_shared && w.shared != nullptr;
  auto used = [&](int32_t e) { return use == nullptr || use[e] != 0; };
  // bucket the selected (token, slot) pairs by expert, in pair order (a token's duplicates of one expert stay in
  // slot order)
  static thread_local std::vector<int64_t> start, fillp;
  start.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t i = 0; i < n_tok * k; ++i)
    if (used(ids[i])) ++start[size_t(ids[i]) + 1];
  for (int64_t e = 0; e < E; ++e) start[size_t(e + 1)] += start[size_t(e)];
  const int64_t m = start[size_t(E)];
  fillp.assign(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < n_tok * k; ++i)
    if (used(ids[i])) pair_of_row[fillp[size_t(ids[i])]++] = int32_t(i);
  // Every expert (and the shared one, item E) runs on its rows independently — in parallel over experts when there
  // are several — into its slice of `out` (bucket order; the shared expert's n_tok rows after the m pairs).
  auto run_expert = [&](const ExpertView& ew, int64_t ne, const float* xin, const float* row_w, float* o) {
    static thread_local std::vector<float> g, up;
    const int64_t inter = ew.w1.rows;
    g.resize(static_cast<size_t>(ne * inter));
    up.resize(static_cast<size_t>(ne * inter));
    dsv4::linear(ew.w1, xin, ne, g.data(), q);
    dsv4::linear(ew.w3, xin, ne, up.data(), q);
    ops.swiglu(g.data(), up.data(), ne, inter, swiglu_limit, row_w, bf16, g.data());
    dsv4::linear(ew.w2, g.data(), ne, o, q);
  };
  // (the thread_local vectors above are this thread's: other threads see them through these pointers only)
  const int64_t* st = start.data();
  auto item = [&](int64_t e) {
    if (e == E) {
      run_expert(*w.shared, n_tok, x, nullptr, out + m * D);
      return;
    }
    const int64_t s0 = st[e], ne = st[e + 1] - s0;
    if (ne == 0) return;
    static thread_local std::vector<float> xe, rw;
    xe.resize(static_cast<size_t>(ne * D));
    rw.resize(static_cast<size_t>(ne));
    for (int64_t i = 0; i < ne; ++i) {
      const int64_t pair = pair_of_row[s0 + i];
      std::memcpy(&xe[size_t(i * D)], x + (pair / k) * D, size_t(D) * 4);
      rw[size_t(i)] = wts[pair];
    }
    run_expert(w.experts[e], ne, xe.data(), rw.data(), out + s0 * D);
  };
  const int64_t n_items = E + (shared ? 1 : 0);
  int64_t busy = 0;  // items with rows
  for (int64_t e = 0; e < E; ++e) busy += st[e + 1] > st[e] ? 1 : 0;
  busy += shared ? 1 : 0;
  // Many items with rows (prefill, or decode of many sequences): items in parallel, each on one thread, from 2^19
  // multiply-adds on (the demo model's batch of 8 decodes: 24 rows of 46K, ~0.1 ms of work per layer against a wake
  // of ~0.01 ms; below it every expert ran on the loop thread while the other one idled).
  // Fewer items with rows than threads (decode: top-k experts + shared on a many-core CPU): the items' products in
  // two batches on the whole pool (below). Little work in all (a small model's decode step of a few tokens: a few
  // experts of a few 100 KB): the same batches on the calling thread (linear_batch's small-product rule) — waking the
  // pool would cost more than the products (with OMP_WAIT_POLICY=passive, a futex wake per region). Items never depend
  // on the thread running them.
  const int64_t threads = max_threads();
  int64_t macs = 0;  // multiply-adds of all items (w1, w3: inter x D; w2: D x inter; per row)
  for (int64_t e = 0; e < E; ++e) macs += (st[e + 1] - st[e]) * 3 * w.experts[e].w1.rows * D;
  if (shared) macs += n_tok * 3 * w.shared->w1.rows * D;
  const bool enough = macs >= (int64_t(1) << 21);  // the batched path's SwiGLU on the pool (as its products)
  if (macs >= (int64_t(1) << 19) && busy >= 2 && busy >= threads) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t e = 0; e < n_items; ++e) item(e);
    return m;
  }
  // Batched: (1) every item's w1 and w3 in one linear_batch (64-row groups of all of them split over the pool, each
  // input quantized once), (2) SwiGLU of every row, (3) every item's w2 in one linear_batch, straight into `out`.
  // Each product is linear()'s, so every row equals the item-by-item result bitwise.
  static thread_local std::vector<float> xs, gs, us, rws;
  static thread_local std::vector<LinearJob> jobs;
  static thread_local std::vector<int64_t> goff;  // item -> offset of its rows in gs / us
  goff.assign(static_cast<size_t>(n_items + 1), 0);
  for (int64_t e = 0; e < n_items; ++e) {
    const bool sh = e == E;
    const int64_t ne = sh ? n_tok : st[e + 1] - st[e];
    const int64_t inter = ne == 0 ? 0 : (sh ? w.shared->w1.rows : w.experts[e].w1.rows);
    goff[size_t(e + 1)] = goff[size_t(e)] + ne * inter;
  }
  xs.resize(static_cast<size_t>(m * D));
  rws.resize(static_cast<size_t>(m));
  gs.resize(static_cast<size_t>(goff[size_t(n_items)]));
  us.resize(gs.size());
  for (int64_t r = 0; r < m; ++r) {  // routed rows in bucket order: their token's x and routing weight
    const int64_t pair = pair_of_row[r];
    std::memcpy(&xs[size_t(r * D)], x + (pair / k) * D, size_t(D) * 4);
    rws[size_t(r)] = wts[pair];
  }
  auto item_rows = [&](int64_t e, const ExpertView*& ew, int64_t& ne, const float*& xin, float*& o) {
    const bool sh = e == E;
    ew = sh ? w.shared : &w.experts[e];
    ne = sh ? n_tok : st[e + 1] - st[e];
    xin = sh ? x : xs.data() + st[e] * D;
    o = out + (sh ? m : st[e]) * D;
  };
  jobs.clear();
  for (int64_t e = 0; e < n_items; ++e) {
    const ExpertView* ew;
    int64_t ne;
    const float* xin;
    float* o;
    item_rows(e, ew, ne, xin, o);
    if (ne == 0) continue;
    jobs.push_back(LinearJob{ew->w1, xin, ne, gs.data() + goff[size_t(e)], q});
    jobs.push_back(LinearJob{ew->w3, xin, ne, us.data() + goff[size_t(e)], q});
  }
  linear_batch(jobs);
  // SwiGLU of every item's rows (element-wise): in pieces of up to 512 elements of one row, over the pool when the
  // products were (a decode step's 7 x 2048 exp would otherwise run on one thread between the two batches)
  struct Piece {
    int64_t item, row, j0, len;
  };
  static thread_local std::vector<Piece> pieces;
  pieces.clear();
  for (int64_t e = 0; e < n_items; ++e) {
    const bool sh = e == E;
    const int64_t ne = sh ? n_tok : st[e + 1] - st[e];
    const int64_t inter = ne == 0 ? 0 : (sh ? w.shared->w1.rows : w.experts[e].w1.rows);
    for (int64_t r = 0; r < ne; ++r)
      for (int64_t j0 = 0; j0 < inter; j0 += 512) pieces.push_back(Piece{e, r, j0, std::min<int64_t>(512, inter - j0)});
  }
  // (thread_local scratch: the other threads see it through these pointers only)
  const Piece* pc = pieces.data();
  const int64_t* go = goff.data();
  float* gp = gs.data();
  const float* up = us.data();
  const float* rwp = rws.data();
  const int64_t n_pieces = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (enough && threads >= 2)
  for (int64_t i = 0; i < n_pieces; ++i) {
    const Piece& p = pc[i];
    const bool sh = p.item == E;
    const int64_t inter = sh ? w.shared->w1.rows : w.experts[p.item].w1.rows;
    float* g = gp + go[p.item] + p.row * inter + p.j0;
    const float* rw = sh ? nullptr : rwp + st[p.item] + p.row;
    ops.swiglu(g, up + go[p.item] + p.row * inter + p.j0, 1, p.len, swiglu_limit, rw, bf16, g);
  }
  jobs.clear();
  for (int64_t e = 0; e < n_items; ++e) {
    const ExpertView* ew;
    int64_t ne;
    const float* xin;
    float* o;
    item_rows(e, ew, ne, xin, o);
    if (ne == 0) continue;
    jobs.push_back(LinearJob{ew->w2, gs.data() + goff[size_t(e)], ne, o, q});
  }
  linear_batch(jobs);
  return m;
}

void CpuOps::moe(const MoeWeights& w, const float* x, int64_t n_tok, const int32_t* ids, const float* wts, int64_t k,
                 float swiglu_limit, const LinearOpts& q, bool bf16, float* y) const {
  const int64_t D = n_tok > 0 && w.n_experts > 0 ? w.experts[0].w1.cols : 0;
  static thread_local std::vector<int32_t> pairs;
  static thread_local std::vector<float> acc, out;
  pairs.resize(static_cast<size_t>(n_tok * k));
  out.resize(static_cast<size_t>((n_tok * k + (w.shared ? n_tok : 0)) * D));
  const int64_t m = cpu_expert_rows(w, D, nullptr, x, n_tok, ids, wts, k, swiglu_limit, q, bf16, true, pairs.data(),
                                    out.data());
  // each token sums its slots in ascending (expert id, slot) order (the bucket order), then adds the shared expert:
  // the order of the sequential version, so results do not depend on the thread count or on the split
  acc.assign(static_cast<size_t>(n_tok * D), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    float* yt = &acc[size_t((pairs[size_t(i)] / k) * D)];
    const float* o = &out[size_t(i * D)];
    for (int64_t d = 0; d < D; ++d) yt[d] += o[d];
  }
  if (w.shared) {
    const float* o = out.data() + m * D;
    for (int64_t i = 0; i < n_tok * D; ++i) acc[size_t(i)] += o[size_t(i)];
  }
  if (bf16) round_bf16_inplace(acc.data(), n_tok * D);
  std::memcpy(y, acc.data(), size_t(n_tok * D) * 4);
}

void CpuOps::moe_resident(const MoeWeights& w, const uint8_t* resident, const float* x, int64_t n_tok,
                          const int32_t* ids, const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q,
                          bool bf16, float* o_pairs, float* o_shared) const {
  if (n_tok <= 0) return;
  const int64_t D = w.experts[0].w1.cols;
  static thread_local std::vector<int32_t> pairs;
  static thread_local std::vector<float> out;
  pairs.resize(static_cast<size_t>(n_tok * k));
  out.resize(static_cast<size_t>((n_tok * k + n_tok) * D));
  const int64_t m = cpu_expert_rows(w, D, resident, x, n_tok, ids, wts, k, swiglu_limit, q, bf16,
                                    o_shared != nullptr, pairs.data(), out.data());
  for (int64_t i = 0; i < m; ++i)
    std::memcpy(o_pairs + int64_t(pairs[size_t(i)]) * D, out.data() + i * D, size_t(D) * 4);
  if (o_shared && w.shared) std::memcpy(o_shared, out.data() + m * D, size_t(n_tok * D) * 4);
}

void CpuOps::moe_combine(const float* o_pairs, const int32_t* ids, int64_t n_tok, int64_t k, int64_t D,
                         const float* o_shared, bool bf16, float* y) const {
#pragma omp parallel for schedule(static) if (n_tok * k * D >= (int64_t(1) << 16))
  for (int64_t t = 0; t < n_tok; ++t) {
    // the token's slots in ascending (expert id, slot) order (stable insertion sort: k is small)
    int32_t order[64];
    static thread_local std::vector<int32_t> big;
    int32_t* ord = order;
    if (k > 64) {
      big.resize(static_cast<size_t>(k));
      ord = big.data();
    }
    for (int64_t i = 0; i < k; ++i) {
      int64_t j = i;
      while (j > 0 && ids[t * k + ord[j - 1]] > ids[t * k + i]) {
        ord[j] = ord[j - 1];
        --j;
      }
      ord[j] = int32_t(i);
    }
    float* yt = y + t * D;
    std::fill(yt, yt + D, 0.0f);
    for (int64_t s = 0; s < k; ++s) {
      const float* o = o_pairs + (t * k + ord[s]) * D;
      for (int64_t d = 0; d < D; ++d) yt[d] += o[d];
    }
    if (o_shared)
      for (int64_t d = 0; d < D; ++d) yt[d] += o_shared[t * D + d];
    if (bf16) round_bf16_inplace(yt, D);
  }
}

}  // namespace dsv4
