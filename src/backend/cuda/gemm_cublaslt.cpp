// cuBLASLt FP8 block-scaled GEMM for (Q) linears with FP8 weights (spec §4.5): 1x128 activation scales
// (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) x 128x128 weight scales (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F),
// Hopper (compute capability 9.0) only, cuBLAS 12.9 or newer.
//
// Operand mapping (cuBLASLt is column-major; PyTorch's _scaled_mm does the same swap, see ATen cuBlasCommonArgs.h):
//   y[M, N] row-major == D column-major [N, M] (ld N):  D = op(A) * op(B) with m = N (output rows), n = M (tokens)
//   A = the weight rows [row_begin, row_begin + N): row-major [N, K] bytes == column-major [K, N] (ld K), TRANSA = T
//   B = the e4m3 activations: row-major [M, K] == column-major [K, M] (ld K), TRANSB = N
//   ("TN", the only FP8 layout Hopper supports).
// Scale layouts (ATen ScaledBlas.cpp is_blockwise_1x128_scaling / is_blockwise_128x128_scaling, after the swap):
//   A, BLK128x128: one fp32 per 128x128 block of the stored [K, N] matrix, K-block index fastest: scale(kb, nb) at
//     nb * ld + kb. That is the checkpoint's row-major [N/128][K/128] grid, widened to fp32 at upload
//     (build_weight_aux, exact: 2^(e-127)) with row stride ld = round_up(K/128, 4) (older cuBLAS/PyTorch pad the
//     leading dimension to 16 bytes; the path requires K/128 % 4 == 0 so that padded and unpadded layouts agree).
//     A row range starts at grid row row_begin/128.
//   B, VEC128: one fp32 per 128 consecutive K of each column (token), "outer-dim-major": scale(kb, m) at
//     kb * M + m (PyTorch: scale_a [M, K/128] with strides (1, M)). M is padded to a multiple of 4 (16-byte scale
//     columns; vLLM pads M to 4 for this path) with zero activation rows of scale 1.
// Output fp32 (C = D, beta = 0), written straight into y when M % 4 == 0 (else into scratch and copied); then
// bf16 rounding when out_bf16. No fast accumulation (not allowed with block scaling).
//
// Numerics: sum_kb (sum_{k in kb} qa*qw) * sa * sw like the reference, but the 128-K partial sums are tensor-core
// accumulations (not the CPU's fma chain), so results differ from the CPU/SIMT paths by fp32 rounding (plus the
// reduced-precision in-MMA accumulation of Hopper FP8). Deterministic for a given shape; the algorithm (and with it
// the rounding of row t) may change with n_tok.
#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/gemm_path.h"

#if __has_include(<cublasLt.h>)
#include <cublasLt.h>
#endif

#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120900
#define DSV4_LT_BLOCK_SCALING 1
#else
#define DSV4_LT_BLOCK_SCALING 0
#endif

