// cuBLAS BF16 tensor-core GEMMs for products that are exact in BF16 (fp32 accumulation in cuBLAS's order: the fast
// mode's tolerance). Three users:
// * Large (prefill) MoE calls of FP4 experts in the fast (Q) mode (moe_run, k_moe.cu). In (Q) every expert product
//   is exact in BF16: an FP4 weight times its E8M0 scale (2 significant bits times a power of two) and an
//   activation's e4m3 code times its power-of-two act_quant scale (4 significant bits) are both BF16 values, so a
//   BF16 GEMM with fp32 accumulation sums the reference's products, in cuBLAS's order. Per call:
//   1. the segment starts (sorted rows per expert) come to the host: one stream synchronization (never while the
//      stream is being captured: moe_bf16_ok());
//   2. A [rows, D] = bf16(code * scale) of every sorted row's token (gathered through row_tok);
//   3. for chunks of kChunk experts: w1 | w3 of each dequantized to BF16 [2 I, D], then per expert one GEMM
//      G [cnt, 2 I] = A_e W13_e^T (fp32, into the caller's o buffer, which is [rows, D] >= [rows, 2 I]);
//   4. h = SwiGLU(bf16(g), bf16(u)) * routing weight (bf16 when bf16), as the decode kernels' epilogue;
//   5. (the caller) act_quant of h; then A [rows, I] = bf16(code * scale) of h and per expert o = A_e W2_e^T,
//      bf16-rounded when out_bf16.
// * The grouped output projection wo_a of calls of kGroupedMinTok or more tokens (linear_grouped_bf16: FP8 weight
//   as bf16(code * scale) -- the reference's FP8 -> BF16 weight -- times the bf16-valued activations, the
//   reference's bf16 einsum; one strided-batched GEMM over the groups).
// * BF16-weight linears of bf16-valued activations (LinearOpts::x_bf16: the head, the router gate, the compressors'
//   wkv / wgate, the indexer's weights_proj in reference numerics) of kLinearMinTok or more tokens (linear_bf16): the
//   reference's fp32 F.linear of bf16 values has the same exact products.
// The last two also run inside recorded decode steps (CUDA graphs): every cuBLAS call gets its workspace from the
// caller's scratch (cuBLAS then never allocates, and two streams never share a workspace).
// Results differ from the CPU's order by fp32 rounding only; they depend on the shapes (cuBLAS picks its kernel by
// shape), so these paths are not batch invariant, as cuBLASLt's linears are not.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/device_numeric.cuh"
#include "backend/cuda/device_swiglu.cuh"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/kernels.h"

namespace dsv4::cuda::gemm_internal {
namespace {

constexpr int kChunk = 8;             // experts dequantized at a time
constexpr int64_t kMinPairs = 4096;   // (token, slot) pairs from which a call takes this path

inline size_t align256(size_t b) { return (b + 255) & ~size_t(255); }

cublasHandle_t handle_for_device() {
  static std::mutex mu;
  static std::map<int, cublasHandle_t>* handles = new std::map<int, cublasHandle_t>();  // never destroyed
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return nullptr;
  std::lock_guard<std::mutex> lk(mu);
  auto it = handles->find(dev);
  if (it != handles->end()) return it->second;
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) h = nullptr;
  (*handles)[dev] = h;
  return h;
}

// The device's handle bound to `stream` with the workspace [ws, ws + bytes) (256-aligned; set on every call, since
// a handle keeps the last one), or nullptr when there is no handle.
constexpr size_t kCublasWsBytes = size_t(4) << 20;
cublasHandle_t bound_handle(cudaStream_t stream, void* ws, size_t bytes) {
  cublasHandle_t h = handle_for_device();
  if (h == nullptr) return nullptr;
  if (cublasSetStream(h, stream) != CUBLAS_STATUS_SUCCESS || cublasSetWorkspace(h, ws, bytes) != CUBLAS_STATUS_SUCCESS)
    fail_msg("cuBLAS: cannot bind the stream and workspace");
  return h;
}

// A[r, k] = bf16(q[src, k] * s[src, k / 128]), src = row_tok ? row_tok[r] : r (exact: see the file comment). A thread
// converts 4 columns (K % 128 == 0) and stores them as one 8-byte word.
__global__ void gather_dequant_kernel(const float* q, const float* s, int64_t K, const int32_t* row_tok, int64_t rows,
                                      __nv_bfloat16* A) {
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i >= rows * K) return;
  const int64_t r = i / K, k = i - r * K, src = row_tok ? row_tok[r] : r, nkb = K / 128;
  const float sc = s[src * nkb + k / 128];
  const float4 v = *reinterpret_cast<const float4*>(q + src * K + k);
  __nv_bfloat162 lo = __floats2bfloat162_rn(__fmul_rn(v.x, sc), __fmul_rn(v.y, sc));
  __nv_bfloat162 hi = __floats2bfloat162_rn(__fmul_rn(v.z, sc), __fmul_rn(v.w, sc));
  uint2 w;
  w.x = *reinterpret_cast<uint32_t*>(&lo);
  w.y = *reinterpret_cast<uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(A + i) = w;
}

