// Loading and basic sanity of the forward pass on the tiny official-format checkpoints.
#include <limits>

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

// Forwards to the CPU ops but turns the head's logits into NaN while `poison` is set.
class PoisonOps final : public Ops {
 public:
  mutable bool poison = false;
  int64_t vocab = 0;
  const Ops& b = cpu_ops();
  void linear(const WeightRef& W, const float* x, int64_t n, float* y, const LinearOpts& o) const override {
    b.linear(W, x, n, y, o);
    if (poison && W.rows == vocab) y[0] = std::numeric_limits<float>::quiet_NaN();
  }
  void round_bf16(float* x, int64_t n) const override { b.round_bf16(x, n); }
  void embed(const WeightRef& t, const int32_t* ids, int64_t n, float* out) const override { b.embed(t, ids, n, out); }
  void rmsnorm(const float* x, int64_t r, int64_t d, const float* w, float e, bool bf, float* y) const override {
    b.rmsnorm(x, r, d, w, e, bf, y);
  }
  void head_rms(float* x, int64_t r, int64_t d, float e, bool bf) const override { b.head_rms(x, r, d, e, bf); }
  void rope(float* x, int64_t n, int64_t h, int64_t hd, int64_t rd, const float* cs, bool inv, bool bf) const override {
    b.rope(x, n, h, hd, rd, cs, inv, bf);
  }
  void fp8_sim(float* x, int64_t r, int64_t s, int64_t c, int64_t blk) const override { b.fp8_sim(x, r, s, c, blk); }
  void fp4_sim(float* x, int64_t r, int64_t d) const override { b.fp4_sim(x, r, d); }
  void hadamard(float* x, int64_t r, int64_t d, bool bf) const override { b.hadamard(x, r, d, bf); }
  void hc_pre(const float* X, int64_t n, int hc, int64_t d, const float* fn, const float* sc, const float* ba, int it,
              float he, float ne, bool bf, float* u, float* post, float* comb) const override {
    b.hc_pre(X, n, hc, d, fn, sc, ba, it, he, ne, bf, u, post, comb);
  }
  void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t n, int hc, int64_t d,
               bool bf, float* Xo) const override {
    b.hc_post(f, X, post, comb, n, hc, d, bf, Xo);
  }
  void hc_head(const float* X, int64_t n, int hc, int64_t d, const float* fn, const float* sc, const float* ba,
               float he, float ne, bool bf, float* u) const override {
    b.hc_head(X, n, hc, d, fn, sc, ba, he, ne, bf, u);
  }
  void sparse_attention(const float* q, int64_t n, int64_t h, const RowSource& kv, const int32_t* idx, int64_t k,
                        const float* sink, float scale, bool bf, float* out) const override {
    b.sparse_attention(q, n, h, kv, idx, k, sink, scale, bf, out);
  }
  void softmax_pool(const float* kv, const float* s, int64_t n, int64_t d, float* out) const override {
    b.softmax_pool(kv, s, n, d, out);
  }
  void indexer_topk(const float* q, int64_t n, int64_t h, int64_t d, const float* keys, const int64_t* nv,
                    const float* w, int64_t k, bool bf, int32_t* sel) const override {
    b.indexer_topk(q, n, h, d, keys, nv, w, k, bf, sel);
  }
  void route(const float* l, int64_t n, int64_t e, int64_t k, const float* bias, const int32_t* hid, float rs,
             int32_t* ids, float* w) const override {
    b.route(l, n, e, k, bias, hid, rs, ids, w);
  }
  void swiglu(const float* g, const float* up, int64_t r, int64_t d, float lim, const float* rw, bool bf,
              float* h) const override {
    b.swiglu(g, up, r, d, lim, rw, bf, h);
  }
};

TEST(ModelErrors, NonFiniteLogitsThrowAndLeaveTheSequenceConsistent) {
  PoisonOps pops;
  ModelOptions o;
  o.ops = &pops;
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
    EXPECT_EQ(seq.state().bytes_used(), state_bytes_total(m.config(), 0)) << name;
    const auto ids = random_ids(261, m.n_vocab(), 6);
    seq.append(ids, lg);
    EXPECT_EQ(seq.state().bytes_used(), state_bytes_total(m.config(), 261)) << name;
    EXPECT_GE(seq.memory_bytes(), seq.state().bytes_used());
  }
}

}  // namespace
}  // namespace dsv4::test
