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
  }
  return "?";
}

SimdLevel best_simd_level() {
  static const SimdLevel best = [] {
    const CpuFeatures& c = cpu_features();
    const bool has2 = c.avx2 && c.fma && c.f16c;
    if (has2 && c.avx512f && c.avx512bw && c.avx512vl && avx512_kernels() != nullptr) return SimdLevel::avx512;
    if (has2 && avx2_kernels() != nullptr) return SimdLevel::avx2;
    return SimdLevel::scalar;
  }();
  return best;
}

namespace {

std::atomic<int> g_level{-1};

const Kernels& kernels_for(SimdLevel l) {
  switch (l) {
    case SimdLevel::avx512: return *avx512_kernels();
    case SimdLevel::avx2: return *avx2_kernels();
    default: return scalar_kernels();
  }
}

}  // namespace

SimdLevel set_simd_level(SimdLevel l) {
  const SimdLevel best = best_simd_level();
  if (static_cast<int>(l) > static_cast<int>(best)) l = best;
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

void linear(const GemmWeight& W, const float* x, int64_t n_tok, float* y, const LinearOpts& opts) {
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
  const int64_t r0 = opts.row_begin;
  const int64_t r1 = opts.row_end < 0 ? W.rows : opts.row_end;
  if (r0 < 0 || r1 > W.rows || r0 >= r1) fail("linear: bad row range [{}, {}) of {} rows", r0, r1, W.rows);
  const int64_t nout = r1 - r0;
  const int64_t K = W.cols;
  if (n_tok == 0) return;

  PanelSrc src{};
  src.fmt = W.fmt;
  src.w = W.w;
  src.rows = W.rows;
  src.cols = K;
  switch (W.fmt) {
    case GemmFormat::fp8: src.row_bytes = K; break;
    case GemmFormat::fp4: src.row_bytes = K / 2; break;
    case GemmFormat::bf16: src.row_bytes = 2 * K; break;
    case GemmFormat::f32: src.row_bytes = 4 * K; break;
  }
  src.dequant = !opts.act_quant_fp8;
  src.round_bf16 = opts.weight_as_bf16;
  src.scale = W.scale;
  src.scale_f32 = W.scale_f32 && W.fmt == GemmFormat::fp8;
  src.br = W.fmt == GemmFormat::fp4 ? 1 : W.block_rows;
  src.bc = W.fmt == GemmFormat::fp4 ? 32 : W.block_cols;
  src.scale_cols = (K + src.bc - 1) / src.bc;
  // the panel copy serves groups that start on a panel: a row range from a multiple of 16
  src.panels = W.fmt == GemmFormat::bf16 && K % 32 == 0 && r0 % kPanel == 0 ? W.panels : nullptr;
  const bool Q = opts.act_quant_fp8;
  const int bk = W.fmt == GemmFormat::fp4 ? 32 : 128;
  // Panel scales are gathered per chunk when the scale grid tiles the chunk (always for the checkpoint formats;
  // in (Q) mode sblk == bk). Otherwise the dense decode looks every scale up itself.
  const int sblk = static_cast<int>(src.bc);
  const bool scales_per_chunk = quantized_fmt && src.bc >= 32 && kChunk % src.bc == 0;
  if (Q && !scales_per_chunk) fail("linear: unsupported scale block {}", src.bc);

  // ---- activations (Q: act_quant per 128 of every token row, spec §4.3) ----
  const float* a = x;
  const float* sa = nullptr;
  const int64_t nsb = (K + 127) / 128;
  static thread_local std::vector<float> qbuf, sbuf;
  if (Q) {
    qbuf.resize(static_cast<size_t>(n_tok * K));
    sbuf.resize(static_cast<size_t>(n_tok * nsb));
    float* q = qbuf.data();
    float* s = sbuf.data();
    const Kernels& kq = kernels_for(simd_level());
    auto quant = kq.act_quant_row != nullptr ? kq.act_quant_row
                                             : [](const float* xr, int64_t n, float* qr, float* sr) {
                                                 act_quant_fp8(xr, n, 128, qr, sr);
                                               };
    if (n_tok * K < (int64_t{1} << 16)) {  // decode-sized: a parallel region would cost more than the work
      for (int64_t t = 0; t < n_tok; ++t) quant(x + t * K, K, q + t * K, s + t * nsb);
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < n_tok; ++t) quant(x + t * K, K, q + t * K, s + t * nsb);
    }
    a = q;
    sa = s;
  }

  // ---- work partition: (row group, token tile) units, static over the pool ----
  const Kernels& ker = kernels_for(simd_level());
  const int64_t n_groups = (nout + kGroupRows - 1) / kGroupRows;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  // Token tiles: at most kMaxTile tokens (the unit's accumulators and activation slice stay in L2), and enough units
  // for every thread when the weight has few row groups.
  constexpr int64_t kMaxTile = 256;
  int64_t n_tiles = (n_tok + kMaxTile - 1) / kMaxTile;
  if (n_groups * n_tiles < 2 * threads && n_tok > 1)
    n_tiles = std::min<int64_t>(n_tok, std::max<int64_t>(n_tiles, (2 * threads + n_groups - 1) / n_groups));
  const int64_t tile = (n_tok + n_tiles - 1) / n_tiles;
  n_tiles = (n_tok + tile - 1) / tile;
  const int64_t n_units = n_groups * n_tiles;
  // K chunk: small for decode-sized calls (the panel tile stays in L1), large when the tile is reused by many tokens.
  // Results do not depend on it (blocks never straddle a chunk; the dense chain continues across chunks).
  const int64_t chunk = tile <= 4 ? 128 : kChunk;

  // Small products (tiny models, short rows) run on the calling thread: forking the pool would cost more than the
  // work. Every unit is computed the same way either way, so results do not change.
  const bool parallel = n_tok * K * (r1 - r0) >= (int64_t{1} << 21);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t u = 0; u < n_units; ++u) {
    static thread_local std::vector<float> Pbuf, Psbuf, accbuf;
    const int64_t g = u / n_tiles, ti = u % n_tiles;
    const int64_t n0 = r0 + g * kGroupRows;
    const int64_t nrows = std::min<int64_t>(kGroupRows, r1 - n0);
    const int np = static_cast<int>((nrows + kPanel - 1) / kPanel);
    const int64_t t0 = ti * tile, mr = std::min<int64_t>(tile, n_tok - t0);
    // Decode-sized: one token, one full group -> the fused GEMV kernel when it handles this format / mode; a few
    // tokens (a batch of decodes) -> the fused GEMV for all of them, when the kernel set has one for this format and
    // mode (AVX-512: BF16 dense, FP4 / FP8 quantized). Both write their accumulators straight into y (token m's row
    // at y + m * nout), which they never read before writing.
    float* yg = y + t0 * nout + (n0 - r0);
    bool done = false;
    if (mr == 1 && nrows == kGroupRows && ker.gemv_group != nullptr)
      done = ker.gemv_group(src, n0, a + t0 * K, Q ? sa + t0 * nsb : nullptr, Q, yg);
    if (!done && mr > 1 && mr <= 8 && nrows == kGroupRows && ker.gemv_group_m != nullptr)
      done = ker.gemv_group_m(src, n0, a + t0 * K, K, Q ? sa + t0 * nsb : nullptr, nsb, int(mr), Q, yg, nout);
    if (done) {
      if (opts.out_bf16)
        for (int64_t m = 0; m < mr; ++m)
          for (int64_t j = 0; j < nrows; ++j) yg[m * nout + j] = round_to_bf16(yg[m * nout + j]);
      continue;
    }
    Pbuf.resize(static_cast<size_t>(kGroupPanels) * kChunk * kPanel);
    Psbuf.resize(static_cast<size_t>(kGroupPanels) * (kChunk / 32) * kPanel);
    accbuf.assign(static_cast<size_t>(mr * kGroupRows), 0.0f);
    for (int64_t k0 = 0; k0 < K; k0 += chunk) {
      const int kc = static_cast<int>(std::min<int64_t>(chunk, K - k0));
      const int kc_pad = (kc + 15) & ~15;
      const int nbk = (kc + bk - 1) / bk;
      // Scales of every panel row for the chunk (granularity sblk = the scale block width), then the weights.
      const int nps = scales_per_chunk ? (kc + sblk - 1) / sblk : 0;
      for (int p = 0; p < np; ++p) {
        const int64_t pr0 = n0 + p * kPanel;
        const int prows = static_cast<int>(std::min<int64_t>(kPanel, n0 + nrows - pr0));
        float* Ps = Psbuf.data() + static_cast<size_t>(p) * (kChunk / 32) * kPanel;
        if (scales_per_chunk) {
          if (prows == kPanel && W.fmt == GemmFormat::fp4 && ker.fp4_panel_scales != nullptr) {
            ker.fp4_panel_scales(src, pr0, k0, nps, Ps);
          } else if (prows == kPanel && W.fmt == GemmFormat::fp8 && pr0 / src.br == (pr0 + kPanel - 1) / src.br) {
            weight_scales_row(src, pr0, k0 / sblk, nps, Ps, kPanel);  // one row block: same scales for all 16 rows
            for (int b = 0; b < nps; ++b)
              for (int j = 1; j < kPanel; ++j) Ps[b * kPanel + j] = Ps[b * kPanel];
          } else {
            for (int j = 0; j < prows; ++j) weight_scales_row(src, pr0 + j, k0 / sblk, nps, Ps + j, kPanel);
            for (int j = prows; j < kPanel; ++j)
              for (int b = 0; b < nps; ++b) Ps[b * kPanel + j] = 0.0f;
          }
        }
        ker.decode_panel(src, pr0, prows, k0, kc, scales_per_chunk ? Ps : nullptr,
                         Pbuf.data() + static_cast<size_t>(p) * kc_pad * kPanel);
      }
      MkArgs A{};
      A.a = a + t0 * K + k0;
      A.lda = K;
      A.sa = Q ? sa + t0 * nsb : nullptr;
      A.ldsa = nsb;
      A.k0 = k0;
      A.kc = kc;
      A.bk = bk;
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
      float* yr = y + (t0 + m) * nout + (n0 - r0);
      if (opts.out_bf16)
        for (int64_t j = 0; j < nrows; ++j) yr[j] = round_to_bf16(c[j]);
      else
        for (int64_t j = 0; j < nrows; ++j) yr[j] = c[j];
    }
  }
}

}  // namespace dsv4
