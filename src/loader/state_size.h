// Per-sequence decode-state sizes as the state pool stores them (model/state_layout.h), for memory accounting
// (spec §6). Rows (window ring, compressed KV, indexer keys) are fp32, or with `compact` in the compact formats of
// format/row_format.h (KV row R = 584 B for V4-Flash, indexer row I = 68 B; fp32: R = head_dim x 4, I =
// index_head_dim x 4); compressor frontiers are always fp32.
//
// Per main layer L with ratio m = compress_ratio(L) (the drafter layers too when with_drafter):
//   fixed per sequence:
//     window ring            sliding_window x R                                    (all layers; 128 x 512 x 4 = 256 KiB)
//     compressor frontier    2 x (coff*m) x (coff*head_dim) x 4 B  (kv_state + score_state, m > 0; coff = 2 iff m == 4)
//     indexer frontier       2 x (2*4) x (2*index_head_dim) x 4 B  (m == 4)
//   growing, per m tokens:
//     compressed row         R                                                      (m > 0)
//     indexer row            I                                                      (m == 4)
// V4-Flash fp32: 21*(512*4/4 + 128*4/4) + 20*(512*4/128) = 13,760 B/token (twice the bf16 figure of spec §6.2);
// fixed = 43*262,144 + 21*(65,536 + 16,384) + 20*524,288 = 23,478,272 B (the §6.2 compressor state 11.64 MiB + rings).
// V4-Flash compact: 21*(584/4 + 68/4) + 20*(584/128) = 3,514.25 B/token (spec §6.2 with the FP4 indexer cache).
#pragma once
#include <cstdint>

#include "loader/config.h"

namespace dsv4 {

// Asymptotic bytes per consumed token (exact: sum over layers of row_bytes / m).
double state_bytes_per_token(const ModelConfig& cfg, bool with_drafter = false, bool compact = false);
// Bytes independent of the sequence length (window rings + compressor / indexer frontier state).
uint64_t state_bytes_fixed_per_sequence(const ModelConfig& cfg, bool with_drafter = false, bool compact = false);
// Exact bytes of the growing part after n_tokens positions: sum over layers of floor(n_tokens / m) x row bytes.
uint64_t state_bytes_growing(const ModelConfig& cfg, int64_t n_tokens, bool with_drafter = false, bool compact = false);
// fixed + growing(n_tokens).
uint64_t state_bytes_total(const ModelConfig& cfg, int64_t n_tokens, bool with_drafter = false, bool compact = false);
// Bytes of one stored KV row (R) and indexer key row (I) above.
uint64_t state_kv_row_bytes(const ModelConfig& cfg, bool compact);
uint64_t state_key_row_bytes(const ModelConfig& cfg, bool compact);

}  // namespace dsv4
