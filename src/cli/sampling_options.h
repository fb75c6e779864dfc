// The sampling flags shared by `dsv4 generate` and `dsv4 chat` (--temp, --top-p, --top-k, --min-p, --seed) and
// their conversion to SamplingParams (src/sampling/sampling_params.h, which validates the ranges).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <random>

#include "sampling/sampling_params.h"

namespace dsv4::cli {

struct SamplingOptions {
  float temp = 1.0f, top_p = 1.0f, min_p = 0.0f;
  int top_k = 0;
  int64_t seed = -1;  // < 0: a random seed

  // SamplingParams with these fields set and the others at their defaults (not yet validated).
  SamplingParams params() const {
    SamplingParams s;
    s.temperature = temp;
    s.top_p = top_p;
    s.top_k = top_k;
    s.min_p = min_p;
    s.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
    return s;
  }
};

inline void add_sampling_options(CLI::App& app, SamplingOptions& o) {
  app.add_option("--temp", o.temp, "temperature (0 = greedy; default 1)");
  app.add_option("--top-p", o.top_p, "nucleus sampling mass (default 1 = off)");
  app.add_option("--top-k", o.top_k, "keep the k most likely tokens (default 0 = off; -1 = off)")
      ->check(CLI::Range(-1, 1 << 30));
  app.add_option("--min-p", o.min_p, "drop tokens below min_p * p_max (default 0 = off)");
  app.add_option("--seed", o.seed, "random seed (default: random)");
}

}  // namespace dsv4::cli
