// `dsv4 generate` end to end: the tiny test model (token ids, no tokenizer) and the demo model (text).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/run_child.h"

namespace {
using namespace dsv4::clitest;
using json = nlohmann::json;

const std::string kTiny = std::string(DSV4_SOURCE_DIR) + "/tests/data/tiny-a";
const std::string kDemo = std::string(DSV4_SOURCE_DIR) + "/models/dsv4-demo";

json run_json(std::vector<std::string> args) {
  args.insert(args.begin(), "generate");
  args.push_back("--json");
  args.push_back("--threads");
  args.push_back("1");
  ProcResult r = run_dsv4(args, "gen");
  EXPECT_EQ(r.code, 0) << r.err;
  return json::parse(r.out);
}

TEST(CliGenerate, TinyModelGreedyJsonIsDeterministic) {
  auto a = run_json({"-m", kTiny, "--prompt-ids", "0,5,7,9", "-n", "6", "--temp", "0"});
  auto b = run_json({"-m", kTiny, "--prompt-ids", "0, 5,7,9", "-n", "6", "--temp", "0"});
  EXPECT_EQ(a["prompt_ids"], json({0, 5, 7, 9}));  // as given: no BOS added
  ASSERT_EQ(a["ids"].size(), 6u);
  EXPECT_EQ(a["ids"], b["ids"]);
  EXPECT_EQ(a["finish_reason"], "length");
  EXPECT_EQ(a["text"], "");  // no tokenizer.json
  for (const char* k : {"prefill_ms", "prefill_tokens_per_s", "decode_ms", "decode_tokens_per_s", "prompt_tokens"})
    EXPECT_TRUE(a["timings"].contains(k)) << k;
  EXPECT_EQ(a["timings"]["prompt_tokens"], 4);
}

// Without -n, generate stops after 128 tokens, and --help says so.
TEST(CliGenerate, DefaultsTo128TokensAndHelpSaysSo) {
  auto j = run_json({"-m", kDemo, "-p", "The Congress of the United States", "--temp", "0"});
  EXPECT_EQ(j["ids"].size(), 128u);
  EXPECT_EQ(j["finish_reason"], "length");
  const ProcResult h = run_dsv4({"generate", "--help"}, "gen_help");
  EXPECT_EQ(h.code, 0);
  const size_t at = h.out.find("--max-tokens");
  ASSERT_NE(at, std::string::npos) << h.out;
  EXPECT_NE(h.out.substr(at, h.out.find('\n', at) - at).find("default 128"), std::string::npos) << h.out;
}

// The README's first command (a contract: its start is fixed) prints the same text on every run: it used to sample
// at temperature 1 with a random seed, so a newcomer saw different text, often ending in odd tokens, each time.
TEST(CliGenerate, TheReadmeFirstCommandIsReproducible) {
  const std::string contract =
      "scripts/setup.sh && build/dsv4 generate -m models/dsv4-demo -p \"The Congress of the United States\" -n 48";
  std::ifstream readme(std::string(DSV4_SOURCE_DIR) + "/README.md");
  std::string line;
  while (std::getline(readme, line) && line.rfind("scripts/setup.sh", 0) != 0) {
  }
  ASSERT_EQ(line.rfind(contract, 0), 0u) << line;
  // the words after "build/dsv4", a double-quoted one as one argument
  std::vector<std::string> args;
  std::istringstream words(line.substr(line.find("build/dsv4 ") + 11));
  for (std::string w; words >> w;) {
    if (w.front() == '"')
      while (w.size() < 2 || w.back() != '"') {
        std::string more;
        ASSERT_TRUE(words >> more) << line;
        w += " " + more;
      }
    args.push_back(w.front() == '"' ? w.substr(1, w.size() - 2) : w == "models/dsv4-demo" ? kDemo : w);
  }
  const ProcResult a = run_dsv4(args, "readme1"), b = run_dsv4(args, "readme2");
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_GT(a.out.size(), 100u) << a.out;
  EXPECT_EQ(a.out, b.out);
  // and it prints what the README shows: the first ```text block after the command
  while (std::getline(readme, line) && line != "```text") {
  }
  std::string shown;
  while (std::getline(readme, line) && line != "```") shown += line + "\n";
  ASSERT_FALSE(shown.empty()) << "no ```text block after the README's first command";
  EXPECT_EQ(a.out, shown) << "the README's example output is not what its first command prints";
}

TEST(CliGenerate, SeededSamplingIsReproducible) {
  std::vector<std::string> base{"-m", kTiny, "--prompt-ids", "0,3", "-n", "12", "--temp", "1.5", "--top-k", "50"};
  auto with_seed = [&](const char* s) {
    auto args = base;
    args.insert(args.end(), {"--seed", s});
    return run_json(args)["ids"];
  };
  EXPECT_EQ(with_seed("11"), with_seed("11"));
  EXPECT_NE(with_seed("11"), with_seed("12"));
  // the whole uint64 range is a seed of its own (2^64 - 1 used to saturate to 2^63 - 1)
  EXPECT_NE(with_seed("18446744073709551615"), with_seed("9223372036854775807"));
  // integers are decimal: -n 010 is 10 tokens (CLI11 alone reads a leading 0 as octal: 8)
  EXPECT_EQ(run_json({"-m", kTiny, "--prompt-ids", "0,3", "-n", "010", "--temp", "0"})["ids"].size(), 10u);
}

TEST(CliGenerate, StreamsIdsWithoutTokenizerAndReportsSpeed) {
  ProcResult r = run_dsv4({"generate", "-m", kTiny, "--prompt-ids", "0,5", "-n", "3", "--temp", "0", "--threads", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = run_json({"-m", kTiny, "--prompt-ids", "0,5", "-n", "3", "--temp", "0"});
  std::string ids;
  for (const auto& id : j["ids"]) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(id.get<int>());
  }
  EXPECT_EQ(r.out, ids + "\n");
  EXPECT_NE(r.err.find("prefill:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tok/s"), std::string::npos) << r.err;
}

TEST(CliGenerate, BadArgumentsGiveOneLineErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string needle;
    int code = 1;  // 2: a usage error (the command line alone is wrong)
  };
  std::vector<Case> cases{
      {{"-m", "/nonexistent/model", "--prompt-ids", "0"}, "not a model folder"},
      {{"-m", kTiny, "--prompt-ids", "0", "--numerics", "fast"}, "--numerics", 2},
      {{"-m", kTiny}, "prompt", 2},
      {{"-m", kTiny, "-p", "hello"}, "tokenizer.json"},
      {{"-m", kTiny, "--prompt-ids", "0,x"}, "--prompt-ids", 2},
      {{"-m", kTiny, "--prompt-ids", "0,999999"}, "vocabulary", 2},  // (config.json tells, before loading)
      {{"-m", kTiny, "--prompt-ids", "0", "--top-p", "2"}, "--top-p: top_p", 2},
      {{"-m", kTiny, "--prompt-ids", "0", "--temp", "-1"}, "--temp: temperature", 2},
  };
  for (const auto& c : cases) {
    auto args = c.args;
    args.insert(args.begin(), "generate");
    ProcResult r = run_dsv4(args, "generr");
    EXPECT_EQ(r.code, c.code) << r.err;
    EXPECT_NE(r.err.find("dsv4: error:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  }
}

// An empty prompt (-p "" or --prompt-ids "") is a usage error named as such: one line, exit 2, before the model loads.
TEST(CliGenerate, EmptyPromptIsAUsageError) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"-p", ""}, {"--prompt-ids", ""}, {"--prompt", "", "--json"}}) {
    std::vector<std::string> args = {"generate", "-m", kDemo, "-n", "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    ProcResult r = run_dsv4(args, "genempty");
    EXPECT_EQ(r.code, 2) << extra[0] << ": " << r.err;
    EXPECT_EQ(r.err.rfind("dsv4: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("empty"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.find("loading"), std::string::npos) << "the model was loaded first: " << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST(CliGenerate, DemoModelTextStreamsAndStops) {
  ASSERT_TRUE(std::filesystem::exists(kDemo + "/tokenizer.json")) << "demo model missing: " << kDemo;
  auto j = run_json({"-m", kDemo, "-p", "The president", "-n", "10", "--temp", "0"});
  ASSERT_GE(j["prompt_ids"].size(), 2u);
  EXPECT_EQ(j["prompt_ids"][0], 0);  // BOS prepended to -p text
  const std::string text = j["text"];
  ASSERT_FALSE(text.empty());
  // Plain mode streams the same text to stdout, after the prompt text.
  ProcResult r =
      run_dsv4({"generate", "-m", kDemo, "-p", "The president", "-n", "10", "--temp", "0", "--threads", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "The president" + text + "\n");
  // A stop string taken from the greedy text cuts it there.
  size_t sp = text.find(' ', 1);
  ASSERT_NE(sp, std::string::npos) << text;
  std::string stop = text.substr(sp, 4);
  auto s = run_json({"-m", kDemo, "-p", "The president", "-n", "10", "--temp", "0", "--stop", stop});
  EXPECT_EQ(s["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(s["finish_reason"], "stop");
}

// generate prints the -p text before its continuation, so that the output reads as one text (it printed the
// continuation alone, which starts mid-sentence); --no-echo prints the continuation alone, --echo is the default.
// Prompt ids are not echoed (no text was typed), and the --json object is unchanged.
TEST(CliGenerate, EchoesThePromptTextUnlessNoEcho) {
  const std::string prompt = "The Congress of the United States";
  const std::vector<std::string> base{"generate", "-m", kDemo, "-p", prompt, "-n", "8", "--temp", "0", "--threads", "1"};
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    ProcResult r = run_dsv4(args, "genecho");
    EXPECT_EQ(r.code, 0) << r.err;
    return r.out;
  };
  const std::string echoed = with({}), plain = with({"--no-echo"});
  ASSERT_GT(plain.size(), 1u);
  EXPECT_EQ(echoed, prompt + plain);
  EXPECT_EQ(with({"--echo"}), echoed);
  EXPECT_EQ(plain, json::parse(with({"--json"}))["text"].get<std::string>() + "\n");
  // (--prompt-ids: StreamsIdsWithoutTokenizerAndReportsSpeed, the generated ids alone)
}

TEST(CliChat, KeepsHistoryTogglesThinkingAndExitsOnEof) {
  ASSERT_TRUE(std::filesystem::exists(kDemo + "/tokenizer.json")) << "demo model missing: " << kDemo;
  ProcResult r = run_dsv4({"chat", "-m", kDemo, "-n", "4", "--temp", "0", "--threads", "1"}, "chat",
                          "Tell me about Congress\n/think on\nWhy?\n/help\n");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[thinking]"), std::string::npos) << r.out;  // the second turn reasons, shown apart
  EXPECT_NE(r.out.find("commands:"), std::string::npos) << r.out;
  // The second turn reuses the first turn's prompt from the cached sequence.
  EXPECT_EQ(r.err.find("(0 cached)", r.err.find("(0 cached)") + 1), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" cached)"), std::string::npos) << r.err;
}

}  // namespace
