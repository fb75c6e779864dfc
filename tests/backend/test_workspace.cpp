// Workspace (backend/backend.h): stack-discipline scopes and the furthest-point jump behind Ops::branch_end.
#include <gtest/gtest.h>

#include "backend/cpu_backend.h"

namespace dsv4 {
namespace {

TEST(Workspace, AdvanceToFurthestSkipsReleasedScratch) {
  Workspace& ws = cpu_backend().workspace();
  Workspace::Scope outer(ws);
  char* a = static_cast<char*>(ws.alloc_bytes(1000));
  ws.reset_furthest();
  char* b = nullptr;
  {
    Workspace::Scope inner(ws);
    b = static_cast<char*>(ws.alloc_bytes(5000));
  }
  char* c = static_cast<char*>(ws.alloc_bytes(16));  // released memory is reused (stack discipline)...
  EXPECT_EQ(c, b);
  ws.advance_to(ws.furthest());  // ...unless the caller jumps past the furthest point since reset_furthest()
  char* d = static_cast<char*>(ws.alloc_bytes(16));
  EXPECT_TRUE(d >= b + 5000 || d + 16 <= a) << "d overlaps the released 5000 bytes";
  EXPECT_NE(d, b);
  // advance_to an earlier point does nothing
  const Workspace::Mark m = ws.mark();
  ws.advance_to(Workspace::Mark{});
  EXPECT_EQ(ws.mark().chunk, m.chunk);
  EXPECT_EQ(ws.mark().offset, m.offset);
}

TEST(Workspace, CpuBranchCallsAreInOrderNoOps) {
  const Ops& ops = cpu_backend().ops();
  std::vector<float> x = {1.0f, -2.0f, 4.0f};
  ops.branch_begin();
  ops.scale(x.data(), 3, 2.0f, false);
  ops.branch_end();
  ops.scale(x.data(), 3, 0.5f, false);  // the CPU runs in queue order: both applied, branch first
  ops.branch_join();
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], -2.0f);
  EXPECT_EQ(x[2], 4.0f);
}

}  // namespace
}  // namespace dsv4
