// `dsv4 tokenize` / `dsv4 detokenize` / `dsv4 render` end to end on the demo model's tokenizer: exact round trips
// (arguments and stdin bytes), --json output, special-token matching, the official chat golden pairs, and one-line
// errors with a non-zero exit on bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/run_child.h"

namespace {
using namespace dsv4::clitest;
using json = nlohmann::json;

const std::string kRoot = DSV4_SOURCE_DIR;
const std::string kDemo = kRoot + "/models/dsv4-demo";
const std::string kTokFile = kDemo + "/tokenizer.json";
const std::string kOfficial = kRoot + "/tests/data/chat/official/";

// Parses "1 2 3\n" (the plain id output) into numbers; fails the test on anything else.
std::vector<int64_t> parse_plain_ids(const std::string& s) {
  EXPECT_TRUE(!s.empty() && s.back() == '\n') << "output not newline-terminated: '" << s << "'";
  std::istringstream in(s);
  std::vector<int64_t> ids;
  int64_t v;
  while (in >> v) ids.push_back(v);
  EXPECT_TRUE(in.eof()) << "non-numeric output: '" << s << "'";
  return ids;
}

std::string join_ids(const std::vector<int64_t>& ids, const char* sep = " ") {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += sep;
    s += std::to_string(ids[i]);
  }
  return s;
}

std::vector<int64_t> tokenize(const std::vector<std::string>& src, const std::string& text,
                              const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"tokenize"};
  args.insert(args.end(), src.begin(), src.end());
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back(text);
  ProcResult r = run_dsv4(args, "tok");
  EXPECT_EQ(r.code, 0) << r.err;
  return parse_plain_ids(r.out);
}

std::string detokenize(const std::vector<std::string>& src, const std::vector<int64_t>& ids) {
  std::vector<std::string> args{"detokenize"};
  args.insert(args.end(), src.begin(), src.end());
  for (auto id : ids) args.push_back(std::to_string(id));
  ProcResult r = run_dsv4(args, "detok");
  EXPECT_EQ(r.code, 0) << r.err;
  return r.out;
}

// The id of a special (added) token, read from tokenizer.json itself.
int64_t added_token_id(const std::string& content) {
  std::ifstream f(kTokFile);
  const json t = json::parse(f);
  for (const auto& a : t.at("added_tokens"))
    if (a.at("content") == content) return a.at("id").get<int64_t>();
  ADD_FAILURE() << content << " is not an added token";
  return -1;
}

// A failed command: exit `code` (1; 2 for a usage error, not a signal), exactly one stderr line "dsv4: error: ...",
// nothing on stdout.
void expect_one_line_error(const ProcResult& r, const std::string& what, const std::string& needle = "",
                           int code = 1) {
  EXPECT_EQ(r.code, code) << what << ": " << r.err;
  EXPECT_EQ(r.err.rfind("dsv4: error: ", 0), 0u) << what << ": '" << r.err << "'";
  ASSERT_FALSE(r.err.empty()) << what;
  EXPECT_EQ(r.err.back(), '\n') << what;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << what << ": more than one line: '" << r.err << "'";
  EXPECT_TRUE(r.out.empty()) << what << ": stdout '" << r.out << "'";
  if (!needle.empty()) {
    EXPECT_NE(r.err.find(needle), std::string::npos) << what << ": '" << r.err << "'";
  }
}

const std::vector<std::string> kByFile{"--tokenizer", kTokFile};
const std::vector<std::string> kByModel{"-m", kDemo};

TEST(CliTokenize, RoundTripWithTokenizerFileAndModelDir) {
  const std::string text = "Hello, world!  Tabs\tand\nnewlines; 数字 123456 and emoji 🙂 — café.";
  const auto ids = tokenize(kByFile, text);
  ASSERT_GT(ids.size(), 10u);
  EXPECT_LT(ids.size(), text.size());  // real merges happen: fewer tokens than bytes
  for (auto id : ids) EXPECT_GE(id, 0);
  EXPECT_EQ(tokenize(kByModel, text), ids);  // -m DIR reads DIR/tokenizer.json
  EXPECT_EQ(detokenize(kByFile, ids), text);
  EXPECT_EQ(detokenize(kByModel, ids), text);
}

TEST(CliTokenize, JsonOutputParsesAndMatchesPlain) {
  const std::string text = "The quick brown fox 跳过 the lazy dog.";
  const auto plain = tokenize(kByFile, text);
  ProcResult r = run_dsv4({"tokenize", "--tokenizer", kTokFile, "--json", text}, "tokjson");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_TRUE(j[i].is_number_integer());
    EXPECT_EQ(j[i].get<int64_t>(), plain[i]);
  }
  // detokenize accepts the JSON array (one argument) and comma-separated ids.
  ProcResult d = run_dsv4({"detokenize", "--tokenizer", kTokFile, r.out}, "detokjson");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(d.out, text);
  d = run_dsv4({"detokenize", "--tokenizer", kTokFile, join_ids(plain, ",")}, "detokcomma");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(d.out, text);
}

