// Shared helpers of the model tests: cached tiny models, log-softmax, greedy argmax, comparisons.
#pragma once
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/model.h"
#include "model/sequence.h"

namespace dsv4::test {

inline std::string tiny_dir(const std::string& name) { return std::string(DSV4_SOURCE_DIR) + "/tests/data/" + name; }

// One loaded model per (name, numerics) for the whole test program. The tiny models run single-threaded (their ops
// are far too small to amortize OpenMP fork/join, which is very slow on a loaded 2-core CI machine); the
// ThreadCountDoesNotChangeResults tests switch the thread count explicitly.
inline const Model& tiny(const std::string& name, Numerics num) {
  static const bool single = (omp_set_num_threads(1), true);
  (void)single;
  static std::map<std::pair<std::string, int>, std::unique_ptr<Model>> cache;
  auto key = std::make_pair(name, int(num));
  auto it = cache.find(key);
  if (it == cache.end()) {
    ModelOptions o;
    o.numerics = num;
    o.ubatch = 256;
    it = cache.emplace(key, Model::load(tiny_dir(name), o)).first;
  }
  return *it->second;
}

// The demo model (models/dsv4-demo), cached per numerics, with the tiny models' thread policy.
inline const Model& demo_model(Numerics num) {
  (void)tiny("tiny-a", num);
  static std::map<int, std::unique_ptr<Model>> cache;
  auto& m = cache[int(num)];
  if (!m) {
    ModelOptions o;
    o.numerics = num;
    m = Model::load(std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo", o);
  }
  return *m;
}

inline std::vector<int32_t> random_ids(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(2, vocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<double> log_softmax(std::span<const float> lg) {
  double mx = -INFINITY;
  for (float v : lg) mx = std::max(mx, double(v));
  double s = 0;
  for (float v : lg) s += std::exp(double(v) - mx);
  const double lse = mx + std::log(s);
  std::vector<double> out(lg.size());
  for (size_t i = 0; i < lg.size(); ++i) out[i] = double(lg[i]) - lse;
  return out;
}

inline int32_t argmax(std::span<const float> lg) {
  return int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin());
}

inline double max_abs_logprob_diff(std::span<const float> a, std::span<const float> b) {
  auto la = log_softmax(a), lb = log_softmax(b);
  double m = 0;
  for (size_t i = 0; i < la.size(); ++i) m = std::max(m, std::abs(la[i] - lb[i]));
  return m;
}

// Logits of every position of a cold prefill, fed in chunks of `chunk` tokens through a ModelSequence.
inline std::vector<float> run_chunked(const Model& m, std::span<const int32_t> ids, int64_t chunk) {
  ModelSequence seq(m);
  const int64_t V = m.n_vocab();
  std::vector<float> out(ids.size() * size_t(V));
  for (size_t i = 0; i < ids.size(); i += size_t(chunk)) {
    const size_t n = std::min(ids.size() - i, size_t(chunk));
    seq.append_all(ids.subspan(i, n), [&](int64_t p, std::span<const float> lg) {
      std::copy(lg.begin(), lg.end(), out.begin() + p * V);
    });
  }
  return out;
}

}  // namespace dsv4::test
