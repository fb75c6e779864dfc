// Where tensors live and ops run: the host CPU or one CUDA GPU. Parsed from the CLI's --device value.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace dsv4 {

enum class DeviceKind { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;  // CUDA device ordinal (0 for the CPU)

  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  // "cpu" or "cuda:N".
  std::string name() const;
  friend bool operator==(const Device&, const Device&) = default;
};

// "cpu", "cuda" (= cuda:0) or "cuda:N" (N a decimal ordinal); std::nullopt for anything else.
std::optional<Device> parse_device(std::string_view s);

}  // namespace dsv4
