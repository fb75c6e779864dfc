// The committed tiny checkpoints (tests/data/tiny-a, tiny-b) are exactly what tools/oracle/make_tiny_models.py
// generates: regenerate them into a temporary folder (pure-stdlib Python) and compare every file byte for byte.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "common/run_child.h"

namespace {
namespace fs = std::filesystem;
using namespace dsv4::clitest;

std::set<std::string> file_names(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

TEST(TinyModels, CommittedFilesAreReproducible) {
  if (std::system("command -v python3 >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found";
  const fs::path root = DSV4_SOURCE_DIR;
  const fs::path out = scratch_dir("tiny_models");
  fs::remove_all(out);
  fs::create_directories(out);
  const std::string cmd = "python3 '" + (root / "tools/oracle/make_tiny_models.py").string() + "' --out '" +
                          out.string() + "' > '" + (out / "log.txt").string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << cmd << "\n" << slurp(out / "log.txt");
  for (const std::string name : {"tiny-a", "tiny-b"}) {
    const fs::path want = root / "tests/data" / name, got = out / name;
    ASSERT_TRUE(fs::is_directory(got)) << name << " was not generated";
    const auto names = file_names(want);
    EXPECT_EQ(file_names(got), names) << name;
    EXPECT_TRUE(names.count("config.json") && names.count("model.safetensors")) << name;
    for (const auto& f : names) {
      if (!fs::exists(got / f)) continue;  // reported by the name comparison
      EXPECT_EQ(fs::file_size(got / f), fs::file_size(want / f)) << name << "/" << f;
      // Compare as strings (binary-safe: slurp reads through a stringstream); avoid printing megabytes on failure.
      const bool same = slurp(got / f) == slurp(want / f);
      EXPECT_TRUE(same) << name << "/" << f << " differs from the regenerated file; rerun "
                        << "`python3 tools/oracle/make_tiny_models.py --out tests/data` and commit, or fix the script";
    }
  }
  fs::remove_all(out);
}

}  // namespace
