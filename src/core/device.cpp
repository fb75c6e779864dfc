#include "core/device.h"

#include <charconv>

namespace dsv4 {

std::string Device::name() const { return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index); }

std::optional<Device> parse_device(std::string_view s) {
  if (s == "cpu") return Device{DeviceKind::cpu, 0};
  if (s == "cuda") return Device{DeviceKind::cuda, 0};
  constexpr std::string_view kPrefix = "cuda:";
  if (s.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::string_view num = s.substr(kPrefix.size());
  if (num.empty() || num.size() > 4) return std::nullopt;
  int idx = 0;
  const auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), idx);
  if (ec != std::errc() || p != num.data() + num.size() || idx < 0) return std::nullopt;
  return Device{DeviceKind::cuda, idx};
}

}  // namespace dsv4
