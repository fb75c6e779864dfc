// Ops::branch_* on the CUDA backend (cuda_ops.cpp): ops queued in a branch run on a second stream concurrently with
// the ops queued after branch_end(); the results must equal the same ops queued in order, bitwise, and the branch's
// released scratch must not be handed to the main stream's ops before branch_join().
#include <cstdio>
#include <cstring>
#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm_path.h"
#include "core/error.h"
#include "gpu_test_util.h"

namespace dsv4::test::gpu {
namespace {

struct DevW {
  std::vector<Buffer> storage;
  WeightView v;
};
std::unique_ptr<DevW> upload_w(const HostWeight& h) {
  auto d = std::make_unique<DevW>();
  d->v = cuda()->upload(h.view, d->storage);
  return d;
}

size_t count_diff(const std::vector<float>& a, const std::vector<float>& b) {
  size_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], 4) != 0;
  return d;
}

// Two FP8 linears of 64 tokens (cuBLASLt with workspace scratch for the quantized activations) and an RMSNorm of
// the branch's output after the join, against the same ops queued in order; 20 rounds (a missed dependency or a
// reused scratch shows up as a difference in some round).
TEST(CudaBranch, ConcurrentOpsEqualSerial) {
  DSV4_REQUIRE_GPU();
  Backend& be = *cuda();
  const Ops& g = be.ops();
  const int64_t n = 64, K = 4096, N1 = 4096, N2 = 1024;
  const HostWeight h1 = random_weight(GemmFormat::fp8, N1, K, 11), h2 = random_weight(GemmFormat::fp8, N2, K, 12);
  const auto w1 = upload_w(h1), w2 = upload_w(h2);
  const std::vector<float> x = randn(size_t(n * K), 13, 1.0f, true);
  const std::vector<float> nw = randn(size_t(N1), 14, 1.0f);
  Buffer dx = to_device(be, x), dnw = to_device(be, nw);
  LinearOpts Q;
  Q.act_quant_fp8 = true;
  Q.out_bf16 = true;

  Buffer s1 = out_buffer<float>(be, size_t(n * N1)), s2 = out_buffer<float>(be, size_t(n * N2));
  g.linear(w1->v, dx.as<float>(), n, s1.as<float>(), Q);
  g.rmsnorm(s1.as<float>(), n, N1, dnw.as<float>(), 1e-6f, true, s1.as<float>());
  g.linear(w2->v, dx.as<float>(), n, s2.as<float>(), Q);
  const std::vector<float> ref1 = to_host<float>(be, s1, size_t(n * N1)), ref2 = to_host<float>(be, s2, size_t(n * N2));

  for (int round = 0; round < 20; ++round) {
    Buffer b1 = out_buffer<float>(be, size_t(n * N1)), b2 = out_buffer<float>(be, size_t(n * N2));
    {
      Workspace::Scope scope(be.workspace());
      g.branch_begin();
      g.linear(w1->v, dx.as<float>(), n, b1.as<float>(), Q);  // side stream
      g.branch_end();
      g.linear(w2->v, dx.as<float>(), n, b2.as<float>(), Q);  // main stream, concurrently
      g.branch_join();
      g.rmsnorm(b1.as<float>(), n, N1, dnw.as<float>(), 1e-6f, true, b1.as<float>());  // reads the branch's output
    }
    const std::vector<float> got1 = to_host<float>(be, b1, size_t(n * N1)), got2 = to_host<float>(be, b2, size_t(n * N2));
    EXPECT_EQ(count_diff(ref1, got1), 0u) << "branch output (then rmsnorm after the join), round " << round;
    EXPECT_EQ(count_diff(ref2, got2), 0u) << "main-stream output, round " << round;
  }
  std::printf("[check] branch: fp8 linear %lldx%lld on the side stream || %lldx%lld on the main one, 64 tokens, "
              "20 rounds: bitwise equal to the serial order\n",
              (long long)N1, (long long)K, (long long)N2, (long long)K);
}

// The scratch an op of the branch used and released is never handed out again before branch_join().
TEST(CudaBranch, MainStreamScratchStartsPastTheBranch) {
  DSV4_REQUIRE_GPU();
  Backend& be = *cuda();
  const Ops& g = be.ops();
  Workspace& ws = be.workspace();
  Workspace::Scope scope(ws);
  g.branch_begin();
  char* p1 = nullptr;
  {
    Workspace::Scope inner(ws);  // as an op's own scratch: released when the op returns
    p1 = static_cast<char*>(ws.alloc_bytes(size_t(1) << 20));
  }
  g.branch_end();
  char* p2 = static_cast<char*>(ws.alloc_bytes(4096));
  EXPECT_TRUE(p2 + 4096 <= p1 || p2 >= p1 + (size_t(1) << 20)) << "main-stream scratch overlaps the branch's";
  g.branch_join();
  be.synchronize();
}

