// Randomized header fuzzing: 20,000 mutations of a valid shard header (fixed seed) must each either parse into
// tensors that lie inside the file or throw dsv4::Error — never crash, hang or throw anything else.
// A further 600 mutated files (length prefix included) go through SafetensorsSet::open.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <random>

#include "common/replica.h"
#include "core/error.h"
#include "loader/safetensors.h"

namespace dsv4 {
namespace {
using namespace dsv4::testing;

std::string read_header(const std::filesystem::path& p, uint64_t& file_size) {
  std::ifstream f(p, std::ios::binary);
  uint8_t len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  std::string h(n, '\0');
  f.read(h.data(), std::streamsize(n));
  file_size = std::filesystem::file_size(p);
  return h;
}

std::string mutate(const std::string& base, std::mt19937_64& rng) {
  static const std::string kTokens[] = {"{", "}", "[", "]", "\"", ",", ":", "0", "-1", "1e308", "18446744073709551615",
                                        "99999999999999999999999", "null", "true", "\"F8_E4M3\"", "\"I64\"",
                                        "\"data_offsets\"", "\"shape\"", "\"dtype\"", "\\u0000", "\xff", " ", "[0,0]"};
  std::string s = base;
  const int n_ops = 1 + int(rng() % 4);
  for (int k = 0; k < n_ops; ++k) {
    if (s.empty()) s.assign(1, '{');
    const size_t pos = rng() % s.size();
    switch (rng() % 7) {
      case 0: s[pos] = char(rng() & 0xFF); break;                                     // random byte
      case 1: s.insert(pos, kTokens[rng() % std::size(kTokens)]); break;               // structural token
      case 2: s.erase(pos, 1 + rng() % 16); break;                                     // delete a span
      case 3: s.resize(pos); break;                                                    // truncate
      case 4: {                                                                        // duplicate a span
        const size_t len = std::min<size_t>(1 + rng() % 64, s.size() - pos);
        s.insert(rng() % s.size(), s.substr(pos, len));
        break;
      }
      case 5: {                                                                        // change a digit
        const size_t d = s.find_first_of("0123456789", pos);
        if (d != std::string::npos) s[d] = char('0' + rng() % 10);
        break;
      }
      default: {                                                                       // swap two bytes
        const size_t q = rng() % s.size();
        std::swap(s[pos], s[q]);
      }
    }
  }
  return s;
}

class HeaderFuzz : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto cj = tiny_config(read_json_file(configs_dir() / "deepseek-v4-flash-config.json"));
    ReplicaOptions o;
    o.n_shards = 24;  // small shards: a few KB of header each; fuzz the largest
    write_replica(dir_.path, cj, v4_layout(cj), o);
    for (int s = 0; s < 24; ++s) {
      uint64_t size = 0;
      std::string h = read_header(dir_.path / shard_name(s, 24), size);
      if (h.size() > header_.size()) header_ = std::move(h), file_size_ = size;
    }
    ASSERT_GT(header_.size(), 1000u);
  }
  TempDir dir_;
  std::string header_;
  uint64_t file_size_ = 0;
};

TEST_F(HeaderFuzz, ParseHeaderNeverCrashes) {
  std::vector<TensorInfo> ok_once;
  SafetensorsSet::parse_header(header_, file_size_, "base", ok_once);  // the unmutated header is valid
  ASSERT_FALSE(ok_once.empty());
  std::mt19937_64 rng(20261201);
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::string h = mutate(header_, rng);
    // file size: usually the real one, sometimes smaller than the header claims
    const uint64_t fsize = (i % 5 == 0) ? 8 + h.size() + rng() % 64 : std::max<uint64_t>(file_size_, 8 + h.size());
    std::vector<TensorInfo> out;
    try {
      SafetensorsSet::parse_header(h, fsize, "fuzz", out);
      ++accepted;
      for (const auto& t : out) {
        ASSERT_LE(t.file_offset + t.nbytes, fsize) << t.name;
        ASSERT_GE(t.file_offset, 8 + h.size());
      }
    } catch (const Error& e) {
      ++rejected;
      ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
  EXPECT_GT(rejected, 10000);  // most mutations break something
  EXPECT_GT(accepted, 100);    // and some survive (e.g. digit changes inside names)
}

TEST_F(HeaderFuzz, OpenMutatedFilesNeverCrashes) {
  std::mt19937_64 rng(7);
  const auto path = dir_.path / "fuzz";
  std::filesystem::create_directories(path);
  int rejected = 0;
  for (int i = 0; i < 600; ++i) {
    std::string h = (i % 3 == 0) ? header_ : mutate(header_, rng);
    uint64_t n = h.size();
    if (i % 3 == 0) n = rng() % 3 == 0 ? rng() : n + int64_t(rng() % 64) - 32;  // lie about the length
    const uint64_t data = file_size_ - 8 - header_.size();
    {
      int fd = ::open((path / "model.safetensors").c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
      ASSERT_GE(fd, 0);
      uint8_t len[8];
      for (int b = 0; b < 8; ++b) len[b] = uint8_t(n >> (8 * b));
      ASSERT_EQ(::write(fd, len, 8), 8);
      ASSERT_EQ(::write(fd, h.data(), h.size()), ssize_t(h.size()));
      ASSERT_EQ(::ftruncate(fd, off_t(8 + h.size() + (i % 4 == 0 ? data / 2 : data))), 0);
      ::close(fd);
    }
    try {
      SafetensorsSet s = SafetensorsSet::open(path);
      for (const auto& t : s.tensors()) {
        // touching the first and last byte of every accepted tensor must be safe
        if (t.nbytes) {
          volatile uint8_t x = t.data[0] ^ t.data[t.nbytes - 1];
          (void)x;
        }
      }
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 300);
}

}  // namespace
}  // namespace dsv4