TEST(CliTokenize, DashReadsExactStdinBytes) {
  const std::string text = "  leading spaces, naïve Ünïcödé 日本語テキスト\n\ntrailing newline\n";
  ProcResult r = run_dsv4({"tokenize", "--tokenizer", kTokFile, "-"}, "tokstdin", text);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto ids = parse_plain_ids(r.out);
  EXPECT_EQ(ids, tokenize(kByFile, text));  // same ids as the text given as an argument
  // Without the trailing newline the ids differ: the newline was read, not stripped.
  EXPECT_NE(ids, tokenize(kByFile, text.substr(0, text.size() - 1)));
  EXPECT_EQ(detokenize(kByFile, ids), text);
  // detokenize "-" reads the ids from stdin.
  ProcResult d = run_dsv4({"detokenize", "--tokenizer", kTokFile, "-"}, "detokstdin", r.out);
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(d.out, text);
}

TEST(CliTokenize, SpecialTokensAreMatchedUnlessPlain) {
  const int64_t user = added_token_id("<｜User｜>");
  const int64_t assistant = added_token_id("<｜Assistant｜>");
  const int64_t bos = added_token_id("<｜begin▁of▁sentence｜>");
  EXPECT_EQ(tokenize(kByFile, "<｜User｜>"), std::vector<int64_t>{user});
  const auto mixed = tokenize(kByFile, "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>");
  ASSERT_GE(mixed.size(), 4u);
  EXPECT_EQ(mixed[0], bos);
  EXPECT_EQ(mixed[1], user);
  EXPECT_EQ(mixed.back(), assistant);
  EXPECT_EQ(detokenize(kByFile, mixed), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>");
  // --plain: the same characters are ordinary text (several ids, none of them the special one), still exact.
  const auto plain = tokenize(kByFile, "<｜User｜>", {"--plain"});
  EXPECT_GT(plain.size(), 1u);
  for (auto id : plain) EXPECT_NE(id, user);
  EXPECT_EQ(detokenize(kByFile, plain), "<｜User｜>");
}

TEST(CliRender, OfficialGoldenPairs) {
  // Cases 1-3 (thinking mode): the files as they are (case 1 is {tools, messages}, 2-3 bare message arrays).
  for (int i = 1; i <= 3; ++i) {
    ProcResult r = run_dsv4({"render", kOfficial + "input_" + std::to_string(i) + ".json"}, "render");
    ASSERT_EQ(r.code, 0) << "case " << i << ": " << r.err;
    EXPECT_EQ(r.out, slurp(kOfficial + "output_" + std::to_string(i) + ".txt")) << "case " << i;
  }
  // Case 4 is chat mode: wrap the messages into a request with thinking disabled, fed through stdin.
  std::ifstream f(kOfficial + "input_4.json");
  const json req = {{"messages", json::parse(f)}, {"thinking", {{"type", "disabled"}}}};
  ProcResult r = run_dsv4({"render", "-"}, "render4", req.dump());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string expected4 = slurp(kOfficial + "output_4.txt");
  EXPECT_EQ(r.out, expected4);
  // The same messages in thinking mode render differently (the request's controls are honoured).
  ProcResult t = run_dsv4({"render", kOfficial + "input_4.json"}, "render4t");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out, expected4);
}

TEST(CliRender, IdsAreTheTokenizedPrompt) {
  const std::string text = slurp(kOfficial + "output_2.txt");
  ProcResult r = run_dsv4({"render", "-m", kDemo, "--ids", "--json", kOfficial + "input_2.json"}, "renderids");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  std::vector<int64_t> ids;
  for (const auto& v : j) ids.push_back(v.get<int64_t>());
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), added_token_id("<｜begin▁of▁sentence｜>"));
  EXPECT_EQ(ids, tokenize(kByFile, text));
  EXPECT_EQ(detokenize(kByFile, ids), text);
  ProcResult p = run_dsv4({"render", "--tokenizer", kTokFile, "--ids", kOfficial + "input_2.json"}, "renderids2");
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_EQ(parse_plain_ids(p.out), ids);
}

