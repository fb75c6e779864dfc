// BPE semantics on a small hand-made tokenizer.json: merge order, leftmost tie-breaking, both merge forms,
// added tokens, Split pre-tokenizers, and loader errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace {

using J = nlohmann::json;

J make_json(const J& pre_tokenizer) {
  J vocab = J::object();
  for (int b = 0; b < 256; ++b) vocab[dsv4::byte_level::encode_bytes(std::string(1, static_cast<char>(b)))] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab["aa"] = 258;
  vocab["bc"] = 259;
  vocab["Ġa"] = 260;
  J merges = J::array({"a b", J::array({"ab", "c"}), "a a", "b c", "Ġ a"});
  J added = J::array({{{"id", 300}, {"content", "<x>"}, {"special", true}, {"normalized", false}},
                      {{"id", 301}, {"content", "<xy>"}, {"special", true}, {"normalized", false}},
                      {{"id", 302}, {"content", "plain"}, {"special", false}, {"normalized", false}}});
  return J{{"version", "1.0"},
           {"added_tokens", added},
           {"normalizer", nullptr},
           {"pre_tokenizer", pre_tokenizer},
           {"decoder", {{"type", "ByteLevel"}}},
           {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

std::vector<int32_t> ids(std::initializer_list<int32_t> l) { return l; }

TEST(BpeSynthetic, MergeOrderAndTies) {
  const auto tok = dsv4::Tokenizer::from_json_text(make_json(nullptr).dump());
  EXPECT_EQ(tok.n_vocab(), 303);
  EXPECT_EQ(tok.encode("abc", false), ids({257}));               // ab (rank 0), then ab+c (rank 1)
  EXPECT_EQ(tok.encode("aaa", false), ids({258, 'a'}));          // equal ranks: leftmost pair first
  EXPECT_EQ(tok.encode("aaaa", false), ids({258, 258}));
  EXPECT_EQ(tok.encode("bcab", false), ids({259, 256}));         // ab (rank 0) before bc (rank 3)
  EXPECT_EQ(tok.encode("abcbc", false), ids({257, 259}));
  EXPECT_EQ(tok.encode(" a", false), ids({260}));
  EXPECT_EQ(tok.decode(ids({257, 260, 300})), "abc a<x>");
  EXPECT_EQ(tok.token_id("Ġa"), 260);
  EXPECT_EQ(tok.token_id("<xy>"), 301);
  EXPECT_TRUE(tok.is_special(300));
  EXPECT_FALSE(tok.is_special(302));
}

TEST(BpeSynthetic, AddedTokensLeftmostLongest) {
  const auto tok = dsv4::Tokenizer::from_json_text(make_json(nullptr).dump());
  EXPECT_EQ(tok.encode("a<xy>b", true), ids({'a', 301, 'b'}));
  EXPECT_EQ(tok.encode("<x<x>>", true), ids({'<', 'x', 300, '>'}));
  EXPECT_EQ(tok.encode("plainab", true), ids({302, 256}));
  EXPECT_EQ(tok.encode("<xy>", false), ids({'<', 'x', 'y', '>'}));
  EXPECT_EQ(tok.encode("<xy>plain", false), ids({'<', 'x', 'y', '>', 302}));  // non-special still matched
}

TEST(BpeSynthetic, SplitPreTokenizersIsolatePieces) {
  const J seq = {{"type", "Sequence"},
                 {"pretokenizers",
                  {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}, {"invert", false}},
                   {{"type", "Split"}, {"pattern", {{"String", "b"}}}, {"behavior", "Isolated"}, {"invert", false}},
                   {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const auto tok = dsv4::Tokenizer::from_json_text(make_json(seq).dump());
  // "b" is isolated, so "ab" and "bc" can never merge across it.
  EXPECT_EQ(tok.encode("abc", false), ids({'a', 'b', 'c'}));
  EXPECT_EQ(tok.encode("aa1234aa", false), ids({258, '1', '2', '3', '4', 258}));
}

TEST(BpeSynthetic, LoaderErrors) {
  auto bad = make_json(nullptr);
  bad["model"]["merges"] = J::array({"ab"});
  EXPECT_THROW(dsv4::Tokenizer::from_json_text(bad.dump()), dsv4::Error);
  bad = make_json(nullptr);
  bad["model"]["merges"] = J::array({J::array({"a"})});
  EXPECT_THROW(dsv4::Tokenizer::from_json_text(bad.dump()), dsv4::Error);
  bad = make_json(nullptr);
  bad["model"]["merges"] = J::array({"x q"});  // merged token "xq" not in vocab
  EXPECT_THROW(dsv4::Tokenizer::from_json_text(bad.dump()), dsv4::Error);
  bad = make_json(nullptr);
  bad["model"]["vocab"]["zz"] = "7";
  EXPECT_THROW(dsv4::Tokenizer::from_json_text(bad.dump()), dsv4::Error);
  bad = make_json(nullptr);
  bad["normalizer"] = {{"type", "NFC"}};
  EXPECT_THROW(dsv4::Tokenizer::from_json_text(bad.dump()), dsv4::Error);
  bad = make_json({{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}});
  EXPECT_THROW(dsv4::Tokenizer::from_json_text(bad.dump()), dsv4::Error);
  bad = make_json({{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Removed"}});
  EXPECT_THROW(dsv4::Tokenizer::from_json_text(bad.dump()), dsv4::Error);
  bad = make_json(nullptr);
  bad["model"].erase("merges");
  EXPECT_THROW(dsv4::Tokenizer::from_json_text(bad.dump()), dsv4::Error);
}

}  // namespace
