// GEMM driver: validation, activation quantization, work partition, kernel dispatch (see gemm.h / gemm_kernels.h).
#include "backend/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include <omp.h>

#include "backend/act_quant.h"
#include "backend/cpu_features.h"
#include "backend/gemm_kernels.h"
#include "backend/parallel.h"
#include "core/error.h"
#include "format/numeric.h"

namespace dsv4 {

using namespace gemm_detail;

GemmWeight gemm_weight(const WeightRef& W) {
  if (!W.bound() || W.w->data == nullptr) fail("linear: weight is not bound");
  GemmWeight g;
  g.w = W.w->data;
  g.rows = W.rows;
  g.cols = W.cols;
  switch (W.fmt) {
    case WeightFormat::BF16: g.fmt = GemmFormat::bf16; break;
    case WeightFormat::F32: g.fmt = GemmFormat::f32; break;
    case WeightFormat::FP8_BLOCK128:
      g.fmt = GemmFormat::fp8;
      if (W.scale == nullptr) fail("linear: FP8 weight {} has no scale", W.w->name);
      g.scale = W.scale->data;
      g.scale_f32 = W.scale_dtype == DType::F32;
      g.block_rows = W.block_rows;
      g.block_cols = W.block_cols;
      break;
    case WeightFormat::FP4_BLOCK32:
      g.fmt = GemmFormat::fp4;
      if (W.scale == nullptr) fail("linear: FP4 weight {} has no scale", W.w->name);
      g.scale = W.scale->data;
      g.block_rows = 1;
      g.block_cols = 32;
      break;
    default: fail("linear: weight {} has format {}, not a matrix format", W.w->name, weight_format_name(W.fmt));
  }
  return g;
}

const char* simd_level_name(SimdLevel l) {
  switch (l) {
    case SimdLevel::scalar: return "scalar";
    case SimdLevel::avx2: return "avx2";
    case SimdLevel::avx512: return "avx512";
    case SimdLevel::avx512vbmi: return "avx512vbmi";
  }
  return "?";
}

SimdLevel best_simd_level() {
  static const SimdLevel best = [] {
    const CpuFeatures& c = cpu_features();
    const bool has2 = c.avx2 && c.fma && c.f16c;
    const bool has512 = has2 && c.avx512f && c.avx512bw && c.avx512vl;
    if (has512 && c.avx512vbmi && avx512vbmi_kernels() != nullptr) return SimdLevel::avx512vbmi;
    if (has512 && avx512_kernels() != nullptr) return SimdLevel::avx512;
    if (has2 && avx2_kernels() != nullptr) return SimdLevel::avx2;
    return SimdLevel::scalar;
  }();
  return best;
}

namespace {

std::atomic<int> g_level{-1};

const Kernels& kernels_for(SimdLevel l) {
  switch (l) {
    case SimdLevel::avx512vbmi: return *avx512vbmi_kernels();
    case SimdLevel::avx512: return *avx512_kernels();
    case SimdLevel::avx2: return *avx2_kernels();
    default: return scalar_kernels();
  }
}

}  // namespace

SimdLevel set_simd_level(SimdLevel l) {
  const SimdLevel best = best_simd_level();
  if (static_cast<int>(l) > static_cast<int>(best)) l = best;
  if (l == SimdLevel::avx512vbmi && avx512vbmi_kernels() == nullptr) l = SimdLevel::avx512;
  if (l == SimdLevel::avx512 && avx512_kernels() == nullptr) l = SimdLevel::avx2;
  if (l == SimdLevel::avx2 && avx2_kernels() == nullptr) l = SimdLevel::scalar;
  g_level.store(static_cast<int>(l));
  return l;
}

SimdLevel simd_level() {
  const int v = g_level.load();
  return v < 0 ? best_simd_level() : static_cast<SimdLevel>(v);
}

int64_t bf16_panel_words(const GemmWeight& W) {
  if (W.fmt != GemmFormat::bf16 || W.w == nullptr || W.rows <= 0 || W.cols <= 0 || W.cols % 32 != 0) return 0;
  return (W.rows + kPanel - 1) / kPanel * (W.cols / 2) * kPanel;
}

void pack_bf16_panels(const GemmWeight& W, uint32_t* out) {
  if (bf16_panel_words(W) == 0) fail("pack_bf16_panels: needs a BF16 weight with cols % 32 == 0");
  const int64_t n_panels = (W.rows + kPanel - 1) / kPanel, pairs = W.cols / 2;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < n_panels; ++p)
    for (int j = 0; j < kPanel; ++j) {
      const int64_t r = p * kPanel + j;
      uint32_t* o = out + p * pairs * kPanel + j;
      for (int64_t c = 0; c < pairs; ++c) {
        uint32_t v = 0;  // row r, columns 2c and 2c + 1 (little endian: 2c in the low half)
        if (r < W.rows) std::memcpy(&v, W.w + (r * pairs + c) * 4, 4);
        o[c * kPanel] = v;
      }
    }
}

