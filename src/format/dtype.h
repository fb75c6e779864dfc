// Element types of checkpoint tensors (the safetensors dtype strings), with their storage sizes.
#pragma once
#include <cstddef>
#include <optional>
#include <string_view>

namespace dsv4 {

// F8_E4M3 = OCP float8 E4M3FN (no infinities, 0x7F/0xFF = NaN); F8_E8M0 = float8_e8m0fnu (power-of-two scale).
// I8 also carries packed FP4 (E2M1) pairs for the routed experts (spec §3.6).
enum class DType { BF16, F16, F32, I64, I32, I8, U8, F8_E4M3, F8_E8M0 };

// Bytes per element: 2, 2, 4, 8, 4, 1, 1, 1, 1.
size_t dtype_size(DType t);
// The safetensors name: "BF16", "F16", "F32", "I64", "I32", "I8", "U8", "F8_E4M3", "F8_E8M0".
std::string_view dtype_name(DType t);
// Inverse of dtype_name (exact, case-sensitive); std::nullopt for any other string.
std::optional<DType> parse_dtype(std::string_view name);

}  // namespace dsv4
