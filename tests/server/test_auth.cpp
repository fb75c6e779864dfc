// API-key helpers: constant-time comparison, the key a request presents, key files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "server/auth.h"

using namespace dsv4;

TEST(Auth, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("sekret", "sekret"));
  for (const char* bad : {"", "s", "sekre", "sekreT", "sekrett", "xekret", "sekret\n"})
    EXPECT_FALSE(constant_time_equal(bad, "sekret")) << bad;
  EXPECT_FALSE(constant_time_equal("", ""));  // an empty key never matches
}

TEST(Auth, PresentedKey) {
  EXPECT_EQ(presented_api_key("Bearer abc", ""), "abc");
  EXPECT_EQ(presented_api_key("bearer   abc  ", ""), "abc");
  EXPECT_EQ(presented_api_key("", "xyz"), "xyz");
  EXPECT_EQ(presented_api_key("Basic abc", "xyz"), "xyz");
  EXPECT_EQ(presented_api_key("abc", ""), "");
  EXPECT_EQ(presented_api_key("Bearer abc", "xyz"), "abc");
}

TEST(Auth, KeyFile) {
  const auto dir = std::filesystem::temp_directory_path() / "dsv4_auth_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "k") << "  the-key \nsecond line\n";
  EXPECT_EQ(read_api_key_file(dir / "k"), "the-key");
  std::ofstream(dir / "empty") << "\n";
  EXPECT_THROW(read_api_key_file(dir / "empty"), Error);
  EXPECT_THROW(read_api_key_file(dir / "missing"), Error);
  std::filesystem::remove_all(dir);
}
