// The checkpoint tensor table of spec §3 (3.1 global, 3.2 every layer, 3.3 ratio-4 extras, 3.4 ratio-128 extras, 3.5
// MTP; the DSpark drafter of docs/dspark.md), derived from a ModelConfig: the names, dtypes and shapes an official checkpoint of that config holds. Used
// to build weights without a checkpoint (`--load-format dummy`, model/dummy_weights.h). FP8 linears: F8_E4M3 +
// F8_E8M0 scale on the weight_block_size grid (ceil division); routed experts: I8 packed FP4 [out, in/2] + F8_E8M0
// [out, in/32] (expert_dtype "fp8": FP8 like the dense linears); hash layers carry tid2eid (I64), others gate.bias.
// (tests/common/replica.h keeps an independent copy of these rules, derived from the JSON, to test the loader.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "format/dtype.h"
#include "loader/config.h"

namespace dsv4 {

struct TensorSpec {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

// The main model's tensors, plus the drafter's when with_drafter (the MTP block, or the DSpark stages and heads when
// the config has dspark_* keys).
std::vector<TensorSpec> checkpoint_layout(const ModelConfig& cfg, bool with_drafter);

}  // namespace dsv4
