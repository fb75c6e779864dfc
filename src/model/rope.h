// RoPE tables of DeepSeek V4 (spec §4.7): interleaved pairs on the last `rd` dims of a head, fp32 frequencies built
// exactly as the reference `precompute_freqs_cis` (fp32 pow, fp32 YaRN blend, angle = fp32(p) * freq).
// Layers with compress_ratio == 0 use rope_theta without YaRN; compressed layers use compress_rope_theta + YaRN
// (when the config has rope_scaling). Angles are computed per position on demand (no [max_ctx, rd/2] table);
// model/rope_cache.h keeps the rows of the positions a model has seen.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "loader/config.h"

namespace dsv4 {

class RopeTable {
 public:
  RopeTable() = default;
  // rd: rotated dims (64); base: θ; yarn: apply the YaRN frequency blend with the config's rope_scaling.
  RopeTable(int rd, double base, bool yarn, const RopeScaling& scaling);
  // The table of a layer of the given compress ratio (spec §2.2 policy).
  static RopeTable for_ratio(const ModelConfig& cfg, int ratio);

  int rd() const { return rd_; }
  const std::vector<float>& freqs() const { return freq_; }  // [rd/2]
  // out[rd]: (cos, sin) pairs for position p.
  void cos_sin(int64_t p, float* out) const;
  // out[n, rd] for positions pos[0..n).
  void cos_sin(std::span<const int64_t> pos, float* out) const;

 private:
  int rd_ = 0;
  std::vector<float> freq_;
};

}  // namespace dsv4
