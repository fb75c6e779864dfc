// Byte equality of two arrays (floats compared bitwise), the first difference reported as a gtest failure.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace dsv4::test {

template <class T>
void expect_bitwise_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what << " size";
  if (got.empty() || std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0) return;
  size_t i = 0;
  while (std::memcmp(&got[i], &want[i], sizeof(T)) == 0) ++i;
  ADD_FAILURE() << what << "[" << i << "] of " << got.size() << ": " << got[i] << ", expected " << want[i];
}

}  // namespace dsv4::test
