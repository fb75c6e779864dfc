// Guarded JSON parsing for untrusted files (config.json, the safetensors index, shard headers): rejects nesting
// deeper than `max_depth` before parsing (deep nesting would otherwise recurse without bound when printed) and turns
// every parse failure into a one-line dsv4::Error "<label>: malformed <what> JSON: <detail>".
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dsv4 {

nlohmann::json parse_json_text(std::string_view text, const std::string& label, const char* what, int max_depth = 64);

}  // namespace dsv4
