// Weights of a config's exact shapes and formats filled with pseudo-random values, built on the backend's device
// without reading any tensor file (vLLM's `--load-format dummy`): full-size benchmarks without the checkpoint.
// The GEMM weights (FP8 / FP4 codes, their E8M0 scales, BF16 matrices) are generated on the device; the small tensors
// (norms, mHC, ape, sinks, biases, tid2eid) on the host. Values keep activations finite and routing spread: weight
// magnitudes ~ 1/sqrt(in), unit norms, router logits ~N(0, 1), random hash tables.
#pragma once
#include <cstdint>
#include <memory>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "loader/config.h"
#include "loader/safetensors.h"
#include "model/expert_placement.h"

namespace dsv4 {

struct DummyCheckpoint {
  std::vector<Buffer> device;                 // device-generated tensor bytes
  std::vector<std::vector<uint8_t>> host;     // host-generated tensor bytes
  std::vector<std::unique_ptr<uint8_t[]>> host_experts;  // routed experts placed on the CPU (filled on the host)
  std::unique_ptr<SafetensorsSet> set;        // TensorInfos over both
  std::unordered_set<const TensorInfo*> on_device;  // tensors whose data pointer is device memory
  uint64_t device_bytes = 0, host_bytes = 0;
};

// The main model's tensors of `cfg`, plus the drafter's (MTP or DSpark) when with_drafter. The routed experts that
// `placement` puts on the CPU (a GPU backend only) are filled on the host, multi-threaded, with the values the device
// would make. Throws dsv4::Error (naming the bytes) when they do not fit the backend's free memory or the host's,
// before allocating.
DummyCheckpoint make_dummy_checkpoint(const ModelConfig& cfg, Backend& be, uint64_t seed, bool with_drafter = false,
                                      const ExpertPlacement* placement = nullptr);

// Device bytes of the dummy tensors: every one but the main layers' routed experts, and one routed expert.
struct DummyDeviceBytes {
  uint64_t non_expert = 0, one_expert = 0;
};
DummyDeviceBytes dummy_device_bytes(const ModelConfig& cfg, bool with_drafter);

// "layers.L.ffn.experts.E.*" -> true with *layer = L, *expert = E.
bool parse_routed_expert(const std::string& name, int* layer, int64_t* expert);

// `cfg` keeping only its first n main layers (the drafter entries of compress_ratios stay; DSpark target layers move
// with the end of the stack: id - (num_hidden_layers - n), at least 0, duplicates dropped); n >= num_hidden_layers
// keeps everything.
ModelConfig keep_first_layers(const ModelConfig& cfg, int n);

}  // namespace dsv4
