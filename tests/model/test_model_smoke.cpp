// Loading and basic sanity of the forward pass on the tiny official-format checkpoints.
#include <limits>

#include "backend/cpu_backend.h"
#include "loader/safetensors.h"

#include "model_test_util.h"

namespace dsv4::test {
namespace {

class Smoke : public ::testing::TestWithParam<std::tuple<std::string, Numerics>> {};

TEST_P(Smoke, FiniteLogitsAndSaneDistribution) {
  const auto& [name, num] = GetParam();
  const Model& m = tiny(name, num);
  const auto ids = random_ids(40, m.n_vocab(), 1);
  const auto lg = m.logits_all(ids);
  const int64_t V = m.n_vocab();
  ASSERT_EQ(lg.size(), ids.size() * size_t(V));
  for (size_t p = 0; p < ids.size(); ++p) {
    std::span<const float> row(&lg[p * size_t(V)], size_t(V));
    for (float v : row) ASSERT_TRUE(std::isfinite(v)) << "position " << p;
    const auto lp = log_softmax(row);
    const double mx = *std::max_element(lp.begin(), lp.end());
    EXPECT_GT(mx, -std::log(double(V)) + 1e-3) << "uniform distribution at " << p;  // not degenerate-uniform
  }
  // logits must depend on the input
  const auto ids2 = random_ids(40, m.n_vocab(), 2);
  const auto lg2 = m.logits_all(ids2);
  EXPECT_GT(max_abs_logprob_diff(std::span<const float>(&lg[39 * size_t(V)], size_t(V)),
                                 std::span<const float>(&lg2[39 * size_t(V)], size_t(V))),
            1e-3);
}

INSTANTIATE_TEST_SUITE_P(Tiny, Smoke,
                         ::testing::Combine(::testing::Values("tiny-a", "tiny-b"),
                                            ::testing::Values(Numerics::reference, Numerics::dense)));

TEST(ModelLoad, MissingFolderIsAnError) {
  EXPECT_THROW(Model::load(tiny_dir("does-not-exist")), dsv4::Error);
}

TEST(ModelLoad, BadTokenIdIsAnError) {
  const Model& m = tiny("tiny-a", Numerics::dense);
  ModelSequence seq(m);
  std::vector<float> lg(static_cast<size_t>(m.n_vocab()));
  std::vector<int32_t> bad{1, m.n_vocab()};
  EXPECT_THROW(seq.append(bad, lg), dsv4::Error);
  EXPECT_EQ(seq.n_past(), 0);
  std::vector<int32_t> neg{-1};
  EXPECT_THROW(seq.append(neg, lg), dsv4::Error);
}

}  // namespace
}  // namespace dsv4::test

namespace dsv4::test {
namespace {

// The CPU ops, but the head's logits turn into NaN while `poison` is set.
class PoisonOps final : public CpuOps {
 public:
  mutable bool poison = false;
  int64_t vocab = 0;
  void linear(const WeightView& W, const float* x, int64_t n, float* y, const LinearOpts& o) const override {
    CpuOps::linear(W, x, n, y, o);
    if (poison && W.rows == vocab) y[0] = std::numeric_limits<float>::quiet_NaN();
  }
  // the head's product: this class's linear(), then check_finite (the ops' default)
  void linear_check_finite(const WeightView& W, const float* x, int64_t n, float* y, const LinearOpts& o,
                           int32_t* bad) const override {
    Ops::linear_check_finite(W, x, n, y, o, bad);
  }
};
class PoisonBackend final : public CpuBackend {
 public:
  PoisonOps pops;
  const Ops& ops() const override { return pops; }
};

TEST(ModelErrors, NonFiniteLogitsThrowAndLeaveTheSequenceConsistent) {
  PoisonBackend be;
  PoisonOps& pops = be.pops;
  ModelOptions o;
  o.backend = &be;
  auto m = Model::load(tiny_dir("tiny-a"), o);
  pops.vocab = m->n_vocab();
  const auto ids = random_ids(20, m->n_vocab(), 5);
  ModelSequence seq(*m);
  std::vector<float> lg(static_cast<size_t>(m->n_vocab()));
  seq.append(std::span<const int32_t>(ids.data(), 10), lg);
  pops.poison = true;
  EXPECT_THROW(seq.append(std::span<const int32_t>(ids.data() + 10, 5), lg), dsv4::Error);
  pops.poison = false;
  EXPECT_EQ(seq.n_past(), 10);
  EXPECT_EQ(seq.state().n_past, 10);
  // continuing gives the same logits as an uninterrupted run
  seq.append(std::span<const int32_t>(ids.data() + 10, 10), lg);
  const auto cold = m->logits_all(ids);
  EXPECT_TRUE(std::equal(lg.begin(), lg.end(), cold.begin() + 19 * m->n_vocab()));
}

}  // namespace
}  // namespace dsv4::test

