// Decode-state accounting (spec §6; fp32 rows).
#include <gtest/gtest.h>

#include "common/replica.h"
#include "loader/config.h"
#include "loader/state_size.h"

namespace dsv4 {
namespace {

TEST(StateSize, Flash) {
  const ModelConfig c = load_config(testing::configs_dir() / "deepseek-v4-flash-config.json");
  // 21 CSA x (512 + 128) x 4 B / 4 + 20 HCA x 512 x 4 B / 128  (twice spec §6.2's bf16 6,880 B)
  EXPECT_DOUBLE_EQ(state_bytes_per_token(c), 13760.0);
  // rings 43 x 128 x 512 x 4 + CSA 21 x (2x8x1024 + 2x8x256) x 4 + HCA 20 x 2x128x512 x 4
  EXPECT_EQ(state_bytes_fixed_per_sequence(c), 23478272u);
  // compressor part alone is spec §6.2's 11.64 MiB
  EXPECT_NEAR((23478272.0 - 43.0 * 128 * 512 * 4) / (1 << 20), 11.64, 0.005);
  EXPECT_EQ(state_bytes_growing(c, 0), 0u);
  EXPECT_EQ(state_bytes_growing(c, 3), 0u);
  EXPECT_EQ(state_bytes_growing(c, 4), 21u * (512 + 128) * 4);
  EXPECT_EQ(state_bytes_growing(c, 1000), 21u * 250 * (512 + 128) * 4 + 20u * 7 * 512 * 4);
  EXPECT_EQ(state_bytes_total(c, 128 * 1024),
            state_bytes_fixed_per_sequence(c) + uint64_t(state_bytes_per_token(c) * 128 * 1024));
  // MTP layer adds one more ring
  EXPECT_EQ(state_bytes_fixed_per_sequence(c, true) - state_bytes_fixed_per_sequence(c), 128u * 512 * 4);
}

TEST(StateSize, Pro) {
  const ModelConfig c = load_config(testing::configs_dir() / "deepseek-v4-pro-config.json");
  EXPECT_DOUBLE_EQ(state_bytes_per_token(c), 2 * 9848.0);  // spec §6.2: 9,848 B/token in bf16
}

}  // namespace
}  // namespace dsv4
