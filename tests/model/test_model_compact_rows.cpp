// Compact state rows (model/state_layout.h RowFormat::compact, format/row_format.h) against fp32 rows: in reference
// numerics the same model over a compact state and over an fp32 state gives bitwise equal logits at every position
// (prefill chunks, decode steps, past the window and several HCA windows), and every stored row decodes to the fp32
// state's row bitwise.
#include <cstring>

#include "model_test_util.h"
#include "model/sequence_state.h"

namespace dsv4::test {
namespace {

const Model& model_named(const std::string& name) {
  return name == "demo" ? demo_model(Numerics::reference) : tiny(name, Numerics::reference);
}

// Logits of every position of ids, fed as a prefill of `prefill` tokens and then one token per step.
std::vector<std::vector<float>> run(const Model& m, SequenceState& st, const std::vector<int32_t>& ids,
                                    size_t prefill) {
  std::vector<std::vector<float>> out;
  auto sink = [&](int64_t pos, std::span<const float> lg) {
    EXPECT_EQ(pos, int64_t(out.size()));
    out.emplace_back(lg.begin(), lg.end());
  };
  auto all = [](int64_t) { return true; };
  m.forward(st, std::span<const int32_t>(ids.data(), prefill), all, sink);
  for (size_t i = prefill; i < ids.size(); ++i) m.forward(st, std::span<const int32_t>(ids.data() + i, 1), all, sink);
  return out;
}

// Row r of a stored buffer, decoded.
std::vector<float> row(const RowCodec& c, const Buffer& b, int64_t r) {
  std::vector<float> v(size_t(c.dim));
  decode_row(c, b.as<float>() + r * c.words(), v.data());
  return v;
}

class CompactRows : public ::testing::TestWithParam<std::string> {};

TEST_P(CompactRows, LogitsAndStoredRowsEqualFp32Rows) {
  const Model& m = model_named(GetParam());
  const ModelConfig& cfg = m.config();
  ASSERT_EQ(m.state_rows(), RowFormat::compact);
  SequenceState compact = m.fresh_state();
  SequenceState f32 = SequenceState::fresh(cfg, m.backend(), RowFormat::f32);
  ASSERT_EQ(compact.pool.layout().row_format, RowFormat::compact);
  ASSERT_LT(compact.pool.layout().slot_bytes, f32.pool.layout().slot_bytes);

  const std::vector<int32_t> ids = random_ids(300, m.n_vocab(), 41);
  const auto a = run(m, compact, ids, 170);
  const auto b = run(m, f32, ids, 170);
  ASSERT_EQ(a.size(), ids.size());
  ASSERT_EQ(b.size(), ids.size());
  for (size_t p = 0; p < ids.size(); ++p)
    ASSERT_EQ(std::memcmp(a[p].data(), b[p].data(), a[p].size() * 4), 0) << GetParam() << " position " << p;

  const StateLayout& C = compact.pool.layout();
  const StateLayout& F = f32.pool.layout();
  int64_t rows_checked = 0;
  for (size_t l = 0; l < C.layers.size(); ++l) {
    const StateLayout::Layer& ly = C.layers[l];
    const StatePool::LayerBuffers& cb = compact.pool.layer(int(l));
    const StatePool::LayerBuffers& fb = f32.pool.layer(int(l));
    for (int64_t r = 0; r < C.window; ++r, ++rows_checked) {
      const auto x = row(C.kv_row, cb.ring, r), y = row(F.kv_row, fb.ring, r);
      ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << "layer " << l << " ring row " << r;
    }
    if (ly.ratio == 0) continue;
    const int64_t n_rows = int64_t(ids.size()) / ly.ratio;  // identity page table: logical row = pool row
    for (int64_t r = 0; r < n_rows; ++r, ++rows_checked) {
      const auto x = row(C.kv_row, cb.comp, r), y = row(F.kv_row, fb.comp, r);
      ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << "layer " << l << " compressed row " << r;
    }
    if (!ly.indexer) continue;
    for (int64_t r = 0; r < n_rows; ++r, ++rows_checked) {
      const auto x = row(C.key_row, cb.keys, r), y = row(F.key_row, fb.keys, r);
      ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << "layer " << l << " key row " << r;
    }
  }
  EXPECT_GT(rows_checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, CompactRows, ::testing::Values("demo", "tiny-a", "tiny-b"));

TEST(CompactRowsDense, DenseNumericsRefuseACompactPool) {
  const Model& m = tiny("tiny-a", Numerics::dense);
  ASSERT_EQ(m.state_rows(), RowFormat::f32);
  SequenceState st = SequenceState::fresh(m.config(), m.backend(), RowFormat::compact);
  const std::vector<int32_t> ids = random_ids(4, m.n_vocab(), 1);
  EXPECT_THROW(m.forward(st, ids, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace dsv4::test
