// The routed-expert placement options shared by generate, chat, serve, logprobs and bench (issue 11;
// model/expert_placement.h): --cpu-moe, --n-cpu-moe N, --gpu-experts auto|N, --hot-experts FILE; and how split
// layers run large calls (model/expert_staging.h): --stage-tokens auto|N, --stage-mib M.
#pragma once
#include <algorithm>
#include <cctype>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/int_option.h"
#include "cli/numerics_option.h"
#include "model/expert_placement.h"

namespace dsv4::cli {

inline void add_placement_options(CLI::App& app, PlacementOptions& p) {
  app.add_flag("--cpu-moe", p.cpu_moe,
               "every routed expert on the CPU (host memory); attention, shared experts, router, mHC and head stay "
               "on the device");
  app.add_option("--n-cpu-moe", p.n_cpu_moe, "the routed experts of the last N layers on the CPU")
      ->transform(dsv4::cli::integer_in<int64_t>(0, 1 << 16));  // a negative N is an error, not "not given"
  app.add_option("--gpu-experts", p.gpu_experts,
                 "auto: as many routed experts on the device as its free memory holds (after the other weights and "
                 "room for state and workspaces), the rest on the CPU; N: N experts per layer on the device")
      ->check(CLI::Validator(check_gpu_experts, "auto|N"));
  app.add_option("--hot-experts", p.hot_experts,
                 "expert-usage profile (dsv4 profile-experts): the most used experts go on the device (implies "
                 "--gpu-experts auto)");
  app.add_option_function<std::string>(
         "--stage-tokens",
         [&p](const std::string& v) { p.stage_tokens = v == "auto" ? -1 : std::stoll(v); },
         "layers with routed experts on the CPU: calls of at least N tokens (prefill) copy the layer's CPU experts to "
         "the device and run them there instead of on the CPU (auto: from a PCIe vs CPU cost model, ~227 tokens "
         "for V4-Flash; 0: never)")
      ->check(CLI::Validator(
          [](std::string& s) {
            const bool number = !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) {
              return std::isdigit(static_cast<unsigned char>(c));
            });
            return s == "auto" || number ? std::string()
                                         : "must be auto or a number of tokens (got '" + s + "')";
          },
          "auto|N"));
  app.add_option_function<int64_t>(
         "--stage-mib", [&p](const int64_t& mib) { p.stage_bytes = mib << 20; },
         "MiB of each of the two device buffers the CPU experts are copied through (--stage-tokens; default 256)")
      ->transform(dsv4::cli::integer_in<int64_t>(int64_t(1), int64_t(1) << 20));
}

}  // namespace dsv4::cli
