// The routed-expert placement options shared by generate, chat, serve, logprobs and bench (issue 11;
// model/expert_placement.h): --cpu-moe, --n-cpu-moe N, --gpu-experts auto|N, --hot-experts FILE.
#pragma once
#include <CLI/CLI.hpp>

#include "cli/numerics_option.h"
#include "model/expert_placement.h"

namespace dsv4::cli {

inline void add_placement_options(CLI::App& app, PlacementOptions& p) {
  app.add_flag("--cpu-moe", p.cpu_moe,
               "every routed expert on the CPU (host memory); attention, shared experts, router, mHC and head stay "
               "on the device");
  app.add_option("--n-cpu-moe", p.n_cpu_moe, "the routed experts of the last N layers on the CPU")
      ->check(CLI::Range(0, 1 << 16));  // a negative N is an error, not "not given"
  app.add_option("--gpu-experts", p.gpu_experts,
                 "auto: as many routed experts on the device as its free memory holds (after the other weights and "
                 "room for state and workspaces), the rest on the CPU; N: N experts per layer on the device")
      ->check(CLI::Validator(check_gpu_experts, "auto|N"));
  app.add_option("--hot-experts", p.hot_experts,
                 "expert-usage profile (dsv4 profile-experts): the most used experts go on the device (implies "
                 "--gpu-experts auto)");
}

}  // namespace dsv4::cli
