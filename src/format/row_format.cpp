// Compact state row encode / decode (row_format.h).
#include "format/row_format.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "format/numeric.h"

namespace dsv4 {

namespace {

constexpr int64_t kKvBlock = 64;   // nope columns per ue8m0 scale (kv_fp8)
constexpr int64_t kKeyBlock = 32;  // columns per ue8m0 scale (key_fp4)

int64_t round4(int64_t b) { return (b + 3) / 4 * 4; }

bool same_bits(float a, float b) { return float_to_bits(a) == float_to_bits(b); }

// The decode loops are compiled twice (AVX2 and the baseline ISA, chosen at load time); both are exact, so the
// results do not depend on the choice.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DSV4_ROW_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DSV4_ROW_CLONES
#endif

// e4m3fn code -> float, branch-free: the code's exponent and mantissa bits placed in the low exponent bits of a
// binary32 give value * 2^-120 (normal codes as normals, subnormal codes as binary32 subnormals), so one exact
// multiply by 2^120 restores the value; then the block scale (exact: every e4m3 value times 2^k, k >= -127, is a
// binary32 value unless it overflows). Codes 0x7F / 0xFF (NaN) decode to +-480 * s: the encoder never writes them
// in an exact row. Needs no flush-to-zero / denormals-are-zero mode (the engine never sets it).
DSV4_ROW_CLONES void decode_e4m3_block(const uint8_t* q, int64_t n, float s, float* o) {
  const float k2p120 = bits_to_float(uint32_t(127 + 120) << 23);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = q[i];
    const float f = bits_to_float(((b & 0x7Fu) << 20) | ((b & 0x80u) << 24));
    o[i] = (f * k2p120) * s;
  }
}

// Fast e4m3 codes of x * inv from the binary32 bits (branch-free): exact codes wherever x * inv is an e4m3 value
// (normals: exponent rebias + the top 3 mantissa bits; subnormals: |y| * 2^9), something else otherwise — callers
// check through decode and re-encode such a block with rounding.
DSV4_ROW_CLONES void e4m3_codes_fast(const float* x, int64_t n, float inv, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = float_to_bits(x[i] * inv), a = u & 0x7FFFFFFFu;
    const uint32_t normal = (a >> 20) - (120u << 3);
    const uint32_t sub = uint32_t(std::fmin(bits_to_float(a), 0.015625f) * 512.0f);
    q[i] = uint8_t(((u >> 24) & 0x80u) | ((a >= 0x3C800000u ? normal : sub) & 0x7Fu));
  }
}

// The same for e2m1 nibbles (normals |y| >= 1: exponent and the top mantissa bit; 0.5 and 0: |y| * 2).
DSV4_ROW_CLONES void e2m1_nibbles_fast(const float* x, int64_t n, float inv, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = float_to_bits(x[i] * inv), a = u & 0x7FFFFFFFu;
    const uint32_t normal = (a >> 22) - (126u << 1);
    const uint32_t sub = uint32_t(std::fmin(bits_to_float(a), 1.0f) * 2.0f);
    q[i] = uint8_t(((u >> 28) & 0x8u) | ((a >= 0x3F800000u ? normal : sub) & 0x7u));
  }
}

// Whether a[i] and b[i] have the same bits for every i < n.
DSV4_ROW_CLONES bool all_same_bits(const float* a, const float* b, int64_t n) {
  uint32_t diff = 0;
  for (int64_t i = 0; i < n; ++i) diff |= float_to_bits(a[i]) ^ float_to_bits(b[i]);
  return diff == 0;
}

DSV4_ROW_CLONES void decode_bf16_le(const uint8_t* in, int64_t n, float* o) {
  for (int64_t i = 0; i < n; ++i) o[i] = bits_to_float((uint32_t(in[2 * i]) | (uint32_t(in[2 * i + 1]) << 8)) << 16);
}

