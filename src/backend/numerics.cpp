#include "backend/numerics.h"

namespace dsv4 {

std::string_view numerics_name(Numerics n) { return n == Numerics::reference ? "reference" : "dense"; }

std::optional<Numerics> parse_numerics(std::string_view s) {
  if (s == "reference") return Numerics::reference;
  if (s == "dense") return Numerics::dense;
  return std::nullopt;
}

}  // namespace dsv4
