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

namespace dsv4 {

struct DummyCheckpoint {
  std::vector<Buffer> device;                 // device-generated tensor bytes
  std::vector<std::vector<uint8_t>> host;     // host-generated tensor bytes
  std::unique_ptr<SafetensorsSet> set;        // TensorInfos over both
  std::unordered_set<const TensorInfo*> on_device;  // tensors whose data pointer is device memory
  uint64_t device_bytes = 0, host_bytes = 0;
};

// The main model's tensors of `cfg` (no MTP). Throws dsv4::Error (naming the bytes) when they do not fit the
// backend's free memory, before allocating.
DummyCheckpoint make_dummy_checkpoint(const ModelConfig& cfg, Backend& be, uint64_t seed, bool with_mtp = false);

// `cfg` keeping only its first n main layers (the MTP entries of compress_ratios stay); n >= num_hidden_layers keeps
// everything.
ModelConfig keep_first_layers(const ModelConfig& cfg, int n);

}  // namespace dsv4