TEST(CliTokenize, BadInputGivesOneLineError) {
  const auto dir = scratch_dir("tokbad");
  expect_one_line_error(run_dsv4({"tokenize", "--tokenizer", "/nonexistent/tokenizer.json", "hi"}, "bad"),
                        "missing tokenizer file");
  expect_one_line_error(run_dsv4({"tokenize", "-m", "/nonexistent-model-dir", "hi"}, "bad"), "missing model dir");
  expect_one_line_error(run_dsv4({"tokenize", "hi"}, "bad"), "no tokenizer given", "", 2);
  const auto broken = dir / "broken_tokenizer.json";
  std::ofstream(broken) << "{\"model\": {\"type\": \"BPE\", \"vocab\": [";
  expect_one_line_error(run_dsv4({"tokenize", "--tokenizer", broken.string(), "hi"}, "bad"), "truncated tokenizer");

  // ids that are not token ids: usage errors (exit 2) in an argument, errors (exit 1) on stdin, which is data
  expect_one_line_error(run_dsv4({"detokenize", "--tokenizer", kTokFile, "12", "abc"}, "bad"), "non-numeric id",
                        "abc", 2);
  expect_one_line_error(run_dsv4({"detokenize", "--tokenizer", kTokFile, "12x"}, "bad"), "trailing garbage", "", 2);
  expect_one_line_error(run_dsv4({"detokenize", "--tokenizer", kTokFile, "1.5"}, "bad"), "fractional id", "", 2);
  expect_one_line_error(run_dsv4({"detokenize", "--tokenizer", kTokFile, "-"}, "bad", "1 2 three\n"),
                        "non-numeric id on stdin", "on stdin");
  expect_one_line_error(run_dsv4({"detokenize", "--tokenizer", kTokFile, "99999999"}, "bad"), "out-of-range id",
                        "vocabulary", 2);
  expect_one_line_error(run_dsv4({"detokenize", "--tokenizer", kTokFile, "-"}, "bad", "99999999"),
                        "out-of-range id on stdin", "on stdin");
  expect_one_line_error(run_dsv4({"detokenize", "--tokenizer", kTokFile, "-1"}, "bad"), "negative id", "", 2);
  // 2^32 + 66 used to wrap to id 66 and print its text
  expect_one_line_error(run_dsv4({"detokenize", "--tokenizer", kTokFile, "4294967362"}, "bad"), "id beyond 32 bits",
                        "4294967362", 2);
  expect_one_line_error(run_dsv4({"detokenize", "--tokenizer", kTokFile, "99999999999999999999"}, "bad"),
                        "id too long", "", 2);
}

// An IDS argument is a JSON array or ids separated by commas or spaces, and nothing else: a malformed array ("[1,2"
// was read as 1 and 2), a trailing comma, an empty entry, a negative, fractional or nested element, a JSON value
// that is not an array are usage errors naming the argument; "[]" (like blank text) is no ids, hence no output.
TEST(CliDetokenize, MalformedIdListsAreUsageErrors) {
  for (const std::string bad : {"[1,2", "[1,2,]", "[,1]", "[1,,2]", "[-1]", "[1.5]", "[1e3]", "[[1]]", "[1, \"2\"]",
                                "[null]", "[1] 2", "[1]]", "1,,2", "1,", ",1", "1, ,2", "{\"a\": 1}", "\"1\"",
                                "null", "1;2"}) {
    const ProcResult r = run_dsv4({"detokenize", "--tokenizer", kTokFile, bad}, "detokbad");
    expect_one_line_error(r, "detokenize '" + bad + "'", "", 2);
    EXPECT_NE(r.err.find(bad.substr(0, 3)), std::string::npos) << bad << ": the message quotes it: " << r.err;
  }
  // the same text on stdin: an error of the data (exit 1)
  expect_one_line_error(run_dsv4({"detokenize", "--tokenizer", kTokFile, "-"}, "detokbadstdin", "[1,2"),
                        "malformed array on stdin", "[1,2", 1);
  // deeply nested (printing the element in the message recursed once per level: a segfault at ~300,000 levels)
  expect_one_line_error(run_dsv4({"detokenize", "--tokenizer", kTokFile, "-"}, "detokdeep",
                                 std::string(300000, '[') + std::string(300000, ']')),
                        "deeply nested array on stdin", "nested deeper than", 1);
  for (const std::string none : {"[]", " [ ] ", "", "  "}) {
    const ProcResult r = run_dsv4({"detokenize", "--tokenizer", kTokFile, none}, "detoknone");
    EXPECT_EQ(r.code, 0) << "'" << none << "': " << r.err;
    EXPECT_EQ(r.out, "") << "'" << none << "'";
  }
  // every accepted spelling of the same ids gives the same text
  const auto ids = tokenize(kByFile, "Hello, world");
  ASSERT_GE(ids.size(), 3u);
  const std::string want = detokenize(kByFile, ids);
  ASSERT_FALSE(want.empty());
  for (const std::vector<std::string>& spelling :
       {std::vector<std::string>{fmt::format("[{}]", join_ids(ids, ", "))}, {fmt::format("[{}]", join_ids(ids, ","))},
        {join_ids(ids, ",")}, {join_ids(ids, ", ")}, {join_ids(ids, " ")}, {fmt::format(" {}\n", join_ids(ids, " ,\t"))},
        {fmt::format("[{}]", ids[0]), join_ids({ids.begin() + 1, ids.end()}, ",")}}) {
    std::vector<std::string> args{"detokenize", "--tokenizer", kTokFile};
    args.insert(args.end(), spelling.begin(), spelling.end());
    const ProcResult r = run_dsv4(args, "detokspell");
    EXPECT_EQ(r.code, 0) << spelling[0] << ": " << r.err;
    EXPECT_EQ(r.out, want) << spelling[0];
  }
}

