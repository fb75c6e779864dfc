// GEMM path selection of the CUDA linear() (k_gemm.cu) and the internal interfaces between k_gemm.cu,
// gemm_cublaslt.cpp and k_moe.cu. Host-only header (no CUDA types beyond cudaStream_t).
//
// Paths of linear() (semantics of backend/gemm.h in every case; see k_gemm.cu for the kernels):
//   simt     : tiled SIMT kernel (64 tokens x 64 rows per block), any shape, any number of tokens.
//   small_m  : decode kernels, any shape: (Q) 32 rows x 4 tokens per block, K split over the lanes by scale block;
//              (D) one warp per 32 rows, one lane per row running the row's whole K chain (up to 4 tokens at once).
//   cublaslt : cuBLASLt FP8 block-scaled GEMM ((Q) with FP8 weights only; Hopper sm_90 only; K, the output row
//              range and its start multiples of 128, K/128 a multiple of 4, weight aux scales present).
//   gemv     : the fast decode kernel (n_tok <= 8): split-K GEMV with 16-byte weight loads, many blocks per matrix,
//              fixed-order warp / block reductions. Deterministic, and a token's result never depends on the other
//              tokens of the call, but its summation order is its own (not the CPU's): fp32 rounding differences.
//              Shapes it cannot take (rows not a multiple of 16 bytes, unaligned activations) run small_m.
//   auto_    : gemv for n_tok <= 8, else cublaslt when it can run (FP8 (Q)) or cuBLAS BF16 for BF16 weights with
//              bf16-valued x (LinearOpts::x_bf16, k_bf16_tc.cu), else simt; the MoE's small
//              expert segments (decode) on gemv as well. In the deterministic mode (set_deterministic(true), the
//              CLI's --deterministic) auto_ instead takes small_m for n_tok <= 8 and simt otherwise, the MoE its
//              small_m kernels: every product in the CPU's order, so CUDA results equal the CPU backend's bitwise
//              (slower: no cuBLASLt, no gemv).
// simt and small_m compute every output in the CPU's order of gemm.h ((Q): per scale block an fma chain, blocks
// added in order; (D): one fma chain over all of K), so in both products they equal the CPU and each other bitwise,
// and row t never depends on n_tok. cuBLASLt uses its own order (tensor-core accumulation inside each 128-K block):
// deterministic for a given shape, but neither bitwise equal to the other paths nor guaranteed independent of n_tok
// (algorithm choice).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "backend/weight_view.h"

