// Byte sizes on the command line (--kv-memory, --cache-size): "1073741824", "512M", "8G", "1.5GiB", "2T" (binary
// multiples: K = 1024), or — where a fraction is allowed — a number in (0, 1] without a unit ("0.9"), returned as
// the fraction for the caller to scale.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <variant>

#include "core/error.h"

namespace dsv4::cli {

struct Fraction {
  double value = 0;
};
using ByteSize = std::variant<uint64_t, Fraction>;

// Throws dsv4::Error naming `flag` for anything else (negative, zero, unknown unit, overflow).
inline ByteSize parse_byte_size(const std::string& s, const char* flag, bool allow_fraction) {
  const char* p = s.c_str();
  char* end = nullptr;
  const double v = std::strtod(p, &end);
  if (end == p || !std::isfinite(v) || v <= 0) usage_fail("{} must be a positive size such as 8G or 512M (got '{}')", flag, s);
  std::string unit(end);
  for (auto& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (unit.empty() && s.find('.') != std::string::npos) {  // "1.5": a fraction, or a byte count that is not whole
    if (allow_fraction && v <= 1.0) return Fraction{v};
    if (allow_fraction) usage_fail("{}: a fraction must be in (0, 1] (got '{}'; for a size give a unit: {}G)", flag, s, s);
    if (v != std::floor(v)) usage_fail("{}: '{}' is not a whole number of bytes (give a unit: K, M, G or T)", flag, s);
  }
  if (unit.size() > 1 && unit.substr(1) != "B" && unit.substr(1) != "IB")
    usage_fail("{}: unknown unit in '{}' (use K, M, G or T)", flag, s);
  double mult = 1;
  switch (unit.empty() ? 'B' : unit[0]) {
    case 'B': mult = unit.size() > 1 ? 0 : 1; break;
    case 'K': mult = 1024.0; break;
    case 'M': mult = 1024.0 * 1024; break;
    case 'G': mult = 1024.0 * 1024 * 1024; break;
    case 'T': mult = 1024.0 * 1024 * 1024 * 1024; break;
    default: mult = 0;
  }
  if (mult == 0) usage_fail("{}: unknown unit in '{}' (use K, M, G or T)", flag, s);
  const double bytes = v * mult;
  if (bytes < 1 || bytes > 1.8e19) usage_fail("{}: '{}' is out of range (1 byte to 16 EiB)", flag, s);
  return uint64_t(bytes);
}

}  // namespace dsv4::cli