TEST(CliRender, BadInputGivesOneLineError) {
  const auto dir = scratch_dir("renderbad");
  expect_one_line_error(run_dsv4({"render", (dir / "missing.json").string()}, "bad"), "missing request file",
                        "missing.json");
  const auto malformed = dir / "malformed.json";
  std::ofstream(malformed) << "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}";
  expect_one_line_error(run_dsv4({"render", malformed.string()}, "bad"), "malformed JSON file");
  expect_one_line_error(run_dsv4({"render", "-"}, "bad", "not json at all\n"), "malformed JSON on stdin");
  // deep nesting (printing the parsed value recursed once per level: a segfault at ~70,000 levels)
  std::string deep = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"x\": ";
  deep += std::string(70000, '[') + std::string(70000, ']') + "}";
  expect_one_line_error(run_dsv4({"render", "-"}, "bad", deep), "deeply nested request", "nested deeper than");
  std::string args;
  for (int i = 0; i < 70000; ++i) args += "{\"a\":";
  args += '1';
  args.append(70000, '}');
  const json call = {{"messages",
                      {{{"role", "user"}, {"content", "x"}},
                       {{"role", "assistant"},
                        {"content", nullptr},
                        {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                                         {"function", {{"name", "f"}, {"arguments", args}}}}}}}}}};
  expect_one_line_error(run_dsv4({"render", "-"}, "bad", call.dump()), "deeply nested tool arguments",
                        "nested deeper than");
  expect_one_line_error(run_dsv4({"render", "-"}, "bad", "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}"),
                        "unknown role");
  // --ids needs a tokenizer (a usage error: the command line lacks it).
  expect_one_line_error(run_dsv4({"render", "--ids", kOfficial + "input_2.json"}, "bad"), "--ids without tokenizer",
                        "--tokenizer", 2);
  // Every error case of the chat cases table fails the same way through the CLI.
  std::ifstream cases(kRoot + "/tests/data/chat/cases.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(cases, line)) {
    if (line.empty()) continue;
    const json c = json::parse(line);
    if (!c.contains("error")) continue;
    expect_one_line_error(run_dsv4({"render", "-"}, "bad", c.at("request").dump()), c.at("name").get<std::string>(),
                          c.at("error").get<std::string>());
    ++n;
  }
  EXPECT_GE(n, 1);
}

// render takes the tool names the server takes (chat/tool_name.h), and refuses the others with the server's
// reason: it rendered any name, also ones the server answers with 400 (a space, a quote, non-ASCII letters, > 64).
TEST(CliRender, ToolNamesFollowTheServersRule) {
  const auto request = [](const json& tool) {
    return json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", {tool}}}.dump();
  };
  for (const std::string& name : std::vector<std::string>{"get_weather", "a.b-c_9", "X", std::string(64, 'a')}) {
    const ProcResult r =
        run_dsv4({"render", "-"}, "rendertool", request({{"type", "function"}, {"function", {{"name", name}}}}));
    EXPECT_EQ(r.code, 0) << name << ": " << r.err;
    EXPECT_NE(r.out.find("\"name\": \"" + name + "\""), std::string::npos) << r.out;
  }
  for (const std::string& name :
       std::vector<std::string>{"has space", "翻译", "a\"b", "a>b", "", std::string(65, 'a')}) {
    expect_one_line_error(
        run_dsv4({"render", "-"}, "rendertool", request({{"type", "function"}, {"function", {{"name", name}}}})),
        "tool name '" + name + "'", "tools[0].function.name: required, 1 to 64 letters, digits");
    expect_one_line_error(run_dsv4({"render", "-"}, "rendertool", request({{"name", name}})),
                          "bare tool name '" + name + "'", "tools[0].name: required, 1 to 64 letters, digits");
  }
}

}  // namespace
