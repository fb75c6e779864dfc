#include <gtest/gtest.h>

#include "core/error.h"

TEST(Error, FailFormatsOneLineMessage) {
  try {
    dsv4::fail("tensor {} in {}: bad shape", "layers.0.ffn.gate.weight", "model.safetensors");
    FAIL() << "fail() returned";
  } catch (const dsv4::Error& e) {
    EXPECT_STREQ(e.what(), "tensor layers.0.ffn.gate.weight in model.safetensors: bad shape");
  }
}
