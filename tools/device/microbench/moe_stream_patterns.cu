// Microbenchmark (issue 9): how fast the weight-streaming patterns of moe_tc_small_kernel (k_gemm.cu) read HBM,
// with no arithmetic: P1 the old items (16 rows x 64 bytes per matrix, two matrices as w1 / w3), P2 items of 128 /
// 256 contiguous bytes per row, P3 128-byte items issued as 8 rows x 64 bytes per instruction (gemv_tc_kernel's
// pattern), P4 plain 16-byte loads. 244 experts (batch-128 decode: 2 GB) and 6 experts (batch 1: 50 MB).
// Not built by CMake. Build and run (the GPU machine has no compiler-free path; build here with CUDA 12+):
//   nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -o /tmp/moe_stream_patterns tools/device/microbench/moe_stream_patterns.cu
//   /tmp/moe_stream_patterns
// Result on an H100 (2026-12-07): bench/results/microbench-moe-stream-patterns-h100-20261207.txt
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#include "backend/cuda/device_async_copy.cuh"
using namespace dsv4::cuda;
constexpr int ROWB = 2048;          // bytes per weight row (K = 4096 fp4)
constexpr int EXP_ROWS = 2048;      // rows per matrix per expert (w1 / w3)
constexpr int NT = EXP_ROWS / 16;   // tiles per expert
// P1: current: item = 16 rows x 64 B per matrix (2 matrices), warps split the row in kbw=4 items each; ring PF
template <int PF, int KBI, int MODE = 0>  // KBI: kb (64 B blocks) per item; MODE 1: 8 rows x 64 B per instruction
__global__ void __launch_bounds__(256, 2) p1(const uint8_t* w, int n_exp, int n_bt, int tiles_per_blk, uint32_t* out) {
  extern __shared__ __align__(16) uint8_t sm[];
  constexpr int SB = 2 * 16 * 64 * KBI;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = blockIdx.x % n_exp, bt = blockIdx.x / n_exp;
  const uint8_t* e1 = w + size_t(slot) * 2 * EXP_ROWS * ROWB;
  const uint8_t* e3 = e1 + size_t(EXP_ROWS) * ROWB;
  uint8_t* ring = sm + warp * PF * SB;
  const int kbw = 32 / 8 / KBI;  // items per warp per tile
  int n_items = 0;
  for (int t = bt; t < NT && n_items < tiles_per_blk * kbw; t += n_bt) n_items += kbw;
  int l_tile = bt, l_kb = 0;
  auto fill = [&](uint8_t* st) {
    if (l_tile < NT) {
      for (int q = 0; q < 2; ++q) {
        const uint8_t* m = q ? e3 : e1;
        // KBI*64 bytes per row: lanes cover rows x chunks
        constexpr int CH = KBI * 4;  // 16-byte chunks per row
        for (int i = lane; i < 16 * CH; i += 32) {
          int r = i / CH, c = i % CH;
          if (MODE == 1) { const int k = i / 32; r = (lane >> 2) + 8 * (k & 1); c = (lane & 3) + 4 * (k >> 1); }
          cp16(st + q * 16 * 64 * KBI + r * 64 * KBI + 16 * c,
               m + size_t(l_tile * 16 + r) * ROWB + (warp * 4 + l_kb * KBI) * 64 + 16 * c);
        }
      }
    }
    cp_commit();
    if (++l_kb == kbw) l_kb = 0, l_tile += n_bt;
  };
  for (int i = 0; i < PF; ++i) fill(ring + i * SB);
  uint32_t acc = 0; int s = 0;
  for (int it = 0; it < n_items; ++it) {
    cp_wait<PF - 1>(); __syncwarp();
    uint32_t r[4];
    for (int j = 0; j < 2 * KBI; ++j) { ldsm_x4(ring + s * SB + j * 1024 + (lane & 15) * 64 + 16 * (lane >> 4), r); acc ^= r[0] ^ r[1] ^ r[2] ^ r[3]; }
    __syncwarp();
    fill(ring + s * SB);
    s = s + 1 == PF ? 0 : s + 1;
  }
  cp_wait<0>();
  out[blockIdx.x * 256 + threadIdx.x] = acc;
}
// P4: plain 16-byte loads, grid-stride, 4 in flight per thread
__global__ void __launch_bounds__(256) p4(const uint4* w, size_t n, uint32_t* out) {
  uint32_t acc = 0;
  size_t i = blockIdx.x * 256 + threadIdx.x, st = size_t(gridDim.x) * 256;
  for (; i + 3 * st < n; i += 4 * st) {
    uint4 a = __ldcs(w + i), b = __ldcs(w + i + st), c = __ldcs(w + i + 2 * st), d = __ldcs(w + i + 3 * st);
    acc ^= a.x ^ b.y ^ c.z ^ d.w ^ a.w ^ b.x ^ c.y ^ d.z;
  }
  for (; i < n; i += st) acc ^= w[i].x;
  out[blockIdx.x * 256 + threadIdx.x] = acc;
}
template <class F> float timeit(F f, int reps) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  f(); cudaDeviceSynchronize();
  cudaEventRecord(a); for (int i = 0; i < reps; ++i) f(); cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b); return ms / reps;
}
int main() {
  const int n_big = 244;  size_t bytes = size_t(n_big) * 2 * EXP_ROWS * ROWB;
  uint8_t* w; cudaMalloc(&w, bytes); cudaMemset(w, 1, bytes);
  uint32_t* out; cudaMalloc(&out, 64 << 20);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  auto run_p1 = [&](auto kern, int pf, int kbi, int n_exp, int n_bt, const char* name) {
    const int smem = 8 * pf * 2 * 16 * 64 * kbi;
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    int occ = 0; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 256, smem);
    const int tpb = (NT + n_bt - 1) / n_bt;
    float ms = timeit([&] { kern<<<n_exp * n_bt, 256, smem>>>(w, n_exp, n_bt, tpb, out); }, 20);
    const double b = double(n_exp) * 2 * EXP_ROWS * ROWB;
    printf("%-34s experts %3d grid %5d occ %d: %8.1f us %7.0f GB/s (err %s)\n", name, n_exp, n_exp * n_bt, occ, ms * 1e3, b / ms / 1e6,
           cudaGetErrorString(cudaGetLastError()));
  };
  for (int n_exp : {244, 6}) {
    const int n_bt = n_exp == 6 ? 44 : 16;
    run_p1(p1<3, 1>, 3, 1, n_exp, n_bt, "P1 current (PF3, 64B/row/item)");
    run_p1(p1<4, 1>, 4, 1, n_exp, n_bt, "P1 PF4");
    run_p1(p1<6, 1>, 6, 1, n_exp, n_bt, "P1 PF6");
    run_p1(p1<2, 2>, 2, 2, n_exp, n_bt, "P2 (PF2, 128B/row/item)");
    run_p1(p1<3, 2>, 3, 2, n_exp, n_bt, "P2 PF3 128B");
    run_p1(p1<2, 4>, 2, 4, n_exp, n_bt, "P2 PF2 256B");
    run_p1(p1<2, 2, 1>, 2, 2, n_exp, n_bt, "P3 PF2 128B/item, 64B/instr");
    run_p1(p1<3, 2, 1>, 3, 2, n_exp, n_bt, "P3 PF3 128B/item, 64B/instr");
    const size_t b = size_t(n_exp) * 2 * EXP_ROWS * ROWB;
    for (int g : {sms * 2, sms * 4, sms * 8}) {
      float ms = timeit([&] { p4<<<g, 256>>>(reinterpret_cast<const uint4*>(w), b / 16, out); }, 20);
      printf("P4 plain ldg grid %5d                      : %8.1f us %7.0f GB/s\n", g, ms * 1e3, b / ms / 1e6);
    }
  }
  return 0;
}
