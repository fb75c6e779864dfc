// Where each routed expert of each main layer lives (issue 11): on the model's device, or in host memory where the
// CPU runs it (model/split_moe.h). Attention, the shared expert, the router, mHC, the head and the MTP block stay
// on the device. The CLI options (generate, chat, serve, logprobs, bench):
//   --cpu-moe              every routed expert on the CPU
//   --n-cpu-moe N          the routed experts of the last N main layers on the CPU (0 .. num_hidden_layers)
//   --gpu-experts auto|N   auto: as many experts on the device as its free memory holds after the other weights
//                          and a reserve for the state pool and workspaces (placement_reserve_bytes); N: N experts
//                          of every layer on the device
//   --hot-experts FILE     an expert-usage profile (`dsv4 profile-experts`): the device gets the most used experts
//                          (counts across all layers, highest first) instead of whole layers from the first; implies
//                          --gpu-experts auto unless N is given, where each layer keeps its N most used
// Without a profile, auto fills whole layers from the first (the last layers go to the CPU, as --n-cpu-moe) and
// --gpu-experts N keeps experts 0 .. N-1. On a CPU backend the "device" is the CPU too: the same split runs with a
// second CPU executor (tests).
//
// Profile file (JSON, written by `dsv4 profile-experts`, read by --hot-experts):
//   {"format": "dsv4-expert-profile", "version": 1, "model": NAME, "prompts": N, "tokens": T,
//    "n_layers": L, "n_experts": E, "top_k": K, "hidden_size": D, "vocab_size": V,
//    "counts": [[c_0, ..., c_{E-1}], ...  one row per layer]}
// counts[l][e] = (token, slot) pairs routed to expert e of main layer l. A profile recorded on another model is a
// one-line error naming the difference: other layer or expert counts, another top_k, hidden_size or vocab_size
// (these three, and n_layers / n_experts, are checked where the file has them: older profiles lack the last two),
// or n_layers / n_experts that disagree with the counts (an edited file). NAME (the model folder's name) is not
// checked: the same model may live in folders of other names.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loader/config.h"

namespace dsv4 {

struct PlacementOptions {
  bool cpu_moe = false;
  int n_cpu_moe = -1;       // < 0: not given
  std::string gpu_experts;  // "" | "auto" | a count per layer
  std::string hot_experts;  // profile file, or ""
  // How split layers run calls with many tokens (model/expert_staging.h; not a placement: any() ignores them):
  // calls of at least stage_tokens tokens stream the layer's CPU experts to the device and run them there
  // (--stage-tokens; < 0: auto, the cost model's choice on a GPU, never on the CPU backend; 0: never), through two
  // device buffers of stage_bytes each (--stage-mib; at least one expert).
  int64_t stage_tokens = -1;
  int64_t stage_bytes = int64_t(256) << 20;
  bool any() const { return cpu_moe || n_cpu_moe >= 0 || !gpu_experts.empty() || !hot_experts.empty(); }
};

struct ExpertProfile {
  std::string model;
  int64_t prompts = 0, tokens = 0, top_k = 0;
  int64_t hidden_size = 0, vocab_size = 0;  // of the profiled model; 0: not recorded (checked when > 0)
  std::vector<std::vector<uint64_t>> counts;  // [layer][expert]
};

// Reads / writes the JSON format above. Throws dsv4::Error (one line, naming the file) on a bad file.
ExpertProfile read_expert_profile(const std::filesystem::path& file);
void write_expert_profile(const ExpertProfile& p, const std::filesystem::path& file);

struct ExpertPlacement {
  std::vector<std::vector<uint8_t>> on_device;  // [main layer][expert], 1 = device; empty: everything on the device
  bool all_device() const;
  bool on_host(int layer, int64_t e) const {
    return layer >= 0 && size_t(layer) < on_device.size() && on_device[size_t(layer)][size_t(e)] == 0;
  }
  int64_t n_host() const;         // routed experts on the host
  int64_t n_host(int layer) const;
  int64_t n_total() const;
  std::string summary() const;    // e.g. "routed experts: 9984 on the device, 1024 on the CPU (layers 39-42)"
};

// Bytes of the device that --gpu-experts auto leaves free for the state pool and the workspaces of ubatch tokens
// (with routed experts on the CPU, the staging buffers come on top: SplitMoe::staging_device_bytes).
uint64_t placement_reserve_bytes(const ModelConfig& cfg, int64_t ubatch);

// What the options alone and cfg refute: more than one way of placing (--cpu-moe, --n-cpu-moe, --gpu-experts /
// --hot-experts), --n-cpu-moe beyond cfg's layers, --gpu-experts N beyond its routed experts or neither auto nor a
// number. Throws dsv4::UsageError (one line; the CLI's exit 2): the CLI checks before it loads the model, and
// resolve_placement checks again.
void check_placement(const ModelConfig& cfg, const PlacementOptions& o);

// The placement of `o` for cfg's main layers. expert_bytes: device bytes of one routed expert (w1 + w2 + w3 with
// scales); auto_budget: device bytes --gpu-experts auto may fill with routed experts (free memory - every other
// weight - the reserve; may be negative). Throws what check_placement throws, and dsv4::Error (one line) for a
// profile that does not match the model or a placement that cannot fit.
ExpertPlacement resolve_placement(const ModelConfig& cfg, const PlacementOptions& o, uint64_t expert_bytes,
                                  int64_t auto_budget);

}  // namespace dsv4
