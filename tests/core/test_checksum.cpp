// XXH64 (core/checksum.h) equals the reference implementation (values from Debian's libxxhash 0.8.1, XXH64()).
#include <gtest/gtest.h>

#include <vector>

#include "core/checksum.h"

using namespace dsv4;

TEST(Checksum, Xxh64EqualsTheReferenceOnEveryTailLength) {
  std::vector<unsigned char> b(1000);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>(i * 7 + 3);
  struct Case {
    size_t n;
    uint64_t seed0, seed42;
  };
  // lengths exercise the 32-byte stripes, the 8-, 4- and 1-byte tails
  const Case cases[] = {
      {0, 0xef46db3751d8e999ull, 0x98b1582b0977e704ull},   {1, 0x1f25c8d0bc1f4bb6ull, 0x4d71bef0290052dbull},
      {3, 0x31d2363f52e564c9ull, 0xbf4dd3c814a1fb9eull},   {4, 0x9bb64b7d66ee9fdaull, 0xbcb54295ab591e0dull},
      {7, 0x9a7b149959ce60d8ull, 0x9ce59c3ac76ffc9dull},   {8, 0xdab99d95c6f90092ull, 0x9fe8789ac2a1a649ull},
      {31, 0xa2aa5f33cc4a6119ull, 0x10ab8a7706d8ba37ull},  {32, 0x23c3c17ef790fd97ull, 0x232e8071e826d4bfull},
      {33, 0x50a7cfc7ba588784ull, 0x9d08407e35697b1full},  {100, 0xa61f8d4c170fe531ull, 0x7dd00be8513c25a2ull},
      {1000, 0x5f235fa033f1a3fbull, 0xd776e8028586ff61ull},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(xxh64(b.data(), c.n), c.seed0) << c.n;
    EXPECT_EQ(xxh64(b.data(), c.n, 42), c.seed42) << c.n;
  }
}

TEST(Checksum, Xxh64ChangesWithAnyFlippedByte) {
  std::vector<unsigned char> b(300, 0x5a);
  const uint64_t h = xxh64(b.data(), b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] ^= 0x01;
    EXPECT_NE(xxh64(b.data(), b.size()), h) << i;
    b[i] ^= 0x01;
  }
}
