#include "backend/profiled_ops.h"

#include <chrono>
#include <string_view>

namespace dsv4 {

void ProfiledOps::around(const OpCall& call, OpBody body) const {
  be_.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  body();
  be_.synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string_view name = call.weight ? linear_op_name(LinearOp::linear, *call.weight) : call.op;
  auto it = times_.find(name);
  if (it == times_.end()) it = times_.emplace(std::string(name), Entry{}).first;
  it->second.seconds += seconds;
  ++it->second.calls;
}

}  // namespace dsv4