void linear(const WeightRef& W, const float* x, int64_t n_tok, float* y, const LinearOpts& opts) {
  linear(gemm_weight(W), x, n_tok, y, opts);
}

namespace {

// One product of linear() / linear_batch(), validated, with its activations quantized (Q) and its work split into
// units: (64-row group, token tile) pairs.
struct Product {
  PanelSrc src{};
  const float* a_in = nullptr;  // x [n_tok][K]
  const float* a = nullptr;   // activations (Q: quantized) [n_tok][K]
  const float* sa = nullptr;  // (Q) act scales [n_tok][nsb]
  float* y = nullptr;
  LinearOpts opts;
  int32_t* nonfinite = nullptr;  // LinearJob::nonfinite
  int64_t n_tok = 0, K = 0, nsb = 0, r0 = 0, r1 = 0, nout = 0;
  bool Q = false, quantized_fmt = false, scales_per_chunk = false;
  int bk = 0, sblk = 0;
  int64_t n_groups = 0, n_tiles = 0, tile = 0, chunk = 0;
  int64_t units() const { return n_groups * n_tiles; }
  int64_t unit_rows(int64_t u) const { return std::min<int64_t>(kGroupRows, r1 - (r0 + (u / n_tiles) * kGroupRows)); }
  int64_t unit_tokens(int64_t u) const { return std::min<int64_t>(tile, n_tok - (u % n_tiles) * tile); }
};

// Validation and the PanelSrc of one product (everything but the activations and the work split).
Product describe(const GemmWeight& W, const float* x, int64_t n_tok, float* y, const LinearOpts& opts) {
  // ---- validation ----
  if (W.w == nullptr) fail("linear: weight has no data");
  if (W.rows <= 0 || W.cols <= 0) fail("linear: bad weight shape [{}, {}]", W.rows, W.cols);
  if (n_tok < 0) fail("linear: negative token count {}", n_tok);
  const bool quantized_fmt = W.fmt == GemmFormat::fp8 || W.fmt == GemmFormat::fp4;
  if (quantized_fmt && W.scale == nullptr) fail("linear: quantized weight without scale");
  if (W.fmt == GemmFormat::fp4 && W.cols % 2 != 0) fail("linear: FP4 weight with odd cols {}", W.cols);
  if (W.fmt == GemmFormat::fp8 && (W.block_rows <= 0 || W.block_cols <= 0))
    fail("linear: bad FP8 block {}x{}", W.block_rows, W.block_cols);
  if (opts.act_quant_fp8 && !quantized_fmt) fail("linear: act_quant_fp8 needs an FP8 or FP4 weight");
  if (opts.act_quant_fp8 && W.fmt == GemmFormat::fp8 && W.block_cols != 128)
    fail("linear: act_quant_fp8 needs 128-column FP8 weight blocks (got {})", W.block_cols);
  Product P;
  P.r0 = opts.row_begin;
  P.r1 = opts.row_end < 0 ? W.rows : opts.row_end;
  if (P.r0 < 0 || P.r1 > W.rows || P.r0 >= P.r1) fail("linear: bad row range [{}, {}) of {} rows", P.r0, P.r1, W.rows);
  P.nout = P.r1 - P.r0;
  P.K = W.cols;
  P.n_tok = n_tok;
  P.y = y;
  P.a_in = x;
  P.a = x;
  P.opts = opts;
  P.quantized_fmt = quantized_fmt;
  PanelSrc& src = P.src;
  src.fmt = W.fmt;
  src.w = W.w;
  src.rows = W.rows;
  src.cols = P.K;
  switch (W.fmt) {
    case GemmFormat::fp8: src.row_bytes = P.K; break;
    case GemmFormat::fp4: src.row_bytes = P.K / 2; break;
    case GemmFormat::bf16: src.row_bytes = 2 * P.K; break;
    case GemmFormat::f32: src.row_bytes = 4 * P.K; break;
  }
  src.dequant = !opts.act_quant_fp8;
  src.round_bf16 = opts.weight_as_bf16;
  src.scale = W.scale;
  src.scale_f32 = W.scale_f32 && W.fmt == GemmFormat::fp8;
  src.br = W.fmt == GemmFormat::fp4 ? 1 : W.block_rows;
  src.bc = W.fmt == GemmFormat::fp4 ? 32 : W.block_cols;
  src.scale_cols = (P.K + src.bc - 1) / src.bc;
  // the panel copy serves groups that start on a panel: a row range from a multiple of 16
  src.panels = W.fmt == GemmFormat::bf16 && P.K % 32 == 0 && P.r0 % kPanel == 0 ? W.panels : nullptr;
  P.Q = opts.act_quant_fp8;
  P.bk = W.fmt == GemmFormat::fp4 ? 32 : 128;
  // Panel scales are gathered per chunk when the scale grid tiles the chunk (always for the checkpoint formats;
  // in (Q) mode sblk == bk). Otherwise the dense decode looks every scale up itself.
  P.sblk = static_cast<int>(src.bc);
  P.scales_per_chunk = quantized_fmt && src.bc >= 32 && kChunk % src.bc == 0;
  if (P.Q && !P.scales_per_chunk) fail("linear: unsupported scale block {}", src.bc);
  P.nsb = (P.K + 127) / 128;
  return P;
}

// Work split of one product over `threads` threads (its units never depend on it for their results).
void split(Product& P, int threads) {
  P.n_groups = (P.nout + kGroupRows - 1) / kGroupRows;
  // Token tiles: at most kMaxTile tokens (the unit's accumulators and activation slice stay in L2), and enough units
  // for every thread when the weight has few row groups.
  constexpr int64_t kMaxTile = 256;
  int64_t n_tiles = (P.n_tok + kMaxTile - 1) / kMaxTile;
  if (P.n_groups * n_tiles < 2 * threads && P.n_tok > 1)
    n_tiles = std::min<int64_t>(P.n_tok, std::max<int64_t>(n_tiles, (2 * threads + P.n_groups - 1) / P.n_groups));
  P.tile = (P.n_tok + n_tiles - 1) / n_tiles;
  P.n_tiles = (P.n_tok + P.tile - 1) / P.tile;
  // K chunk: small for decode-sized calls (the panel tile stays in L1), large when the tile is reused by many tokens.
  // Results do not depend on it (blocks never straddle a chunk; the dense chain continues across chunks).
  P.chunk = P.tile <= 4 ? 128 : kChunk;
}

// y[j] = round_to_bf16(c[j]) (numeric.h: round to nearest even, NaN -> the quiet NaN of its sign), written without
// branches so that the compiler vectorizes it. y may be c (rounding in place).
void round_bf16_row(const float* c, int64_t n, float* y) {
  for (int64_t j = 0; j < n; ++j) {
    uint32_t b;
    std::memcpy(&b, &c[j], 4);
    const uint32_t rne = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
    const uint32_t qnan = (b | 0x00400000u) & 0xFFFF0000u;
    const uint32_t r = (b & 0x7FFFFFFFu) > 0x7F800000u ? qnan : rne;
    std::memcpy(&y[j], &r, 4);
  }
}

void quantize_row(const Kernels& kq, const float* x, int64_t K, float* q, float* s) {
  if (kq.act_quant_row != nullptr)
    kq.act_quant_row(x, K, q, s);
  else
    act_quant_fp8(x, K, 128, q, s);
}

// LinearJob::nonfinite: tokens [t0, t0 + mr) of P.y, rows [n0, n0 + nrows) (just written by this thread): a token
// with a non-finite value there is flagged (relaxed atomic stores: other threads flag other rows of the same token).
void flag_nonfinite(const Product& P, int64_t t0, int64_t mr, int64_t n0, int64_t nrows) {
  for (int64_t m = 0; m < mr; ++m) {
    const float* yr = P.y + (t0 + m) * P.nout + (n0 - P.r0);
    uint32_t bad = 0;
    for (int64_t j = 0; j < nrows; ++j) {
      uint32_t u;
      std::memcpy(&u, yr + j, 4);
      bad |= uint32_t((u & 0x7F800000u) == 0x7F800000u);
    }
    if (bad) std::atomic_ref<int32_t>(P.nonfinite[t0 + m]).store(1, std::memory_order_relaxed);
  }
}

// Unit u of product P: its 64-row group for its token tile, written to P.y. `next` (or null): the product of the next
// unit this thread runs and that unit, whose weight bytes the fused GEMVs prefetch meanwhile. `prefetched`: whether
// the thread's previous unit prefetched this one's (what the previous call returned). Returns whether this unit ran a
// fused GEMV that prefetches `next` (PanelSrc::pf_w: all but the BF16 panel-copy ones).
bool run_unit(const Product& P, const Kernels& ker, int64_t u, const Product* next, int64_t next_u, bool prefetched) {
  static thread_local std::vector<float> Pbuf, Psbuf, accbuf;
  const int64_t K = P.K, nsb = P.nsb, tile = P.tile;
  const int64_t g = u / P.n_tiles, ti = u % P.n_tiles;
  const int64_t n0 = P.r0 + g * kGroupRows;
  const int64_t nrows = std::min<int64_t>(kGroupRows, P.r1 - n0);
  const int np = static_cast<int>((nrows + kPanel - 1) / kPanel);
  const int64_t t0 = ti * tile, mr = std::min<int64_t>(tile, P.n_tok - t0);
  const bool Q = P.Q;
  const float* a = P.a;
  const float* sa = P.sa;
  PanelSrc src = P.src;
  src.prefetched = prefetched;
  // the next unit's group, which the fused GEMVs prefetch into L2 while they compute this one
  if (next != nullptr) {
    const int64_t nn0 = next->r0 + (next_u / next->n_tiles) * kGroupRows;
    const int64_t nrw = std::min<int64_t>(kGroupRows, next->r1 - nn0);
    src.pf_w = next->src.w + nn0 * next->src.row_bytes;
    src.pf_w_bytes = nrw * next->src.row_bytes;
    if (next->src.fmt == GemmFormat::fp4) {
      src.pf_s = next->src.scale + nn0 * next->src.scale_cols;
      src.pf_s_bytes = nrw * next->src.scale_cols;
    }
  }

  // Decode-sized: one token -> the fused GEMV kernel when it handles this format / mode / shape; a few tokens (a
  // batch of decodes) and a full group -> the fused GEMV for all of them, when the kernel set has one for this format
  // and mode (AVX-512: BF16 dense, FP4 / FP8 quantized). For a full group both write their accumulators straight into
  // y (token m's row at yg + m * nout), which they never read before writing; a partial group's single-token GEMV
  // writes all kGroupRows accumulators, so it goes through accbuf.
  const bool full = nrows == kGroupRows;
  float* yg = P.y + t0 * P.nout + (n0 - P.r0);
  bool done = false;
  if (full) {
    if (mr == 1 && ker.gemv_group != nullptr)
      done = ker.gemv_group(src, n0, kGroupRows, a + t0 * K, Q ? sa + t0 * nsb : nullptr, Q, yg);
    if (!done && mr > 1 && mr <= 8 && ker.gemv_group_m != nullptr)
      done = ker.gemv_group_m(src, n0, a + t0 * K, K, Q ? sa + t0 * nsb : nullptr, nsb, int(mr), Q, yg, P.nout);
    if (done) {
      if (P.opts.out_bf16)
        for (int64_t m = 0; m < mr; ++m) round_bf16_row(yg + m * P.nout, nrows, yg + m * P.nout);
      if (P.nonfinite) flag_nonfinite(P, t0, mr, n0, nrows);
      return src.panels == nullptr;
    }
  }
  Pbuf.resize(static_cast<size_t>(kGroupPanels) * kChunk * kPanel);
  Psbuf.resize(static_cast<size_t>(kGroupPanels) * (kChunk / 32) * kPanel);
  accbuf.assign(static_cast<size_t>(mr * kGroupRows), 0.0f);
  if (!full && mr == 1 && ker.gemv_group != nullptr)
    done = ker.gemv_group(src, n0, static_cast<int>(nrows), a + t0 * K, Q ? sa + t0 * nsb : nullptr, Q, accbuf.data());
  const bool fused = done;  // (a partial group never takes the BF16 panel-copy GEMV)
  for (int64_t k0 = 0; k0 < K && !done; k0 += P.chunk) {
    const int kc = static_cast<int>(std::min<int64_t>(P.chunk, K - k0));
    const int kc_pad = (kc + 15) & ~15;
    const int nbk = (kc + P.bk - 1) / P.bk;
    // Scales of every panel row for the chunk (granularity sblk = the scale block width), then the weights.
    const int nps = P.scales_per_chunk ? (kc + P.sblk - 1) / P.sblk : 0;
    for (int p = 0; p < np; ++p) {
      const int64_t pr0 = n0 + p * kPanel;
      const int prows = static_cast<int>(std::min<int64_t>(kPanel, n0 + nrows - pr0));
      float* Ps = Psbuf.data() + static_cast<size_t>(p) * (kChunk / 32) * kPanel;
      if (P.scales_per_chunk) {
        if (prows == kPanel && src.fmt == GemmFormat::fp4 && ker.fp4_panel_scales != nullptr) {
          ker.fp4_panel_scales(src, pr0, k0, nps, Ps);
        } else if (prows == kPanel && src.fmt == GemmFormat::fp8 && pr0 / src.br == (pr0 + kPanel - 1) / src.br) {
          weight_scales_row(src, pr0, k0 / P.sblk, nps, Ps, kPanel);  // one row block: same scales for all 16 rows
          for (int b = 0; b < nps; ++b)
            for (int j = 1; j < kPanel; ++j) Ps[b * kPanel + j] = Ps[b * kPanel];
        } else {
          for (int j = 0; j < prows; ++j) weight_scales_row(src, pr0 + j, k0 / P.sblk, nps, Ps + j, kPanel);
          for (int j = prows; j < kPanel; ++j)
            for (int b = 0; b < nps; ++b) Ps[b * kPanel + j] = 0.0f;
        }
      }
      ker.decode_panel(src, pr0, prows, k0, kc, P.scales_per_chunk ? Ps : nullptr,
                       Pbuf.data() + static_cast<size_t>(p) * kc_pad * kPanel);
    }
    MkArgs A{};
    A.a = a + t0 * K + k0;
    A.lda = K;
    A.sa = Q ? sa + t0 * nsb : nullptr;
    A.ldsa = nsb;
    A.k0 = k0;
    A.kc = kc;
    A.bk = P.bk;
    A.P = Pbuf.data();
    A.kc_pad = kc_pad;
    A.Ps = Psbuf.data();
    A.ldps = (kChunk / 32) * kPanel;
    A.nbk = nbk;
    A.np = np;
    A.mr = mr;
    A.acc = accbuf.data();
    A.ldacc = kGroupRows;
    (Q ? ker.mk_q : ker.mk_d)(A);
  }
  // ---- write out (bf16 rounding if asked) ----
  for (int64_t m = 0; m < mr; ++m) {
    const float* c = accbuf.data() + m * kGroupRows;
    float* yr = P.y + (t0 + m) * P.nout + (n0 - P.r0);
    if (P.opts.out_bf16)
      round_bf16_row(c, nrows, yr);
    else
      std::memcpy(yr, c, static_cast<size_t>(nrows) * 4);
  }
  if (P.nonfinite) flag_nonfinite(P, t0, mr, n0, nrows);
  return fused;
}

// Runs every unit of the products: one parallel region (when `parallel`), each thread one contiguous range of the
// units in (product, unit) order with about the same weight bytes x tokens, so that the unit after each one is
// usually the next group of the same weight (or the first of the next weight), which the fused GEMVs prefetch.
void run_units(const Product* prods, int64_t n_prods, bool parallel) {
  const Kernels& ker = kernels_for(simd_level());
  static thread_local std::vector<int64_t> first;  // first[i]: global index of product i's unit 0
  first.assign(static_cast<size_t>(n_prods + 1), 0);
  for (int64_t i = 0; i < n_prods; ++i) first[size_t(i + 1)] = first[size_t(i)] + prods[i].units();
  const int64_t total = first[size_t(n_prods)];
  const int64_t* fst = first.data();
  auto locate = [&](int64_t gu, int64_t& pi, int64_t& u) {  // global unit -> (product, unit)
    pi = std::upper_bound(fst, fst + n_prods + 1, gu) - fst - 1;
    u = gu - fst[pi];
  };
  auto cost = [&](int64_t gu) {
    int64_t pi, u;
    locate(gu, pi, u);
    const Product& P = prods[pi];
    return P.unit_rows(u) * (P.src.row_bytes + 64) * P.unit_tokens(u);
  };
  auto run_range = [&](int64_t b, int64_t e) {
    bool prefetched = false;
    for (int64_t gu = b; gu < e; ++gu) {
      int64_t pi, u, npi = 0, nu = 0;
      locate(gu, pi, u);
      if (gu + 1 < e) locate(gu + 1, npi, nu);
      prefetched = run_unit(prods[pi], ker, u, gu + 1 < e ? &prods[npi] : nullptr, nu, prefetched);
    }
  };
  const int threads = parallel ? max_threads() : 1;
  if (threads <= 1 || total <= 1) {
    run_range(0, total);
    return;
  }
  // thread t runs the units whose cost prefix midpoints fall in [t, t+1) * C / threads
  static thread_local std::vector<int64_t> bounds;
  bounds.assign(static_cast<size_t>(threads + 1), total);
  {
    int64_t c_all = 0;
    for (int64_t gu = 0; gu < total; ++gu) c_all += cost(gu);
    int64_t acc = 0, t = 0;
    bounds[0] = 0;
    for (int64_t gu = 0; gu < total; ++gu) {
      const int64_t c = cost(gu);
      const int64_t mid2 = 2 * acc + c;  // 2 x midpoint
      while (t + 1 < threads && mid2 * threads >= 2 * c_all * (t + 1)) bounds[size_t(++t)] = gu;
      acc += c;
    }
  }
  const int64_t* bd = bounds.data();
#pragma omp parallel num_threads(threads)
  {
    // (the runtime may give fewer threads than asked: then some run more than one range)
    for (int r = omp_get_thread_num(); r < threads; r += omp_get_num_threads()) run_range(bd[r], bd[r + 1]);
  }
}

}  // namespace

