// RoPE frequency tables (spec §4.7, reference precompute_freqs_cis).
#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dsv4 {

RopeTable::RopeTable(int rd, double base, bool yarn, const RopeScaling& sc) : rd_(rd) {
  if (rd <= 0 || rd % 2) fail("rope: rotated dims {} must be positive and even", rd);
  if (!(base > 1.0)) fail("rope: theta {} must be > 1", base);
  const int half = rd / 2;
  freq_.resize(static_cast<size_t>(half));
  const float bf = float(base);
  for (int i = 0; i < half; ++i) {
    const float e = float(2 * i) / float(rd);
    freq_[size_t(i)] = 1.0f / std::pow(bf, e);
  }
  if (yarn && sc.enabled && sc.original_max_position_embeddings > 0) {
    const double pi = 3.14159265358979323846;
    auto corr = [&](double rot) {
      return double(rd) * std::log(double(sc.original_max_position_embeddings) / (rot * 2 * pi)) / (2 * std::log(base));
    };
    double low = std::max(std::floor(corr(sc.beta_fast)), 0.0);
    double high = std::min(std::ceil(corr(sc.beta_slow)), double(rd - 1));
    if (low == high) high += 0.001;
    const float lowf = float(low), span = float(high - low), factor = float(sc.factor);
    for (int i = 0; i < half; ++i) {
      float ramp = (float(i) - lowf) / span;
      ramp = std::min(std::max(ramp, 0.0f), 1.0f);
      const float smooth = 1.0f - ramp;
      const float f = freq_[size_t(i)];
      freq_[size_t(i)] = f / factor * (1.0f - smooth) + f * smooth;
    }
  }
}

RopeTable RopeTable::for_ratio(const ModelConfig& cfg, int ratio) {
  if (ratio == 0) return RopeTable(cfg.qk_rope_head_dim, cfg.rope_theta, false, cfg.rope_scaling);
  return RopeTable(cfg.qk_rope_head_dim, cfg.compress_rope_theta, true, cfg.rope_scaling);
}

void RopeTable::cos_sin(int64_t p, float* out) const {
  const float pf = float(p);
  for (size_t i = 0; i < freq_.size(); ++i) {
    const float a = pf * freq_[i];
    out[2 * i] = std::cos(a);
    out[2 * i + 1] = std::sin(a);
  }
}

void RopeTable::cos_sin(std::span<const int64_t> pos, float* out) const {
  for (size_t t = 0; t < pos.size(); ++t) cos_sin(pos[t], out + t * size_t(rd_));
}

}  // namespace dsv4