#include "loader/state_size.h"

namespace dsv4::test {
namespace {

TEST(ModelMemory, StateBytesMatchTheLoaderFormula) {
  for (const char* name : {"tiny-a", "tiny-b"}) {
    const Model& m = tiny(name, Numerics::dense);
    ModelSequence seq(m);
    std::vector<float> lg(static_cast<size_t>(m.n_vocab()));
    EXPECT_EQ(seq.state().bytes_used(m.config()), state_bytes_total(m.config(), 0)) << name;
    const auto ids = random_ids(261, m.n_vocab(), 6);
    seq.append(ids, lg);
    EXPECT_EQ(seq.state().bytes_used(m.config()), state_bytes_total(m.config(), 261)) << name;
    EXPECT_GE(seq.memory_bytes(), seq.state().bytes_used(m.config()));
  }
  // reference numerics on the CPU: compact rows, the loader formula's compact sizes (smaller)
  for (const char* name : {"tiny-a", "tiny-b"}) {
    const Model& m = tiny(name, Numerics::reference);
    ASSERT_EQ(m.state_rows(), RowFormat::compact);
    ModelSequence seq(m);
    std::vector<float> lg(static_cast<size_t>(m.n_vocab()));
    const auto ids = random_ids(261, m.n_vocab(), 6);
    seq.append(ids, lg);
    EXPECT_EQ(seq.state().bytes_used(m.config()), state_bytes_total(m.config(), 261, false, true)) << name;
    EXPECT_LT(state_bytes_total(m.config(), 261, false, true), state_bytes_total(m.config(), 261)) << name;
    EXPECT_GE(seq.memory_bytes(), seq.state().bytes_used(m.config()));
  }
}

// Model::matmul_flops_per_token (the numerator of bench model's prefill TFLOP/s) against an independent count from the
// checkpoint's tensor list: 2 x the elements of every 2-D ".weight" and "hc_*_fn" tensor of a layer (FP4 experts are
// stored as [rows, cols / 2] bytes), the routed experts weighted by k / E, plus hc_head_fn.
TEST(ModelFlops, MatmulFlopsPerTokenMatchTheCheckpointsTensors) {
  for (const char* name : {"tiny-a", "tiny-b"}) {
    const Model& m = tiny(name, Numerics::reference);
    const SafetensorsSet set = SafetensorsSet::open(tiny_dir(name));
    const double k = double(m.config().num_experts_per_tok), E = double(m.config().n_routed_experts);
    double want = 0, outside = 0;
    for (const TensorInfo& t : set.tensors()) {
      const std::string& n = t.name;
      const bool fn = n.size() > 3 && n.compare(n.size() - 3, 3, "_fn") == 0 && n.find("hc_") != std::string::npos;
      const bool weight = n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0 && t.shape.size() == 2;
      if (!fn && !weight) continue;
      double el = double(t.shape[0]) * double(t.shape[1]) * (t.dtype == DType::I8 ? 2.0 : 1.0);
      if (n.rfind("layers.", 0) != 0) {  // outside the layers: only hc_head_fn (embed and head are no products here)
        if (n == "hc_head_fn") outside += 2.0 * el, want += 2.0 * el;
        continue;
      }
      if (n.find(".ffn.experts.") != std::string::npos) el *= k / E;
      want += 2.0 * el;
    }
    double got_outside = 0;
    const double got = m.matmul_flops_per_token(&got_outside);
    EXPECT_NEAR(got, want, 1e-9 * want) << name;
    EXPECT_EQ(got_outside, outside) << name;
  }
}

}  // namespace
}  // namespace dsv4::test
