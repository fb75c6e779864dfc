// The numerics switch of the forward pass (one value selects every quantization point, spec §8):
//   reference — reproduce the official reference implementation: FP8 act_quant (per 128, ue8m0) of the inputs of the
//               FP8/FP4 GEMMs (§4.3, §4.5), bf16 rounding wherever the reference stores bf16, KV/indexer FP8/FP4
//               simulation (§4.3, §4.4), wo_a as a bf16-weight product (§3.6).
//   dense     — the same weights dequantized exactly, fp32 activations, no quantization simulation (what HF
//               transformers computes up to its bf16 rounding).
#pragma once
#include <optional>
#include <string_view>

namespace dsv4 {

enum class Numerics { reference, dense };

// "reference" / "dense".
std::string_view numerics_name(Numerics n);
// Inverse of numerics_name (exact, lower case); std::nullopt for anything else.
std::optional<Numerics> parse_numerics(std::string_view s);

}  // namespace dsv4