struct DqChunk {
  const uint8_t* w[2 * kChunk];      // FP4 matrices [rows, cols] (two per expert for w1 | w3, else one)
  const uint8_t* scale[2 * kChunk];  // their E8M0 scales [rows, cols / 32]
};

// out[m][r, c] = bf16(e2m1(w_m[r, c]) * e8m0(scale_m[r, c / 32])) for matrices m < n_mat, each [rows, cols],
// out[m] at out + m * rows * cols (exact). A thread converts 8 columns (4 bytes of codes, cols % 32 == 0: one
// scale) and stores them as one 16-byte word (8 separate 2-byte stores ran at ~180 GB/s).
__global__ void dequant_fp4_kernel(DqChunk ch, int n_mat, int64_t rows, int64_t cols, __nv_bfloat16* out) {
  const int m = blockIdx.y;
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;  // 8 columns = 4 bytes
  if (m >= n_mat || i >= rows * cols) return;
  const int64_t r = i / cols, c = i - r * cols;
  const uint32_t b = __ldg(reinterpret_cast<const uint32_t*>(ch.w[m] + i / 2));
  const float sc = e8m0_to_float(ch.scale[m][r * (cols / 32) + c / 32]);
  uint32_t packed[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    __nv_bfloat162 p = __floats2bfloat162_rn(__fmul_rn(e2m1_to_float((b >> (8 * j)) & 0xFu), sc),
                                             __fmul_rn(e2m1_to_float((b >> (8 * j + 4)) & 0xFu), sc));
    packed[j] = *reinterpret_cast<uint32_t*>(&p);
  }
  *reinterpret_cast<uint4*>(out + int64_t(m) * rows * cols + i) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// h[r, i] = swiglu(G[r, i], G[r, I + i]) as moe_w13's epilogue (store_out<kW13>).
__global__ void swiglu_g_kernel(const float* G, int64_t rows, int64_t I, const float* row_w, float limit, bool out_bf16,
                                bool bf16, float* h) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * I) return;
  const int64_t r = i / I, c = i % I;
  const float g0 = G[r * 2 * I + c], u0 = G[r * 2 * I + I + c];
  const float g = out_bf16 ? round_bf16(g0) : g0, u = out_bf16 ? round_bf16(u0) : u0;
  h[i] = swiglu_val(g, u, limit, true, row_w[r], bf16);
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_msg(std::string("cuBLAS BF16 tensor cores: ") + what + ": " + cudaGetErrorString(e));
}

