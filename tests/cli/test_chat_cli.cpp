// `dsv4 chat` driven through stdin (not a terminal): the reply, then the stats line on stderr on a line of its own.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/run_child.h"

namespace {
using dsv4::clitest::ProcResult;
using dsv4::clitest::run_dsv4;
using dsv4::clitest::scratch_dir;
using dsv4::clitest::slurp;

const std::string kDemo = std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo";
const std::vector<std::string> kArgs = {"chat", "-m", kDemo, "-n", "5", "--temp", "0", "--threads", "2"};

// The stats line after a reply ends with a newline and starts a line of its own.
TEST(CliChat, StatsLineIsALineOfItsOwn) {
  const ProcResult r = run_dsv4(kArgs, "chatstats", "hello\n/exit\n");
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t at = r.err.find("[5 tokens, prefill ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const size_t end = r.err.find(']', at);
  ASSERT_NE(end, std::string::npos) << r.err;
  EXPECT_EQ(r.err.substr(end, 2), "]\n") << r.err;
  EXPECT_EQ(r.out.rfind("> ", 0), 0u) << r.out;  // the prompt, then the reply and its newline, then the next prompt
  EXPECT_NE(r.out.find("\n> "), std::string::npos) << r.out;

  // stdout and stderr into one file (`dsv4 chat > log 2>&1`): stdout is block-buffered there, and the reply's newline
  // must reach the file before the stats line does (it used to be glued to the end of the reply).
  const auto dir = scratch_dir("chatmerged");
  const std::string in = (dir / "in.txt").string(), log = (dir / "log.txt").string();
  std::ofstream(in) << "hello\n/exit\n";
  std::string cmd = std::string("'") + DSV4_BINARY + "'";
  for (size_t i = 0; i < kArgs.size(); ++i) cmd += " '" + kArgs[i] + "'";
  cmd += " < '" + in + "' > '" + log + "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string all = slurp(log);
  const size_t s = all.find("[5 tokens, prefill ");
  ASSERT_NE(s, std::string::npos) << all;
  ASSERT_GT(s, 0u);
  EXPECT_EQ(all[s - 1], '\n') << all;
  EXPECT_EQ(all.substr(all.find(']', s), 2), "]\n") << all;
}

}  // namespace