// The ue8m0 byte of the smallest 2^k with amax <= max_code * 2^k, k in [-127, 127] (amax == 0: k = 0; inf: k = 0,
// the block cannot be exact anyway).
uint8_t block_scale(float amax, float max_code) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 127;
  int k = std::ilogb(amax) - std::ilogb(max_code) - 1;  // max_code * 2^k < amax: a lower bound
  while (k < 127 && std::ldexp(double(max_code), k) < double(amax)) ++k;
  if (k < -127) k = -127;
  return uint8_t(k + 127);
}

float block_amax(const float* x, int64_t n) {
  float a = 0.0f;
  for (int64_t i = 0; i < n; ++i) a = std::fmax(a, std::fabs(x[i]));  // NaN ignored (never exact below)
  return a;
}

bool encode_kv(const RowCodec& c, const float* x, uint8_t* out) {
  const int64_t nope = c.dim - c.rope_dim, nb = nope / kKvBlock;
  uint8_t* codes = out;
  uint8_t* rope = out + nope;
  uint8_t* scales = rope + 2 * c.rope_dim;
  bool exact = true;
  float back[kKvBlock];
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kKvBlock;
    const uint8_t e = block_scale(block_amax(xb, kKvBlock), 448.0f);
    scales[b] = e;
    const float inv = float(std::ldexp(1.0, 127 - int(e)));  // 2^-k, a binary32 value for k in [-127, 127]
    uint8_t* qb = codes + b * kKvBlock;
    e4m3_codes_fast(xb, kKvBlock, inv, qb);
    decode_e4m3_block(qb, kKvBlock, e8m0_to_float(e), back);
    if (all_same_bits(back, xb, kKvBlock)) continue;
    exact = false;  // not e4m3 * 2^k: written rounded
    for (int64_t i = 0; i < kKvBlock; ++i) qb[i] = float_to_e4m3fn_rne_satfinite(xb[i] * inv);
  }
  for (int64_t i = 0; i < c.rope_dim; ++i) {
    const float v = x[nope + i];
    const uint16_t h = float_to_bf16_rne(v);
    rope[2 * i] = uint8_t(h & 0xFF);
    rope[2 * i + 1] = uint8_t(h >> 8);
    exact = exact && same_bits(bf16_to_float(h), v);
  }
  return exact;
}

void decode_kv(const RowCodec& c, const uint8_t* in, float* out) {
  const int64_t nope = c.dim - c.rope_dim, nb = nope / kKvBlock;
  const uint8_t* rope = in + nope;
  const uint8_t* scales = rope + 2 * c.rope_dim;
  for (int64_t b = 0; b < nb; ++b)
    decode_e4m3_block(in + b * kKvBlock, kKvBlock, e8m0_to_float(scales[b]), out + b * kKvBlock);
  decode_bf16_le(rope, c.rope_dim, out + nope);
}

bool encode_key(const RowCodec& c, const float* x, uint8_t* out) {
  const int64_t nb = c.dim / kKeyBlock;
  uint8_t* scales = out + c.dim / 2;
  const float* lut = e2m1_lut();
  bool exact = true;
  uint8_t nib[kKeyBlock];
  float back[kKeyBlock];
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kKeyBlock;
    const uint8_t e = block_scale(block_amax(xb, kKeyBlock), 6.0f);
    scales[b] = e;
    const float s = e8m0_to_float(e), inv = float(std::ldexp(1.0, 127 - int(e)));  // 2^k, 2^-k
    e2m1_nibbles_fast(xb, kKeyBlock, inv, nib);
    for (int64_t i = 0; i < kKeyBlock; ++i) back[i] = lut[nib[i]] * s;
    if (!all_same_bits(back, xb, kKeyBlock)) {
      exact = false;  // not e2m1 * 2^k: written rounded
      for (int64_t i = 0; i < kKeyBlock; ++i) nib[i] = float_to_e2m1_rne(xb[i] * inv);
    }
    uint8_t* ob = out + b * kKeyBlock / 2;
    for (int64_t i = 0; i < kKeyBlock; i += 2) ob[i / 2] = uint8_t(nib[i] | (nib[i + 1] << 4));
  }
  return exact;
}