// Y [cnt, N] = A [cnt, K] W^T, W [N, K] row-major bf16, fp32 out (column-major view: Y^T = W A^T).
void gemm(cublasHandle_t hd, const __nv_bfloat16* W, const __nv_bfloat16* A, int64_t cnt, int64_t N, int64_t K,
          float* Y) {
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t st =
      cublasGemmEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(cnt), int(K), &one, W, CUDA_R_16BF, int(K), A,
                   CUDA_R_16BF, int(K), &zero, Y, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) fail_msg("cuBLAS BF16 tensor cores: cublasGemmEx failed");
}

// The experts with rows, in id order, from the host copy of the segment starts.
std::vector<int> active_experts(const std::vector<int32_t>& seg) {
  std::vector<int> a;
  for (size_t e = 0; e + 1 < seg.size(); ++e)
    if (seg[e + 1] > seg[e]) a.push_back(int(e));
  return a;
}

}  // namespace

namespace {
std::atomic<int64_t> g_taken{0};
std::atomic<const char*> g_refused{"no call yet"};
const char* refusal(const MoeGemmArgs& g, cudaStream_t stream) {
  if (!g.quant || g.fmt != GemmFormat::fp4) return "not FP4 experts in (Q)";
  if (deterministic() || gemm_path() != GemmPath::auto_) return "deterministic mode or a forced GEMM path";
  if (g.n_rows_bound < kMinPairs) return "fewer than 4096 (token, slot) pairs";
  if (2 * g.inter > g.d_model || g.d_model % 128 != 0 || g.inter % 128 != 0) return "expert shape";
  if (!g.words_ok) return "weights not 4-byte aligned";
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
    return "stream being captured";
  if (handle_for_device() == nullptr) return "no cuBLAS handle";
  return nullptr;
}
}  // namespace

bool moe_bf16_ok(const MoeGemmArgs& g, cudaStream_t stream) {
  const char* why = refusal(g, stream);
  if (why != nullptr) {
    if (g.n_rows_bound >= kMinPairs) g_refused.store(why);  // (decode-sized calls are not news)
    return false;
  }
  g_taken.fetch_add(1);
  return true;
}
}  // namespace dsv4::cuda::gemm_internal

namespace dsv4::cuda {
MoePrefillTcStats moe_prefill_tc_stats() { return {gemm_internal::g_taken.load(), gemm_internal::g_refused.load()}; }
}  // namespace dsv4::cuda

namespace dsv4::cuda::gemm_internal {

size_t moe_bf16_scratch_bytes(GemmFormat fmt, bool quant, int64_t P, int64_t D, int64_t I) {
  if (!quant || fmt != GemmFormat::fp4 || P < kMinPairs || 2 * I > D) return 0;
  return align256(size_t(P * std::max(D, I)) * 2) + align256(size_t(kChunk) * size_t(2 * I * D) * 2) + kCublasWsBytes;
}

void moe_bf16_w13(const MoeGemmArgs& g, const ExpertView* experts, const float* qx, const float* sx, float limit,
                  bool bf16, float* h, float* G, void* ws, std::vector<int32_t>& seg, cudaStream_t stream) {
  const int64_t E = g.n_experts, D = g.d_model, I = g.inter;
  seg.assign(size_t(E + 1), 0);
  check_cuda(cudaMemcpyAsync(seg.data(), g.seg_start, size_t(E + 1) * 4, cudaMemcpyDeviceToHost, stream),
             "segment starts");
  check_cuda(cudaStreamSynchronize(stream), "segment starts");
  const int64_t rows = seg[size_t(E)];
  if (rows <= 0) return;
  __nv_bfloat16* A = static_cast<__nv_bfloat16*>(ws);
  __nv_bfloat16* Wb = reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(ws) + align256(size_t(g.n_rows_bound * std::max(D, I)) * 2));
  gather_dequant_kernel<<<unsigned((rows * D / 4 + 255) / 256), 256, 0, stream>>>(qx, sx, D, g.row_tok, rows, A);
  cublasHandle_t hd = bound_handle(stream, Wb + kChunk * 2 * I * D, kCublasWsBytes);
  const std::vector<int> act = active_experts(seg);
  for (size_t c0 = 0; c0 < act.size(); c0 += kChunk) {
    const int n = int(std::min<size_t>(kChunk, act.size() - c0));
    DqChunk ch{};
    for (int j = 0; j < n; ++j) {  // expert j of the chunk: w1 rows then w3 rows, [2 I, D]
      const ExpertView& ev = experts[act[c0 + size_t(j)]];
      ch.w[2 * j] = ev.w1.w, ch.scale[2 * j] = ev.w1.scale;
      ch.w[2 * j + 1] = ev.w3.w, ch.scale[2 * j + 1] = ev.w3.scale;
    }
    dequant_fp4_kernel<<<dim3(unsigned((I * D / 8 + 255) / 256), unsigned(2 * n)), 256, 0, stream>>>(ch, 2 * n, I, D,
                                                                                                     Wb);
    for (int j = 0; j < n; ++j) {
      const int e = act[c0 + size_t(j)];
      const int64_t r0 = seg[size_t(e)], cnt = seg[size_t(e) + 1] - r0;
      gemm(hd, Wb + int64_t(j) * 2 * I * D, A + r0 * D, cnt, 2 * I, D, G + r0 * 2 * I);
    }
  }
  swiglu_g_kernel<<<unsigned((rows * I + 255) / 256), 256, 0, stream>>>(G, rows, I, g.row_w, limit, g.out_bf16, bf16,
                                                                        h);
  check_cuda(cudaGetLastError(), "w1 / w3");
}