namespace dsv4::cuda::gemm_internal {

namespace {
constexpr size_t kWorkspaceBytes = size_t(32) << 20;
inline size_t align256(size_t b) { return (b + 255) & ~size_t(255); }
inline int64_t round4(int64_t v) { return (v + 3) & ~int64_t(3); }
}  // namespace

int64_t aux_scale_ld(const WeightView& W) { return round4((W.cols + 127) / 128); }

bool cublaslt_shape_ok(const WeightView& W, int64_t row_begin, int64_t row_end) {
#if DSV4_LT_BLOCK_SCALING
  if (W.fmt != GemmFormat::fp8 || W.block_rows != 128 || W.block_cols != 128) return false;
  if (W.rows <= 0 || W.cols <= 0 || W.rows % 128 != 0 || W.cols % 128 != 0 || (W.cols / 128) % 4 != 0) return false;
  if (W.cols > (int64_t(1) << 30) || W.rows > (int64_t(1) << 30)) return false;
  if (row_begin < 0 || row_end > W.rows || row_begin >= row_end) return false;
  return row_begin % 128 == 0 && (row_end - row_begin) % 128 == 0;
#else
  (void)W, (void)row_begin, (void)row_end;
  return false;
#endif
}

bool cublaslt_device_ok() {
#if DSV4_LT_BLOCK_SCALING
  static std::mutex mu;
  static std::map<int, bool> ok;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  std::lock_guard<std::mutex> lk(mu);
  auto it = ok.find(dev);
  if (it != ok.end()) return it->second;
  int major = 0, minor = 0;
  bool good = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
  if (!good) cudaGetLastError();
  good = good && major == 9 && minor == 0;  // the 1x128 / 128x128 block modes are Hopper-specific
  ok[dev] = good;
  return good;
#else
  return false;
#endif
}

size_t cublaslt_scratch_bytes(const WeightView& W, int64_t n_tok, int64_t nout) {
  const int64_t K = W.cols, M4 = round4(n_tok), nsb = (K + 127) / 128;
  size_t b = align256(size_t(M4 * K)) + align256(size_t(nsb * M4) * 4);
  if (M4 != n_tok) b += align256(size_t(M4 * nout) * 4);
  return b + kWorkspaceBytes;
}

#if DSV4_LT_BLOCK_SCALING
namespace {

struct Handles {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> h;
  struct Algo {
    bool ok = false;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int, int64_t, int64_t, int64_t>, Algo> algos;  // (device, N, M4, K)
};
Handles& handles() {
  static Handles* h = new Handles();  // never destroyed: cuBLASLt handles must not outlive the driver at exit
  return *h;
}

cublasLtHandle_t handle_for(int dev) {
  Handles& H = handles();
  std::lock_guard<std::mutex> lk(H.mu);
  auto it = H.h.find(dev);
  if (it != H.h.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) h = nullptr;
  H.h[dev] = h;
  return h;
}

struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace
#endif

bool cublaslt_linear(const WeightView& W, const float* x, int64_t n_tok, float* y, int64_t row_begin, int64_t nout,
                     bool out_bf16, void* scratch, cudaStream_t stream) {
#if DSV4_LT_BLOCK_SCALING
  if (n_tok <= 0 || W.aux == nullptr || scratch == nullptr) return false;
  if (!cublaslt_shape_ok(W, row_begin, row_begin + nout) || !cublaslt_device_ok()) return false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  cublasLtHandle_t h = handle_for(dev);
  if (h == nullptr) return false;

  const int64_t K = W.cols, M4 = round4(n_tok), nsb = K / 128;
  const bool direct = M4 == n_tok && (reinterpret_cast<uintptr_t>(y) & 15) == 0;
  if (M4 == n_tok && !direct) return false;  // no padded-output scratch was reserved for this case
  char* p = static_cast<char*>(scratch);
  uint8_t* q8 = reinterpret_cast<uint8_t*>(p);
  p += align256(size_t(M4 * K));
  float* s_t = reinterpret_cast<float*>(p);
  p += align256(size_t(nsb * M4) * 4);
  float* dout = y;
  if (!direct) {
    dout = reinterpret_cast<float*>(p);
    p += align256(size_t(M4 * nout) * 4);
  }
  void* ws = p;

  Descs ds;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int32_t mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;  // weights
  const int32_t mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;      // activations
  const void* scale_a = static_cast<const float*>(W.aux) + (row_begin / 128) * aux_scale_ld(W);
  const void* scale_b = s_t;
  const void* a_ptr = W.w + row_begin * K;
  const size_t ws_bytes = kWorkspaceBytes;
  bool good = cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t n) {
    good = good && cublasLtMatmulDescSetAttribute(ds.op, attr, v, n) == CUBLAS_STATUS_SUCCESS;
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a));
  set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b));
  set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_a, sizeof(scale_a));
  set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_b, sizeof(scale_b));
  good = good && cublasLtMatrixLayoutCreate(&ds.a, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(nout), K) ==
                     CUBLAS_STATUS_SUCCESS;
  good = good && cublasLtMatrixLayoutCreate(&ds.b, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(M4), K) ==
                     CUBLAS_STATUS_SUCCESS;
  good = good && cublasLtMatrixLayoutCreate(&ds.d, CUDA_R_32F, uint64_t(nout), uint64_t(M4), nout) ==
                     CUBLAS_STATUS_SUCCESS;
  good = good && cublasLtMatmulPreferenceCreate(&ds.pref) == CUBLAS_STATUS_SUCCESS;
  good = good && cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                      sizeof(ws_bytes)) == CUBLAS_STATUS_SUCCESS;
  if (!good) return false;

  // Algorithm: cached per (device, N, M4, K); a failed query is cached too (then the SIMT path runs).
  Handles::Algo algo;
  {
    Handles& H = handles();
    const auto key = std::make_tuple(dev, nout, M4, K);
    std::lock_guard<std::mutex> lk(H.mu);
    auto it = H.algos.find(key);
    if (it != H.algos.end()) {
      algo = it->second;
    } else {
      cublasLtMatmulHeuristicResult_t res{};
      int n = 0;
      const cublasStatus_t st =
          cublasLtMatmulAlgoGetHeuristic(h, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, 1, &res, &n);
      algo.ok = st == CUBLAS_STATUS_SUCCESS && n > 0 && res.state == CUBLAS_STATUS_SUCCESS;
      if (algo.ok) algo.algo = res.algo;
      H.algos[key] = algo;
    }
  }
  if (!algo.ok) return false;

  act_quant_e4m3(x, n_tok, M4, K, q8, s_t, stream);
  if (cudaGetLastError() != cudaSuccess) return false;
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(h, ds.op, &alpha, a_ptr, ds.a, q8, ds.b, &beta, dout, ds.d, dout, ds.d,
                                           &algo.algo, ws, ws_bytes, stream);
  if (st != CUBLAS_STATUS_SUCCESS) return false;
  if (!direct)
    finish_rows(dout, n_tok, nout, out_bf16, y, stream);
  else if (out_bf16)
    finish_rows(y, n_tok, nout, true, y, stream);
  return true;
#else
  (void)W, (void)x, (void)n_tok, (void)y, (void)row_begin, (void)nout, (void)out_bf16, (void)scratch, (void)stream;
  return false;
#endif
}

}  // namespace dsv4::cuda::gemm_internal