// The cuBLAS paths of batched decode steps (k_bf16_tc.cu, gemm_cublaslt.cpp) inside a recorded step: a BF16-weight
// linear of bf16-valued x (the compressor's wkv) on the side stream while the main stream runs a second one, the
// grouped wo_a and an FP8 linear of 16 tokens (cuBLASLt); each cuBLAS call has its own workspace from the scratch.
// Recorded into a CUDA graph and replayed three times: bitwise equal to the same ops launched eagerly in order.
TEST(CudaBranch, CublasCallsInABranchInsideARecordedGraph) {
  DSV4_REQUIRE_GPU();
  Backend& be = *cuda();
  const Ops& g = be.ops();
  const cudaStream_t st = static_cast<cuda::CudaBackend&>(be).stream();
  const int64_t n = 16, K = 4096, Nb = 1024, G = 8, R = 1024;
  const HostWeight hb1 = random_weight(GemmFormat::bf16, Nb, K, 21), hb2 = random_weight(GemmFormat::bf16, Nb, K, 22);
  const HostWeight ha = random_weight(GemmFormat::fp8, G * R, K, 23), hq = random_weight(GemmFormat::fp8, 2048, K, 24);
  const auto wb1 = upload_w(hb1), wb2 = upload_w(hb2), wa = upload_w(ha), wq = upload_w(hq);
  const std::vector<float> x = randn(size_t(n * K), 25, 1.0f, true), xg = randn(size_t(G * n * K), 26, 1.0f, true);
  Buffer dx = to_device(be, x), dxg = to_device(be, xg);
  LinearOpts B;
  B.x_bf16 = true;
  LinearOpts A;
  A.weight_as_bf16 = true;
  A.out_bf16 = true;
  LinearOpts Q;
  Q.act_quant_fp8 = true;
  Q.out_bf16 = true;
  Buffer y1 = out_buffer<float>(be, size_t(n * Nb)), y2 = out_buffer<float>(be, size_t(n * Nb)),
         ya = out_buffer<float>(be, size_t(G * n * R)), yq = out_buffer<float>(be, size_t(n * 2048));
  auto ops = [&](bool branch) {
    Workspace::Scope scope(be.workspace());
    if (branch) g.branch_begin();
    g.linear(wb1->v, dx.as<float>(), n, y1.as<float>(), B);
    if (branch) g.branch_end();
    g.linear(wb2->v, dx.as<float>(), n, y2.as<float>(), B);
    g.linear_grouped(wa->v, dxg.as<float>(), n, G, ya.as<float>(), A);
    g.linear(wq->v, dx.as<float>(), n, yq.as<float>(), Q);
    if (branch) g.branch_join();
  };
  auto read = [&]() {
    std::vector<float> all = to_host<float>(be, y1, size_t(n * Nb));
    for (const auto& [b, cnt] : {std::pair{&y2, n * Nb}, std::pair{&ya, G * n * R}, std::pair{&yq, n * 2048}}) {
      const std::vector<float> v = to_host<float>(be, *b, size_t(cnt));
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  ops(false);
  EXPECT_EQ(cuda::last_gemm_path(), cuda::gemm_internal::cublaslt_device_ok() ? cuda::GemmPath::cublaslt
                                                                             : cuda::GemmPath::simt);
  const std::vector<float> ref = read();
  be.synchronize();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed), cudaSuccess);
  ops(true);
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int round = 0; round < 3; ++round) {
    for (Buffer* b : {&y1, &y2, &ya, &yq}) cudaMemsetAsync(b->data(), 0xff, b->bytes(), st);  // NaN: stale data shows
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    be.synchronize();
    EXPECT_EQ(count_diff(ref, read()), 0u) << "replay " << round << " vs eager launches";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::printf("[check] cuBLAS in a recorded step: bf16 linear on the side stream || bf16 linear, grouped wo_a, fp8 "
              "linear of %lld tokens on the main one: 3 graph replays bitwise equal to eager launches\n", (long long)n);
}

TEST(CudaBranch, MisuseIsAnError) {
  DSV4_REQUIRE_GPU();
  const Ops& g = cuda()->ops();
  EXPECT_THROW(g.branch_end(), Error);
  EXPECT_THROW(g.branch_join(), Error);
  Workspace::Scope scope(cuda()->workspace());
  g.branch_begin();
  EXPECT_THROW(g.branch_begin(), Error);
  EXPECT_THROW(g.branch_join(), Error);  // before branch_end
  g.branch_end();
  g.branch_join();
  cuda()->synchronize();
}

}  // namespace
}  // namespace dsv4::test::gpu