void linear(const GemmWeight& W, const float* x, int64_t n_tok, float* y, const LinearOpts& opts) {
  const LinearJob job{W, x, n_tok, y, opts};
  linear_batch(std::span<const LinearJob>(&job, 1));
}

void linear_batch(std::span<const LinearJob> jobs) {
  static thread_local std::vector<Product> prods;
  static thread_local std::vector<std::vector<float>> qbufs, sbufs;
  prods.clear();
  int64_t work = 0, quant = 0;
  for (const LinearJob& j : jobs) {
    Product P = describe(j.W, j.x, j.n_tok, j.y, j.opts);
    if (P.n_tok == 0) continue;
    P.nonfinite = j.nonfinite;
    if (P.nonfinite) std::fill(P.nonfinite, P.nonfinite + P.n_tok, 0);
    work += P.n_tok * P.K * P.nout;
    if (P.Q) quant += P.n_tok * P.K;
    prods.push_back(P);
  }
  if (prods.empty()) return;
  const int threads = max_threads();
  // ---- activations (Q: act_quant per 128 of every token row, spec §4.3); products with the same input share them
  if (qbufs.size() < prods.size()) {
    qbufs.resize(prods.size());
    sbufs.resize(prods.size());
  }
  const Kernels& kq = kernels_for(simd_level());
  for (size_t i = 0; i < prods.size(); ++i) {
    Product& P = prods[i];
    if (!P.Q) continue;
    size_t same = i;
    for (size_t j = 0; j < i; ++j)
      if (prods[j].Q && prods[j].a_in == P.a_in && prods[j].K == P.K && prods[j].n_tok >= P.n_tok) same = j;
    if (same != i) {
      P.a = prods[same].a;
      P.sa = prods[same].sa;
      continue;
    }
    qbufs[i].resize(static_cast<size_t>(P.n_tok * P.K));
    sbufs[i].resize(static_cast<size_t>(P.n_tok * P.nsb));
    float* q = qbufs[i].data();
    float* s = sbufs[i].data();
    const float* x = P.a_in;
    const int64_t K = P.K, nsb = P.nsb;
    if (quant < (int64_t{1} << 16)) {  // decode-sized: a parallel region would cost more than the work
      for (int64_t t = 0; t < P.n_tok; ++t) quantize_row(kq, x + t * K, K, q + t * K, s + t * nsb);
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < P.n_tok; ++t) quantize_row(kq, x + t * K, K, q + t * K, s + t * nsb);
    }
    P.a = q;
    P.sa = s;
  }
  for (Product& P : prods) split(P, threads);
  // Small products (tiny models, short rows) run on the calling thread: forking the pool would cost more than the
  // work. Every unit is computed the same way either way, so results do not change.
  run_units(prods.data(), static_cast<int64_t>(prods.size()), work >= (int64_t{1} << 21));
}

}  // namespace dsv4