namespace dsv4::cuda {

enum class GemmPath { auto_, simt, small_m, cublaslt, gemv };

// Process-wide override (tests and benchmarks only; default auto_). A forced path that cannot handle a call falls
// back to simt (cublaslt also falls back when cuBLASLt returns no algorithm or an error).
void set_gemm_path(GemmPath p);
GemmPath gemm_path();
// Process-wide deterministic mode (default off): auto_ picks only the kernels that repeat the CPU's order (see above).
// CudaBackend sets it from BackendOptions::deterministic.
void set_deterministic(bool on);
bool deterministic();
// Which kernel runs the prefill expert segments of moe_tc_big (process-wide, tests and benchmarks; default mma):
// auto_ = the wgmma kernel (k_moe_wgmma.cu) where it runs (its sm_90a code in the binary, compute capability 9.0),
// else the mma.sync kernel (k_moe_tc.cu); mma = always the mma.sync kernel. The default stays mma until the wgmma
// kernel's GPU tests (CudaMoeWgmma.*) have passed on a GPU.
enum class MoeBigKernel { auto_, mma };
void set_moe_big_kernel(MoeBigKernel k);
MoeBigKernel moe_big_kernel();
// The path the most recent linear() of this process actually ran (tests use it to tell which kernel was checked).
GemmPath last_gemm_path();
const char* gemm_path_name(GemmPath p);

namespace gemm_internal {

// ---- shared by the launchers ------------------------------------------------------------------------------------
[[noreturn]] void fail_msg(const std::string& msg);  // throws dsv4::Error
void note_path(GemmPath p);                          // records last_gemm_path()

// Activation quantization (act_quant, spec §4.3) of `rows` rows of x [rows, K] per 128 columns:
// fp32 code values q [rows, K] (q may alias x) and scales s [rows, ceil(K/128)].
void act_quant_f32(const float* x, int64_t rows, int64_t K, float* q, float* s, cudaStream_t stream);
// The same into e4m3 bytes q8 [rows_pad, K] and scales s_t [ceil(K/128), rows_pad] (column m of block kb at
// s_t[kb * rows_pad + m], the cuBLASLt VEC128 layout); rows rows..rows_pad-1 get zero codes and scale 1.
void act_quant_e4m3(const float* x, int64_t rows, int64_t rows_pad, int64_t K, uint8_t* q8, float* s_t,
                    cudaStream_t stream);
// y[m, n] = bf16 ? bf16(src[m, n]) : src[m, n] for m < rows, n < cols (row stride cols for both; src may be y).
void finish_rows(const float* src, int64_t rows, int64_t cols, bool bf16, float* y, cudaStream_t stream);

// ---- cuBLASLt (gemm_cublaslt.cpp) -----------------------------------------------------------------------------
// Whether the cuBLASLt path is compiled in and the weight's shape / row range allow it (device not checked).
bool cublaslt_shape_ok(const WeightView& W, int64_t row_begin, int64_t row_end);
// Whether the current device can run it (compute capability 9.0 exactly); cached per device.
bool cublaslt_device_ok();
size_t cublaslt_scratch_bytes(const WeightView& W, int64_t n_tok, int64_t nout);
// y[n_tok, nout] = (Q) product of x with rows [row_begin, row_begin + nout) of W (FP8, aux = fp32 scale grid).
// Returns false (having written nothing to y) when cuBLASLt cannot run it; the caller then uses the SIMT path.
bool cublaslt_linear(const WeightView& W, const float* x, int64_t n_tok, float* y, int64_t row_begin, int64_t nout,
                     bool out_bf16, void* scratch, cudaStream_t stream);
// Row stride (floats) of the fp32 weight scale grid kept in WeightView::aux: round_up(ceil(cols/128), 4).
int64_t aux_scale_ld(const WeightView& W);

// ---- grouped expert GEMMs for the MoE (k_gemm.cu, used by k_moe.cu) -------------------------------------------
// Expert segments: the (token, slot) pairs sorted by (expert, pair index); segment e is sorted rows
// [seg_start[e], seg_start[e+1]). Experts with more than kMoeSmallMax rows run on the tiled kernel (M tiles of
// kMoeTileM rows, big_tile_start[e] = first tile of e, big_tile_start[E] = total); the others (1..kMoeSmallMax rows)
// on the small kernel, listed in small_list[0 .. *n_small).
constexpr int kMoeSmallMax = 16;
constexpr int kMoeTileM = 64;

struct MoeGemmArgs {
  const ExpertView* table = nullptr;  // device array [E]
  int64_t n_experts = 0;
  GemmFormat fmt = GemmFormat::fp4;   // format of every expert matrix of this layer
  int64_t d_model = 0, inter = 0;     // w1/w3: [inter, d_model]; w2: [d_model, inter]
  const int32_t* seg_start = nullptr;       // [E+1]
  const int32_t* big_tile_start = nullptr;  // [E+1]
  const int32_t* small_list = nullptr;      // [E]
  const int32_t* n_small = nullptr;         // [1]
  int64_t n_rows_bound = 0;                 // host-known bound of the number of sorted rows (n_tok * k)
  int64_t n_tok = 0;                        // tokens of the call (picks the decode kernel's rows per pass)
  const int32_t* row_tok = nullptr;         // [rows] token of each sorted row
  const float* row_w = nullptr;             // [rows] routing weight of each sorted row
  bool quant = false;      // (Q): activations are code values with per-128 scales
  bool out_bf16 = false;   // LinearOpts::out_bf16 of the expert linears
  bool weight_as_bf16 = false;
  int64_t block_cols = 128;  // FP8 experts: scale block columns (gemv_kernel needs a multiple of 16)
  bool words_ok = false;     // every expert's weight and scale rows are 4-byte aligned (moe_tc_small_kernel)
  bool w16_ok = false;       // ... and every weight row 16-byte aligned (moe_tc_big_kernel)
  void* a8_ws = nullptr;     // moe_tc_big_scratch_bytes of scratch (nullptr: the big segments do not take that path)
};
// h[r, :] = swiglu(w1 x, w3 x, limit, row_w[r], bf16) for every sorted row r, x = a[row_tok[r]] (a: [*, d_model],
// codes in (Q) with scales sa [*, ceil(d_model/128)]).
void moe_w13(const MoeGemmArgs& g, const float* a, const float* sa, float swiglu_limit, bool bf16, float* h,
             cudaStream_t stream);
// o[r, :] = w2 h[r] for every sorted row r (h: [rows, inter], codes in (Q) with scales sh [rows, ceil(inter/128)]).
void moe_w2(const MoeGemmArgs& g, const float* h, const float* sh, float* o, cudaStream_t stream);
// The big segments of FP4 experts in the fast (Q) mode on f16 tensor cores with the FP4 -> f16 conversion (scales
// folded in) in the kernel (k_moe_tc.cu): ok = FP4, (Q), fast mode on the auto path, shapes, w16_ok, device sm_89+.
// moe_tc_big converts the activation codes a (w13: [n_tok, d_model] gathered through row_tok; w2: [n_rows_bound,
// inter]) to f16 values of their e4m3 codes and the scales sa to per-block ratios in g.a8_ws, then writes y rows of
// the segments with more than kMoeSmallMax rows as moe_w13 / moe_w2 (its own summation order: the file comment).
bool moe_tc_big_ok(const MoeGemmArgs& g);
// Whether moe_tc_big runs the wgmma kernel on the current device with moe_big_kernel() == auto_ (for tests).
bool moe_tc_big_wgmma_ok();
size_t moe_tc_big_scratch_bytes(GemmFormat fmt, bool quant, int64_t n_tok, int64_t P, int64_t D, int64_t I);
void moe_tc_big(bool w13, const MoeGemmArgs& g, const float* a, const float* sa, float* y, int64_t ldy, float limit,
                bool bf16, cudaStream_t stream);
// Large (prefill) FP4 expert calls in the fast (Q) mode on cuBLAS BF16 tensor cores (k_bf16_tc.cu). ok: the
// call qualifies (>= 4096 pairs, FP4, (Q), fast mode, stream not capturing) and moe_bf16_scratch_bytes (0 where it
// cannot) was reserved. w13 fills seg (the segment starts, on the host) and writes h as moe_w13 does, using G (the
// caller's o buffer, [rows, 2 inter] <= [rows, d_model]); after act_quant of h, w2 writes o as moe_w2 does.
bool moe_bf16_ok(const MoeGemmArgs& g, cudaStream_t stream);
size_t moe_bf16_scratch_bytes(GemmFormat fmt, bool quant, int64_t P, int64_t D, int64_t I);
void moe_bf16_w13(const MoeGemmArgs& g, const ExpertView* experts, const float* qx, const float* sx, float limit,
                  bool bf16, float* h, float* G, void* ws, std::vector<int32_t>& seg, cudaStream_t stream);
void moe_bf16_w2(const MoeGemmArgs& g, const ExpertView* experts, const float* qh, const float* sh, float* o, void* ws,
                 const std::vector<int32_t>& seg, cudaStream_t stream);
// Grouped wo_a of more than 8 tokens (Ops::linear_grouped with weight_as_bf16 + out_bf16, FP8 weight, fast mode; also
// while capturing) on a cuBLAS BF16 strided-batched GEMM (k_bf16_tc.cu); scratch: linear_grouped_bf16_bytes (0: the
// call does not qualify). Returns false (nothing queued) when it does not qualify.
size_t linear_grouped_bf16_bytes(const WeightView& W, int64_t n_tok, int64_t groups, const LinearOpts& o);
bool linear_grouped_bf16(const WeightView& W, const float* x, int64_t n_tok, int64_t groups, float* y,
                       const LinearOpts& o, void* scratch, cudaStream_t stream);
// BF16-weight linear of more than 8 tokens with LinearOpts::x_bf16 (fast mode; also while capturing) on a cuBLAS BF16
// GEMM (k_bf16_tc.cu): the products are exact, fp32 sums in cuBLAS's order; scratch: linear_bf16_bytes (0: the call
// does not qualify). Returns false (nothing queued) when it does not qualify.
size_t linear_bf16_bytes(const WeightView& W, int64_t n_tok, const LinearOpts& o);
bool linear_bf16(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o, void* scratch,
                 cudaStream_t stream);
// h[r, i] = swiglu(g[r, i], up[r, i]) without routing weight (the shared expert), h may alias g.
void swiglu_rows(const float* g, const float* up, int64_t rows, int64_t dim, float limit, bool bf16, float* h,
                 cudaStream_t stream);

}  // namespace gemm_internal
}  // namespace dsv4::cuda
