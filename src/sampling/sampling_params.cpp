#include "sampling/sampling_params.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace dsv4 {

namespace {

// The range of each float field: [lo, hi], or (lo, hi] when lo_open.
struct FieldRange {
  float SamplingParams::*field;
  const char* name;
  double lo, hi;
  bool lo_open;
};

constexpr FieldRange kRanges[] = {
    {&SamplingParams::temperature, "temperature", 0, 100, false},
    {&SamplingParams::top_p, "top_p", 0, 1, true},
    {&SamplingParams::min_p, "min_p", 0, 1, false},
    {&SamplingParams::repetition_penalty, "repetition_penalty", 0, 10, true},
    {&SamplingParams::presence_penalty, "presence_penalty", -2, 2, false},
    {&SamplingParams::frequency_penalty, "frequency_penalty", -2, 2, false},
};

std::string check(const FieldRange& r, double value, std::string_view shown) {
  const bool ok = std::isfinite(value) && (r.lo_open ? value > r.lo : value >= r.lo) && value <= r.hi;
  if (ok) return {};
  return fmt::format("{} must be in {}{}, {}], got {}", r.name, r.lo_open ? "(" : "[", r.lo, r.hi, shown);
}

}  // namespace

std::string SamplingParams::range_error(float SamplingParams::*field, double value, std::string_view shown) {
  for (const FieldRange& r : kRanges)
    if (r.field == field) return check(r, value, shown);
  return {};
}

void SamplingParams::validate() const {
  for (const FieldRange& r : kRanges) {
    const float v = this->*r.field;
    if (std::string e = check(r, v, fmt::format("{}", v)); !e.empty()) throw Error(e);
  }
}

}  // namespace dsv4
