// A random MoE layer (FP4 routed experts, an FP8 shared expert; small shapes) made resident on a backend, for the
// split tests (model/split_moe.h): the unsplit Ops::moe against SplitMoe for any placement mask and forced routing
// patterns. Used by tests/model (the CPU backend as the "device") and tests/gpu (the CUDA backend).
#pragma once
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/ops.h"
#include "format/numeric.h"
#include "model/split_moe.h"

namespace dsv4::test {

class SplitMoeFixture {
 public:
  static constexpr int64_t E = 8, D = 128, I = 128;

  explicit SplitMoeFixture(Backend& dev, uint32_t seed = 5) : dev_(dev) {
    std::mt19937 rng(seed);
    host_.resize(size_t(E));
    for (int64_t e = 0; e < E; ++e)
      host_[size_t(e)] = ExpertView{weight(GemmFormat::fp4, I, D, rng), weight(GemmFormat::fp4, D, I, rng),
                                    weight(GemmFormat::fp4, I, D, rng)};
    shared_host_ = ExpertView{weight(GemmFormat::fp8, I, D, rng), weight(GemmFormat::fp8, D, I, rng),
                              weight(GemmFormat::fp8, I, D, rng)};
    for (const ExpertView& h : host_) device_.push_back(upload(h));
    shared_dev_ = upload(shared_host_);
    table_ = dev_.upload_vector(device_, "test expert table");
  }

  // Every expert on the device (the unsplit op's weights).
  MoeWeights all_device() const { return MoeWeights{device_.data(), E, table_.data(), &shared_dev_}; }

  // The split layer of `on_host` (bit e = expert e runs on the host).
  struct Split {
    std::vector<ExpertView> dev, host;
    Buffer table, resident;
    SplitMoeLayer layer;
  };
  void make_split(unsigned on_host, Split& s) const {
    s.dev = device_;
    s.host = host_;
    std::vector<uint8_t> res(static_cast<size_t>(E));
    s.layer.on_host.assign(size_t(E), 0);
    s.layer.n_host = 0;
    for (int64_t e = 0; e < E; ++e) {
      const bool h = (on_host >> e) & 1u;
      res[size_t(e)] = h ? 0 : 1;
      s.layer.on_host[size_t(e)] = h ? 1 : 0;
      s.layer.n_host += h ? 1 : 0;
      unbind(h ? s.dev[size_t(e)] : s.host[size_t(e)]);  // each side sees only its experts' bytes
    }
    s.table = dev_.upload_vector(s.dev, "test split table");
    s.resident = dev_.upload_vector(res, "test resident");
    s.layer.device = MoeWeights{s.dev.data(), E, s.table.data(), &shared_dev_};
    s.layer.host = MoeWeights{s.host.data(), E, nullptr, nullptr};
    s.layer.resident = s.resident.as<uint8_t>();
  }

  // bf16-representable inputs [n, D] and routing weights [n, k] (device buffers).
  Buffer input(int64_t n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(n * D));
    for (auto& v : x) v = round_to_bf16(nd(rng));
    return dev_.upload_vector(x, "test x");
  }
  Buffer weights(int64_t n, int64_t k, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> ud(0.05f, 0.6f);
    std::vector<float> w(size_t(n * k));
    for (auto& v : w) v = ud(rng);
    return dev_.upload_vector(w, "test wts");
  }

 private:
  static void unbind(ExpertView& e) {
    for (WeightView* v : {&e.w1, &e.w2, &e.w3}) v->w = nullptr, v->scale = nullptr, v->aux = nullptr;
  }
  WeightView weight(GemmFormat fmt, int64_t rows, int64_t cols, std::mt19937& rng) {
    WeightView v;
    v.fmt = fmt;
    v.rows = rows;
    v.cols = cols;
    std::vector<uint8_t> w, sc;
    if (fmt == GemmFormat::fp4) {
      w.resize(size_t(rows * cols / 2));
      for (auto& b : w) b = uint8_t(rng());
      v.block_rows = 1;
      v.block_cols = 32;
      sc.resize(size_t(rows * ((cols + 31) / 32)));
      for (auto& s : sc) s = uint8_t(127 - 4 - int(rng() % 3));
    } else {
      w.resize(size_t(rows * cols));
      for (auto& b : w) {
        uint8_t c = uint8_t(rng());
        if ((c & 0x7F) == 0x7F) c ^= 0x01;  // no NaN codes
        b = c;
      }
      v.block_rows = 128;
      v.block_cols = 128;
      sc.resize(size_t(((rows + 127) / 128) * ((cols + 127) / 128)));
      for (auto& s : sc) s = uint8_t(127 - 7 - int(rng() % 3));
    }
    v.w = keep(w);
    v.scale = keep(sc);
    return v;
  }
  // A copy of b in host memory of its own pages (page-aligned, padded to whole pages): expert staging page-locks
  // whole pages, as a mapped checkpoint's or a large allocation's pages are, which small heap blocks would share
  // with other objects.
  const uint8_t* keep(const std::vector<uint8_t>& b) {
    constexpr size_t kPage = 1 << 16;  // a multiple of every page size in use
    const size_t n = (b.size() + kPage - 1) / kPage * kPage;
    bytes_.emplace_back(static_cast<uint8_t*>(std::aligned_alloc(kPage, std::max(n, kPage))));
    std::copy(b.begin(), b.end(), bytes_.back().get());
    return bytes_.back().get();
  }
  struct FreeBytes {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  ExpertView upload(const ExpertView& h) {
    return ExpertView{dev_.upload(h.w1, kept_), dev_.upload(h.w2, kept_), dev_.upload(h.w3, kept_)};
  }

  Backend& dev_;
  std::vector<std::unique_ptr<uint8_t[], FreeBytes>> bytes_;  // host bytes (the host experts read them)
  std::vector<Buffer> kept_;                 // device copies
  std::vector<ExpertView> host_, device_;
  ExpertView shared_host_, shared_dev_;
  Buffer table_;
};

// Forced routing patterns [n, k] over E experts: every slot of every token to one expert (duplicates), distinct
// experts per token, every expert used (round robin), random with duplicates.
inline std::vector<std::vector<int32_t>> routing_patterns(int64_t n, int64_t k, int64_t E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> out(4, std::vector<int32_t>(size_t(n * k)));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> perm(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) perm[size_t(e)] = int32_t(e);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < k; ++i) {
      out[0][size_t(t * k + i)] = int32_t(E - 1);
      out[1][size_t(t * k + i)] = perm[size_t(i % E)];
      out[2][size_t(t * k + i)] = int32_t((t * k + i) % E);
      out[3][size_t(t * k + i)] = int32_t(rng() % uint32_t(E));
    }
  }
  return out;
}

}  // namespace dsv4::test
