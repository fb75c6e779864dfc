// The --numerics option shared by generate, chat, serve, logprobs, bench and profile-experts, and other enumerated
// flag values: checked while parsing, so a bad value is a usage error (exit 2) before any model is loaded.
#pragma once
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <string>

#include "backend/numerics.h"
#include "core/error.h"

namespace dsv4::cli {

inline CLI::Option* add_numerics_option(CLI::App& app, std::string& numerics, const std::string& help) {
  return app.add_option("--numerics", numerics, help)
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            return parse_numerics(s) ? std::string() : fmt::format("must be reference or dense (got '{}')", s);
          },
          "NUMERICS"));
}

// --load-format of the bench commands: auto | dummy | safetensors.
inline CLI::Option* add_load_format_option(CLI::App& app, std::string& load_format, const std::string& help) {
  return app.add_option("--load-format", load_format, help)
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            return s == "auto" || s == "dummy" || s == "safetensors"
                       ? std::string()
                       : fmt::format("must be auto, dummy or safetensors (got '{}')", s);
          },
          "FORMAT"));
}

// The syntax of --gpu-experts (auto or a whole number); its upper bound (the experts per layer) needs the model.
inline std::string check_gpu_experts(std::string& s) {
  const bool number = !s.empty() && s.size() < 10 &&
                      std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  return s == "auto" || number ? std::string()
                               : fmt::format("must be auto or a number of experts per layer (got '{}')", s);
}

}  // namespace dsv4::cli
