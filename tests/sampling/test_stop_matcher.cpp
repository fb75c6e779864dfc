#include <gtest/gtest.h>

#include "core/error.h"
#include "sampling/stop_matcher.h"

using namespace dsv4;

namespace {
// Feed pieces, collect emitted text; returns {text, stopped}.
std::pair<std::string, bool> feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) {
    auto r = m.push(p);
    out += r.text;
    if (r.stopped) return {out, true};
  }
  return {out + m.flush(), false};
}
}  // namespace

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("abc").text, "abc");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, StopAcrossTokenBoundariesIsNotEmitted) {
  StopMatcher m({"END"});
  auto [text, stopped] = feed(m, {"hello E", "N", "D tail"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text, "hello ");
}

TEST(StopMatcher, HoldsBackOnlyPossiblePrefixes) {
  StopMatcher m({"</s>"});
  auto r = m.push("a<");
  EXPECT_EQ(r.text, "a");
  r = m.push("b");
  EXPECT_EQ(r.text, "<b");  // not a stop after all: released
  r = m.push("</");
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.flush(), "</");  // end of generation releases the held text
}

TEST(StopMatcher, EarliestStopWinsAndEverythingAfterIsDropped) {
  StopMatcher m({"world", "lo"});
  auto [text, stopped] = feed(m, {"hel", "lo world"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text, "hel");
  EXPECT_EQ(m.push("more").text, "");
}

TEST(StopMatcher, StopInsideOneChunkAndMultibyte) {
  StopMatcher m({"。"});
  auto [text, stopped] = feed(m, {"你好", "\xe3\x80", "\x82再见"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text, "你好");
}

TEST(StopMatcher, EmptyStopRejected) { EXPECT_THROW(StopMatcher({""}), Error); }
