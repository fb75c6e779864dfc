// TextOutput (engine/text_output.h): log-probabilities are handed over once a token's text is settled — not held
// back as a possible stop string, not an incomplete UTF-8 character — right before the on_token call that completes
// it, and never for the tokens whose text a stop string removed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/tiny_tokenizer.h"
#include "engine/text_output.h"

namespace dsv4 {
namespace {

struct Recorder {
  std::vector<std::string> events;  // "lp <id>" and "text <text>", in call order
  GenerationCallbacks cb() {
    GenerationCallbacks c;
    c.on_logprobs = [this](const TokenLogprobs& lp) { events.push_back("lp " + std::to_string(lp.id)); };
    c.on_token = [this](int32_t, std::string_view text) {
      events.push_back("text " + std::string(text));
      return true;
    };
    return c;
  }
};

int32_t byte_id(uint8_t b) { return 3 + b; }  // the tiny tokenizer: ids 3..258 are the 256 bytes

// Pushes `bytes` one byte token each, with log-probabilities whose id is the token's.
std::optional<FinishReason> push_bytes(TextOutput& out, const std::string& bytes, GenerationResult& res,
                                       const GenerationCallbacks& cb) {
  for (const char c : bytes) {
    TokenLogprobs lp;
    lp.id = byte_id(static_cast<uint8_t>(c));
    if (const auto end = out.push(lp.id, &lp, res, cb)) return end;
  }
  return std::nullopt;
}

std::string lp(char c) { return "lp " + std::to_string(byte_id(static_cast<uint8_t>(c))); }

TEST(TextOutput, LogprobsWaitForHeldBackTextAndIncompleteCharacters) {
  const Tokenizer tok = Tokenizer::from_json_text(test::tiny_tokenizer_json());
  TextOutput out(&tok, {"xyz"});
  Recorder r;
  const GenerationCallbacks cb = r.cb();
  GenerationResult res;
  // "xy" may start "xyz": held back with its log-probabilities until "b" shows it is not; a lone 0xE4 is an
  // incomplete character until "c" makes it U+FFFD; E4 B8 AD is one character
  EXPECT_FALSE(push_bytes(out, "axyb\xE4" "c\xE4\xB8\xAD" "x", res, cb));
  res.finish = FinishReason::length;
  out.finish(res, cb);
  const std::vector<std::string> want = {
      lp('a'), "text a", "text ", "text ", lp('x'), lp('y'), lp('b'), "text xyb", "text ", lp('\xE4'), lp('c'),
      "text \xEF\xBF\xBD" "c", "text ", "text ", lp('\xE4'), lp('\xB8'), lp('\xAD'), "text \xE4\xB8\xAD", "text ",
      lp('x'), "text x"};
  EXPECT_EQ(r.events, want);
  EXPECT_EQ(res.text, "axyb\xEF\xBF\xBD" "c\xE4\xB8\xAD" "x");
}

TEST(TextOutput, TokensCutByAStopStringGetNoLogprobs) {
  const Tokenizer tok = Tokenizer::from_json_text(test::tiny_tokenizer_json());
  struct Case {
    std::string bytes, stop, text;
    std::string listed;  // the tokens (bytes) whose log-probabilities are handed over
  };
  for (const Case& k : std::vector<Case>{{"ab cd", " c", "ab", "ab"},
                                         {"ab\xE4\xB8\xAD" "d", "\xE4\xB8\xAD", "ab", "ab"},
                                         {"ab\xE4\xB8\xAD" "d", "d", "ab\xE4\xB8\xAD", "ab\xE4\xB8\xAD"}}) {
    TextOutput out(&tok, {k.stop});
    Recorder r;
    GenerationResult res;
    EXPECT_EQ(push_bytes(out, k.bytes, res, r.cb()), FinishReason::stop) << k.stop;
    out.finish(res, r.cb());  // (nothing more after a stop)
    EXPECT_EQ(res.text, k.text);
    std::string listed;
    for (const auto& e : r.events)
      if (e.rfind("lp ", 0) == 0) listed += char(std::stoi(e.substr(3)) - 3);
    EXPECT_EQ(listed, k.listed) << k.stop;
  }
  // a multi-byte token holding text before the stop string and its start: "</think>" with stop "think>"
  TextOutput out(&tok, {"think>"});
  Recorder r;
  GenerationResult res;
  TokenLogprobs a;
  a.id = byte_id('a');
  TokenLogprobs close;
  close.id = *tok.token_id("</think>");
  EXPECT_FALSE(out.push(a.id, &a, res, r.cb()));
  EXPECT_EQ(out.push(close.id, &close, res, r.cb()), FinishReason::stop);
  EXPECT_EQ(res.text, "a</");
  EXPECT_EQ(r.events, (std::vector<std::string>{lp('a'), "text a", "text </"}));
  EXPECT_EQ(res.ids.size(), 2u);  // the ids keep the token that completed the stop string
}

}  // namespace
}  // namespace dsv4
