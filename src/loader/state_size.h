// Per-sequence decode-state sizes of dsv4's first (fp32 rows) state layout, for memory accounting (spec §6).
//
// Per main layer L with ratio m = compress_ratio(L) (MTP layers too when with_mtp):
//   fixed per sequence:
//     window ring            sliding_window x head_dim x 4 B                       (all layers; 128 x 512 x 4 = 256 KiB)
//     compressor frontier    2 x (coff*m) x (coff*head_dim) x 4 B  (kv_state + score_state, m > 0; coff = 2 iff m == 4)
//     indexer frontier       2 x (2*4) x (2*index_head_dim) x 4 B  (m == 4)
//   growing, per m tokens:
//     compressed row         head_dim x 4 B                                         (m > 0)
//     indexer row            index_head_dim x 4 B                                   (m == 4)
// V4-Flash: 21*(512*4/4 + 128*4/4) + 20*(512*4/128) = 13,760 B/token (twice the bf16 figure of spec §6.2);
// fixed = 43*262,144 + 21*(65,536 + 16,384) + 20*524,288 = 23,478,272 B (the §6.2 compressor state 11.64 MiB + rings).
#pragma once
#include <cstdint>

#include "loader/config.h"

namespace dsv4 {

// Asymptotic bytes per consumed token (exact: sum over layers of row_bytes / m).
double state_bytes_per_token(const ModelConfig& cfg, bool with_mtp = false);
// Bytes independent of the sequence length (window rings + compressor / indexer frontier state).
uint64_t state_bytes_fixed_per_sequence(const ModelConfig& cfg, bool with_mtp = false);
// Exact bytes of the growing part after n_tokens positions: sum over layers of floor(n_tokens / m) x row bytes.
uint64_t state_bytes_growing(const ModelConfig& cfg, int64_t n_tokens, bool with_mtp = false);
// fixed + growing(n_tokens).
uint64_t state_bytes_total(const ModelConfig& cfg, int64_t n_tokens, bool with_mtp = false);

}  // namespace dsv4
