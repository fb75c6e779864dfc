#include "sampling/sampling_params.h"

#include <cmath>

#include "core/error.h"

namespace dsv4 {

void SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f || temperature > 100.0f)
    fail("temperature must be in [0, 100], got {}", temperature);
  if (!std::isfinite(top_p) || top_p <= 0.0f || top_p > 1.0f) fail("top_p must be in (0, 1], got {}", top_p);
  if (!std::isfinite(min_p) || min_p < 0.0f || min_p > 1.0f) fail("min_p must be in [0, 1], got {}", min_p);
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f || repetition_penalty > 10.0f)
    fail("repetition_penalty must be in (0, 10], got {}", repetition_penalty);
  if (!std::isfinite(presence_penalty) || presence_penalty < -2.0f || presence_penalty > 2.0f)
    fail("presence_penalty must be in [-2, 2], got {}", presence_penalty);
  if (!std::isfinite(frequency_penalty) || frequency_penalty < -2.0f || frequency_penalty > 2.0f)
    fail("frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
}

}  // namespace dsv4