void moe_bf16_w2(const MoeGemmArgs& g, const ExpertView* experts, const float* qh, const float* sh, float* o, void* ws,
                 const std::vector<int32_t>& seg, cudaStream_t stream) {
  const int64_t E = g.n_experts, D = g.d_model, I = g.inter;
  const int64_t rows = seg[size_t(E)];
  if (rows <= 0) return;
  __nv_bfloat16* A = static_cast<__nv_bfloat16*>(ws);
  __nv_bfloat16* Wb = reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(ws) + align256(size_t(g.n_rows_bound * std::max(D, I)) * 2));
  gather_dequant_kernel<<<unsigned((rows * I / 4 + 255) / 256), 256, 0, stream>>>(qh, sh, I, nullptr, rows, A);
  cublasHandle_t hd = bound_handle(stream, Wb + kChunk * 2 * I * D, kCublasWsBytes);  // (w2 chunks: 2 kChunk x D I)
  const std::vector<int> act = active_experts(seg);
  for (size_t c0 = 0; c0 < act.size(); c0 += 2 * kChunk) {  // w2 is half of w1 | w3: twice the experts per chunk
    const int n = int(std::min<size_t>(2 * kChunk, act.size() - c0));
    DqChunk ch{};
    for (int j = 0; j < n; ++j) {
      const ExpertView& ev = experts[act[c0 + size_t(j)]];
      ch.w[j] = ev.w2.w, ch.scale[j] = ev.w2.scale;
    }
    dequant_fp4_kernel<<<dim3(unsigned((D * I / 8 + 255) / 256), unsigned(n)), 256, 0, stream>>>(ch, n, D, I, Wb);
    for (int j = 0; j < n; ++j) {
      const int e = act[c0 + size_t(j)];
      const int64_t r0 = seg[size_t(e)], cnt = seg[size_t(e) + 1] - r0;
      gemm(hd, Wb + int64_t(j) * D * I, A + r0 * I, cnt, D, I, o + r0 * D);
    }
  }
  if (g.out_bf16) finish_rows(o, rows, D, true, o, stream);
  check_cuda(cudaGetLastError(), "w2");
}

