#include "loader/state_size.h"

#include "format/row_format.h"

namespace dsv4 {
namespace {

constexpr uint64_t kF32 = 4;

int n_layers(const ModelConfig& c, bool with_drafter) { return c.num_hidden_layers + (with_drafter ? c.num_draft_layers() : 0); }

}  // namespace

uint64_t state_kv_row_bytes(const ModelConfig& c, bool compact) {
  return compact ? uint64_t(RowCodec::kv_fp8(c.head_dim, c.qk_rope_head_dim).bytes()) : uint64_t(c.head_dim) * kF32;
}

uint64_t state_key_row_bytes(const ModelConfig& c, bool compact) {
  return compact && c.index_head_dim > 0 ? uint64_t(RowCodec::key_fp4(c.index_head_dim).bytes())
                                         : uint64_t(c.index_head_dim) * kF32;
}

double state_bytes_per_token(const ModelConfig& c, bool with_drafter, bool compact) {
  const double R = double(state_kv_row_bytes(c, compact)), I = double(state_key_row_bytes(c, compact));
  double b = 0;
  for (int l = 0; l < n_layers(c, with_drafter); ++l) {
    const int m = c.compress_ratio(l);
    if (m > 0) b += R / m;
    if (m == 4) b += I / m;
  }
  return b;
}

uint64_t state_bytes_fixed_per_sequence(const ModelConfig& c, bool with_drafter, bool compact) {
  const uint64_t R = state_kv_row_bytes(c, compact);
  uint64_t b = 0;
  for (int l = 0; l < n_layers(c, with_drafter); ++l) {
    const int m = c.compress_ratio(l);
    b += uint64_t(c.sliding_window) * R;
    if (m > 0) {
      const uint64_t coff = ModelConfig::compressor_coff(m);
      b += 2 * (coff * m) * (coff * c.head_dim) * kF32;
    }
    if (m == 4) b += 2 * uint64_t(2 * 4) * (2 * c.index_head_dim) * kF32;
  }
  return b;
}

uint64_t state_bytes_growing(const ModelConfig& c, int64_t n_tokens, bool with_drafter, bool compact) {
  if (n_tokens <= 0) return 0;
  const uint64_t R = state_kv_row_bytes(c, compact), I = state_key_row_bytes(c, compact);
  uint64_t b = 0;
  for (int l = 0; l < n_layers(c, with_drafter); ++l) {
    const int m = c.compress_ratio(l);
    if (m > 0) b += uint64_t(n_tokens / m) * R;
    if (m == 4) b += uint64_t(n_tokens / m) * I;
  }
  return b;
}

uint64_t state_bytes_total(const ModelConfig& c, int64_t n_tokens, bool with_drafter, bool compact) {
  return state_bytes_fixed_per_sequence(c, with_drafter, compact) + state_bytes_growing(c, n_tokens, with_drafter, compact);
}

}  // namespace dsv4
