#include "loader/state_size.h"

namespace dsv4 {
namespace {

constexpr uint64_t kF32 = 4;

int n_layers(const ModelConfig& c, bool with_mtp) { return c.num_hidden_layers + (with_mtp ? c.num_mtp_layers() : 0); }

}  // namespace

double state_bytes_per_token(const ModelConfig& c, bool with_mtp) {
  double b = 0;
  for (int l = 0; l < n_layers(c, with_mtp); ++l) {
    const int m = c.compress_ratio(l);
    if (m > 0) b += double(c.head_dim * kF32) / m;
    if (m == 4) b += double(c.index_head_dim * kF32) / m;
  }
  return b;
}

uint64_t state_bytes_fixed_per_sequence(const ModelConfig& c, bool with_mtp) {
  uint64_t b = 0;
  for (int l = 0; l < n_layers(c, with_mtp); ++l) {
    const int m = c.compress_ratio(l);
    b += uint64_t(c.sliding_window) * c.head_dim * kF32;
    if (m > 0) {
      const uint64_t coff = ModelConfig::compressor_coff(m);
      b += 2 * (coff * m) * (coff * c.head_dim) * kF32;
    }
    if (m == 4) b += 2 * uint64_t(2 * 4) * (2 * c.index_head_dim) * kF32;
  }
  return b;
}

uint64_t state_bytes_growing(const ModelConfig& c, int64_t n_tokens, bool with_mtp) {
  if (n_tokens <= 0) return 0;
  uint64_t b = 0;
  for (int l = 0; l < n_layers(c, with_mtp); ++l) {
    const int m = c.compress_ratio(l);
    if (m > 0) b += uint64_t(n_tokens / m) * c.head_dim * kF32;
    if (m == 4) b += uint64_t(n_tokens / m) * c.index_head_dim * kF32;
  }
  return b;
}

uint64_t state_bytes_total(const ModelConfig& c, int64_t n_tokens, bool with_mtp) {
  return state_bytes_fixed_per_sequence(c, with_mtp) + state_bytes_growing(c, n_tokens, with_mtp);
}

}  // namespace dsv4
