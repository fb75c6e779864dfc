// The --device option shared by generate, chat, serve, logprobs and bench: "cpu", "cuda" or "cuda:N".
// Default: cuda:0 when this build has CUDA and a GPU is present, else cpu; the choice is printed on stderr.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "backend/backend.h"
#include "core/device.h"
#include "core/error.h"

namespace dsv4::cli {

// Also adds --deterministic (process-wide, backend.h set_cuda_deterministic): on CUDA, results bitwise equal to the
// CPU backend through the kernels that repeat its summation order (slower); without it the fast kernels run.
inline void add_device_option(CLI::App& app, std::string& device) {
  // Checked while parsing (a usage error, exit 2, before any model is loaded); an empty value is an error too.
  app.add_option("--device", device, "cpu | cuda | cuda:N (default: cuda:0 if built with CUDA and a GPU is present, "
                                     "else cpu)")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            return parse_device(s) ? std::string() : fmt::format("must be cpu, cuda or cuda:N (got '{}')", s);
          },
          "DEVICE"));
  app.add_flag_callback("--deterministic", [] { set_cuda_deterministic(true); },
                        "CUDA: bitwise equal to the CPU backend (the kernels in the CPU's summation order; slower)");
}

// The device named by `s` (empty: the default). Bad values are one-line errors.
inline Device resolve_device(const std::string& s) {
  if (s.empty()) return default_device();
  const auto d = parse_device(s);
  if (!d) fail("--device must be cpu, cuda or cuda:N (got '{}')", s);
  return *d;
}

}  // namespace dsv4::cli