// ---- grouped wo_a (prefill) -------------------------------------------------------------------------------------
namespace {
constexpr int64_t kGroupedMinTok = 9;  // (1..8 tokens: gemv_tc16_kernel, linear_grouped in k_gemm.cu)
constexpr int64_t kLinearMinTok = 9;   // (1..8 tokens: the gemv decode kernel)

// out[r, c] = bf16(e4m3(w[r, c]) * scale[r / br, c / bc]), 8 columns per thread (cols % 8 == 0), one 16-byte store.
__global__ void dequant_fp8_kernel(const uint8_t* w, const uint8_t* scale, bool scale_f32, int64_t rows, int64_t cols,
                                   int64_t br, int64_t bc, __nv_bfloat16* out) {
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i - r * cols, sc_cols = (cols + bc - 1) / bc;
  const int64_t si = (r / br) * sc_cols + c / bc;  // 8 columns never straddle a block (bc % 8 == 0)
  const float sc = scale_f32 ? reinterpret_cast<const float*>(scale)[si] : e8m0_to_float(scale[si]);
  const uint2 b = __ldg(reinterpret_cast<const uint2*>(w + i));
  uint32_t packed[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t word = j < 2 ? b.x : b.y, sh = 16 * (j & 1);
    __nv_bfloat162 p = __floats2bfloat162_rn(__fmul_rn(e4m3_to_float(uint8_t(word >> sh)), sc),
                                             __fmul_rn(e4m3_to_float(uint8_t(word >> (sh + 8))), sc));
    packed[j] = *reinterpret_cast<uint32_t*>(&p);
  }
  *reinterpret_cast<uint4*>(out + i) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// out[i] = bf16(x[i]) (x bf16-valued: exact), 4 per thread.
__global__ void to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* out) {
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i >= n) return;
  const float4 v = *reinterpret_cast<const float4*>(x + i);
  __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 o;
  o.x = *reinterpret_cast<uint32_t*>(&lo);
  o.y = *reinterpret_cast<uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(out + i) = o;
}

bool grouped_ok(const WeightView& W, int64_t n_tok, int64_t groups, const LinearOpts& o) {
  if (n_tok < kGroupedMinTok || groups < 1 || deterministic() || gemm_path() != GemmPath::auto_) return false;
  if (W.fmt != GemmFormat::fp8 || !o.weight_as_bf16 || !o.out_bf16 || o.act_quant_fp8) return false;
  if (W.rows % groups != 0 || o.row_begin != 0 || (o.row_end != -1 && o.row_end != W.rows)) return false;
  if (W.cols % 8 != 0 || W.block_cols % 8 != 0 || W.block_rows <= 0 || (n_tok * W.cols) % 4 != 0) return false;
  if (W.rows * W.cols > (int64_t(1) << 31) || n_tok * groups > (int64_t(1) << 31) / W.cols) return false;
  if ((reinterpret_cast<uintptr_t>(W.w) & 7) != 0) return false;
  return true;
}
}  // namespace

size_t linear_grouped_bf16_bytes(const WeightView& W, int64_t n_tok, int64_t groups, const LinearOpts& o) {
  if (!grouped_ok(W, n_tok, groups, o)) return 0;
  return align256(size_t(W.rows * W.cols) * 2) + align256(size_t(groups * n_tok * W.cols) * 2) + kCublasWsBytes;
}

