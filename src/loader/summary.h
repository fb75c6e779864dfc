// CheckpointSummary: parameter / byte accounting of a bound checkpoint (used by `dsv4 info`).
// Parameter rule: every tensor's elements count, except block-scale tensors (name ending ".scale"); packed FP4
// (I8 tensors) count 2 parameters per byte; tid2eid is included. "main" excludes every `mtp.*` tensor.
// V4-Flash: params_main = 284,334,567,511, bytes_total = 159,609,485,896 (spec §2.4).
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "loader/config.h"
#include "loader/safetensors.h"
#include "loader/weights.h"

namespace dsv4 {

struct CheckpointSummary {
  int64_t params_main = 0;        // all non-mtp.* tensors
  int64_t params_mtp = 0;         // mtp.* tensors (MTP module or DSpark drafter)
  int64_t params_total = 0;       // params_main + params_mtp
  int64_t params_routed = 0;      // routed experts of the main layers (part of params_main)
  int64_t params_active = 0;      // per token: params_main - params_routed + params_routed * top-k / n_routed_experts
  uint64_t bytes_total = 0;       // sum of tensor data bytes (== index metadata.total_size)
  uint64_t bytes_main = 0;
  std::map<std::string, uint64_t> bytes_by_dtype;     // "BF16" -> bytes
  std::map<std::string, int64_t> weights_by_format;   // bound WeightRefs per weight_format_name()
  size_t n_tensors = 0;
  size_t n_files = 0;
};

// Parameters of one tensor under the rule above.
int64_t tensor_params(const TensorInfo& t);

CheckpointSummary summarize(const SafetensorsSet& set, const ModelConfig& cfg, const ModelWeights& w);

}  // namespace dsv4
