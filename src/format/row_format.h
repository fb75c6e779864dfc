// Storage formats of one sequence-state row (spec §6.1): how the paged state pool (model/state_pool.h) keeps a window
// ring row, a compressed KV row or an indexer key row. `f32` keeps the row as computed; the compact formats are the
// reference's own quantized forms and are lossless for the rows reference numerics produce (the nope part of KV rows
// is already FP8-simulated, indexer keys FP4-simulated, the rope part bf16), so decoding gives back every float
// bitwise — including the sign of zero.
//
//   kv_fp8  [dim] with nope = dim - rope_dim (a multiple of 64), as bytes:
//             [0, nope)                      e4m3fn codes of the nope columns  x / 2^k of their 64-column block
//             [nope, nope + 2*rope_dim)      the rope columns as bf16 (little-endian)
//             [.., + nope/64)                ue8m0 scale byte k + 127 per 64-column block
//             then zero padding to a multiple of 4 bytes
//           V4-Flash (dim 512, rope 64): 448 + 128 + 7 + 1 pad = 584 B (spec §6.1, [VLLM] head_bytes); demo
//           (dim 128, rope 64): 64 + 128 + 1 + 3 pad = 196 B.
//   key_fp4 [dim] (a multiple of 32), as bytes:
//             [0, dim/2)                     e2m1 nibbles, element 2j in the low nibble of byte j, x / 2^k of its
//                                            32-column block
//             [dim/2, dim/2 + dim/32)        ue8m0 scale byte k + 127 per 32-column block
//             then zero padding to a multiple of 4 bytes
//           dim 128: 64 + 4 = 68 B.
// Every format's row is a whole number of 4-byte words, so rows move with the fp32 row copies of backend/ops.h
// (gather_rows / scatter_rows with width words()).
//
// Encoding picks per block the smallest power-of-two scale 2^k with amax <= max_code * 2^k (an all-zero block gets
// k = 0); if the values are code * 2^k0 for any k0 (what the reference's simulation stores), they are code' * 2^k
// exactly for this k, so the encoding is exact. encode_row reports whether it was: false when some value is not
// exactly representable (NaN, inf, a value off the grid, a bf16-inexact rope value); the row is then written
// rounded (nearest even, saturating), never read back equal.
#pragma once
#include <cstdint>

namespace dsv4 {

enum class RowKind : uint8_t { f32, kv_fp8, key_fp4 };

struct RowCodec {
  RowKind kind = RowKind::f32;
  int64_t dim = 0;       // row width in elements (the logical row)
  int64_t rope_dim = 0;  // kv_fp8: the trailing columns kept as bf16

  // Throw dsv4::Error when the dimensions do not fit the format.
  static RowCodec f32(int64_t dim);
  static RowCodec kv_fp8(int64_t dim, int64_t rope_dim);
  static RowCodec key_fp4(int64_t dim);

  bool compact() const { return kind != RowKind::f32; }
  int64_t bytes() const;                        // bytes per stored row (a multiple of 4)
  int64_t words() const { return bytes() / 4; }  // stored row width in 4-byte words
};

const char* row_kind_name(RowKind k);

// Encode one row: x [c.dim] floats -> out [c.bytes()] bytes (padding zeroed). Returns whether the encoding is exact
// (decode_row gives x back bitwise). f32: a copy, always exact.
bool encode_row(const RowCodec& c, const float* x, void* out);
// Decode one row: in [c.bytes()] -> out [c.dim] floats.
void decode_row(const RowCodec& c, const void* in, float* out);

}  // namespace dsv4
