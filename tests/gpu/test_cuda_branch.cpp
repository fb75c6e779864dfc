// Ops::branch_* on the CUDA backend (cuda_ops.cpp): ops queued in a branch run on a second stream concurrently with
// the ops queued after branch_end(); the results must equal the same ops queued in order, bitwise, and the branch's
// released scratch must not be handed to the main stream's ops before branch_join().
#include <cstdio>
#include <cstring>
#include <memory>

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