bool linear_grouped_bf16(const WeightView& W, const float* x, int64_t n_tok, int64_t groups, float* y,
                       const LinearOpts& o, void* scratch, cudaStream_t stream) {
  if (!grouped_ok(W, n_tok, groups, o) || (reinterpret_cast<uintptr_t>(x) & 15) != 0) return false;
  if (handle_for_device() == nullptr) return false;
  const int64_t R = W.rows / groups, K = W.cols;
  char* sp = static_cast<char*>(scratch);
  __nv_bfloat16* Wb = reinterpret_cast<__nv_bfloat16*>(sp);
  __nv_bfloat16* xb = reinterpret_cast<__nv_bfloat16*>(sp + align256(size_t(W.rows * K) * 2));
  void* cws = sp + align256(size_t(W.rows * K) * 2) + align256(size_t(groups * n_tok * K) * 2);
  dequant_fp8_kernel<<<unsigned((W.rows * K / 8 + 255) / 256), 256, 0, stream>>>(W.w, W.scale, W.scale_f32, W.rows, K,
                                                                                W.block_rows, W.block_cols, Wb);
  to_bf16_kernel<<<unsigned((groups * n_tok * K / 4 + 255) / 256), 256, 0, stream>>>(x, groups * n_tok * K, xb);
  check_cuda(cudaGetLastError(), "wo_a dequantization");
  cublasHandle_t hd = bound_handle(stream, cws, kCublasWsBytes);
  // group g: y[g] [n, R] = x[g] [n, K] W[g R : (g+1) R]^T (column-major: y[g]^T = W_g x[g]^T)
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t st = cublasGemmStridedBatchedEx(
      hd, CUBLAS_OP_T, CUBLAS_OP_N, int(R), int(n_tok), int(K), &one, Wb, CUDA_R_16BF, int(K), (long long)(R * K), xb,
      CUDA_R_16BF, int(K), (long long)(n_tok * K), &zero, y, CUDA_R_32F, int(R), (long long)(n_tok * R), int(groups),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) fail_msg("linear_grouped (bf16 tensor cores): cublasGemmStridedBatchedEx failed");
  finish_rows(y, groups * n_tok, R, true, y, stream);  // out_bf16
  check_cuda(cudaGetLastError(), "wo_a");
  note_path(GemmPath::cublaslt);  // (the vendor library's GEMM)
  return true;
}

// ---- BF16-weight linears of bf16-valued activations ----------------------------------------------------------------
namespace {
bool bf16_linear_ok(const WeightView& W, int64_t n_tok, const LinearOpts& o) {
  if (n_tok < kLinearMinTok || !o.x_bf16 || deterministic() || gemm_path() != GemmPath::auto_) return false;
  if (W.fmt != GemmFormat::bf16 || o.act_quant_fp8 || W.cols % 8 != 0 || (reinterpret_cast<uintptr_t>(W.w) & 15) != 0)
    return false;
  const int64_t r1 = o.row_end < 0 ? W.rows : o.row_end;
  if (o.row_begin < 0 || r1 > W.rows || o.row_begin >= r1) return false;
  return W.cols < (int64_t(1) << 31) && r1 - o.row_begin < (int64_t(1) << 31) && n_tok * W.cols < (int64_t(1) << 40);
}
}  // namespace

size_t linear_bf16_bytes(const WeightView& W, int64_t n_tok, const LinearOpts& o) {
  if (!bf16_linear_ok(W, n_tok, o)) return 0;
  return align256(size_t(n_tok * W.cols) * 2) + kCublasWsBytes;
}

bool linear_bf16(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o, void* scratch,
                 cudaStream_t stream) {
  if (!bf16_linear_ok(W, n_tok, o) || scratch == nullptr || (reinterpret_cast<uintptr_t>(x) & 15) != 0) return false;
  if (handle_for_device() == nullptr) return false;
  const int64_t K = W.cols, r0 = o.row_begin, nout = (o.row_end < 0 ? W.rows : o.row_end) - r0;
  char* sp = static_cast<char*>(scratch);
  __nv_bfloat16* xb = reinterpret_cast<__nv_bfloat16*>(sp);
  to_bf16_kernel<<<unsigned((n_tok * K / 4 + 255) / 256), 256, 0, stream>>>(x, n_tok * K, xb);  // exact (x_bf16)
  check_cuda(cudaGetLastError(), "linear (bf16 tensor cores): x to bf16");
  cublasHandle_t hd = bound_handle(stream, sp + align256(size_t(n_tok * K) * 2), kCublasWsBytes);
  gemm(hd, reinterpret_cast<const __nv_bfloat16*>(W.w) + r0 * K, xb, n_tok, nout, K, y);
  if (o.out_bf16) finish_rows(y, n_tok, nout, true, y, stream);
  check_cuda(cudaGetLastError(), "linear (bf16 tensor cores)");
  note_path(GemmPath::cublaslt);
  return true;
}

}  // namespace dsv4::cuda::gemm_internal
