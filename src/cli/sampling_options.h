// The sampling flags shared by `dsv4 generate` and `dsv4 chat` (--temp, --top-p, --top-k, --min-p, --seed) and
// their conversion to SamplingParams (src/sampling/sampling_params.h, which validates the ranges).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>

#include "cli/int_option.h"
#include "core/error.h"
#include "sampling/sampling_params.h"

namespace dsv4::cli {

struct SamplingOptions {
  float temp = 1.0f, top_p = 1.0f, min_p = 0.0f;
  int top_k = 0;
  std::optional<uint64_t> seed;  // none: a random seed

  // SamplingParams with these fields set and the others at their defaults (not yet validated).
  SamplingParams params() const {
    SamplingParams s;
    s.temperature = temp;
    s.top_p = top_p;
    s.top_k = top_k;
    s.min_p = min_p;
    s.seed = seed ? *seed : std::random_device{}();
    return s;
  }
};

// A parse-time check of one sampling flag against SamplingParams::validate's range for its field: an out-of-range
// value is a usage error naming the flag and quoting the value as typed ("--top-p: top_p must be in (0, 1], got 2";
// "--presence-penalty: ... got 1e308", a finite value that would be inf as a float; exit 2, before any model is
// loaded). A value that is not a number is left to the option's own conversion error.
inline CLI::Validator sampling_range(float SamplingParams::*field) {
  return CLI::Validator(
      [field](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return {};
        if (std::string e = SamplingParams::range_error(field, v, s); !e.empty()) return e;
        // in range as typed, but not as the float it is stored in (top_p 1e-50 would be 0)
        const float f = static_cast<float>(v);
        if (std::string e = SamplingParams::range_error(field, f, s); !e.empty())
          return fmt::format("{} ({} as a 32-bit float)", e, f);
        return {};
      },
      "");
}

inline void add_sampling_options(CLI::App& app, SamplingOptions& o) {
  app.add_option("--temp", o.temp, "temperature (0 = greedy; default 1)")
      ->check(sampling_range(&SamplingParams::temperature));
  app.add_option("--top-p", o.top_p, "nucleus sampling mass (default 1 = off)")
      ->check(sampling_range(&SamplingParams::top_p));
  app.add_option("--top-k", o.top_k, "keep the k most likely tokens (default 0 = off; -1 = off)")
      ->transform(dsv4::cli::integer_in<int64_t>(-1, 1 << 30));
  app.add_option("--min-p", o.min_p, "drop tokens below min_p * p_max (default 0 = off)")
      ->check(sampling_range(&SamplingParams::min_p));
  app.add_option_function<uint64_t>(
         "--seed", [&o](const uint64_t& v) { o.seed = v; }, "random seed, 0 .. 2^64 - 1 (default: random)")
      ->transform(integer_in<uint64_t>(0, std::numeric_limits<uint64_t>::max()));
}

}  // namespace dsv4::cli