void decode_key(const RowCodec& c, const uint8_t* in, float* out) {
  const int64_t nb = c.dim / kKeyBlock;
  const uint8_t* scales = in + c.dim / 2;
  const float(*pairs)[2] = e2m1_pair_lut();
  for (int64_t b = 0; b < nb; ++b) {
    const float s = e8m0_to_float(scales[b]);
    const uint8_t* q = in + b * kKeyBlock / 2;
    float* o = out + b * kKeyBlock;
    for (int64_t i = 0; i < kKeyBlock / 2; ++i) {
      o[2 * i] = pairs[q[i]][0] * s;
      o[2 * i + 1] = pairs[q[i]][1] * s;
    }
  }
}

}  // namespace

RowCodec RowCodec::f32(int64_t dim) {
  if (dim < 0) fail("row format f32: negative row width {}", dim);
  return RowCodec{RowKind::f32, dim, 0};
}

RowCodec RowCodec::kv_fp8(int64_t dim, int64_t rope_dim) {
  if (rope_dim < 0 || rope_dim >= dim || (dim - rope_dim) % kKvBlock != 0)
    fail("row format kv_fp8: row width {} with {} rope columns leaves a nope part that is not a positive multiple of "
         "{}", dim, rope_dim, kKvBlock);
  return RowCodec{RowKind::kv_fp8, dim, rope_dim};
}

RowCodec RowCodec::key_fp4(int64_t dim) {
  if (dim <= 0 || dim % kKeyBlock != 0)
    fail("row format key_fp4: row width {} is not a positive multiple of {}", dim, kKeyBlock);
  return RowCodec{RowKind::key_fp4, dim, 0};
}

int64_t RowCodec::bytes() const {
  switch (kind) {
    case RowKind::f32: return dim * 4;
    case RowKind::kv_fp8: {
      const int64_t nope = dim - rope_dim;
      return round4(nope + 2 * rope_dim + nope / kKvBlock);
    }
    case RowKind::key_fp4: return round4(dim / 2 + dim / kKeyBlock);
  }
  return 0;
}

const char* row_kind_name(RowKind k) {
  switch (k) {
    case RowKind::f32: return "f32";
    case RowKind::kv_fp8: return "e4m3+ue8m0/64+bf16 rope";
    case RowKind::key_fp4: return "e2m1+ue8m0/32";
  }
  return "?";
}

bool encode_row(const RowCodec& c, const float* x, void* out) {
  uint8_t* o = static_cast<uint8_t*>(out);
  switch (c.kind) {
    case RowKind::f32: std::memcpy(o, x, size_t(c.dim) * 4); return true;
    case RowKind::kv_fp8: {
      const int64_t used = c.dim - c.rope_dim + 2 * c.rope_dim + (c.dim - c.rope_dim) / kKvBlock;
      std::memset(o + used, 0, size_t(c.bytes() - used));
      return encode_kv(c, x, o);
    }
    case RowKind::key_fp4: {
      const int64_t used = c.dim / 2 + c.dim / kKeyBlock;
      std::memset(o + used, 0, size_t(c.bytes() - used));
      return encode_key(c, x, o);
    }
  }
  return false;
}

void decode_row(const RowCodec& c, const void* in, float* out) {
  const uint8_t* p = static_cast<const uint8_t*>(in);
  switch (c.kind) {
    case RowKind::f32: std::memcpy(out, p, size_t(c.dim) * 4); return;
    case RowKind::kv_fp8: decode_kv(c, p, out); return;
    case RowKind::key_fp4: decode_key(c, p, out); return;
  }
}

}  // namespace dsv4
