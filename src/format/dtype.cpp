#include "format/dtype.h"

#include <array>
#include <utility>

namespace dsv4 {
namespace {
struct Row {
  DType t;
  std::string_view name;
  size_t size;
};
constexpr std::array<Row, 9> kRows{{{DType::BF16, "BF16", 2},
                                    {DType::F16, "F16", 2},
                                    {DType::F32, "F32", 4},
                                    {DType::I64, "I64", 8},
                                    {DType::I32, "I32", 4},
                                    {DType::I8, "I8", 1},
                                    {DType::U8, "U8", 1},
                                    {DType::F8_E4M3, "F8_E4M3", 1},
                                    {DType::F8_E8M0, "F8_E8M0", 1}}};
}  // namespace

size_t dtype_size(DType t) { return kRows[static_cast<size_t>(t)].size; }
std::string_view dtype_name(DType t) { return kRows[static_cast<size_t>(t)].name; }
std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& r : kRows)
    if (r.name == name) return r.t;
  return std::nullopt;
}

}  // namespace dsv4
