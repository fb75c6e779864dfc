// Byte sizes of --kv-memory / --cache-size (cli/byte_size.h).
#include <gtest/gtest.h>

#include "cli/byte_size.h"

using dsv4::cli::ByteSize;
using dsv4::cli::Fraction;
using dsv4::cli::parse_byte_size;

TEST(ByteSize, UnitsAndFractions) {
  auto bytes = [](const char* s) { return std::get<uint64_t>(parse_byte_size(s, "--x", true)); };
  EXPECT_EQ(bytes("1073741824"), uint64_t(1) << 30);
  EXPECT_EQ(bytes("512M"), uint64_t(512) << 20);
  EXPECT_EQ(bytes("8G"), uint64_t(8) << 30);
  EXPECT_EQ(bytes("8g"), uint64_t(8) << 30);
  EXPECT_EQ(bytes("1.5GiB"), uint64_t(3) << 29);
  EXPECT_EQ(bytes("2TB"), uint64_t(2) << 40);
  EXPECT_EQ(bytes("64K"), uint64_t(64) << 10);
  EXPECT_EQ(bytes("1"), 1u);  // no decimal point: bytes
  const ByteSize f = parse_byte_size("0.9", "--x", true);
  ASSERT_TRUE(std::holds_alternative<Fraction>(f));
  EXPECT_DOUBLE_EQ(std::get<Fraction>(f).value, 0.9);
  EXPECT_TRUE(std::holds_alternative<Fraction>(parse_byte_size("1.0", "--x", true)));
  EXPECT_THROW(parse_byte_size("0.5", "--x", false), dsv4::Error);  // no fraction allowed: half a byte
  // a decimal number above 1 is neither a fraction nor a whole byte count: a clear error, not a truncated size
  for (const char* bad : {"1.5", "2.0"}) {
    try {
      parse_byte_size(bad, "--x", true);
      ADD_FAILURE() << bad << " accepted";
    } catch (const dsv4::Error& e) {
      EXPECT_NE(std::string(e.what()).find("(0, 1]"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_byte_size("2.5", "--x", false), dsv4::Error);
  for (const char* bad : {"", "lots", "-1G", "0", "8X", "8GX", "G", "nan", "1e30G"})
    EXPECT_THROW(parse_byte_size(bad, "--x", true), dsv4::Error) << bad;
}
