// Output parsing: reasoning/content split, DSML tool calls, streaming at every byte split, tolerance of model
// mistakes, and round trips through the renderer.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "chat/chat_encoding.h"
#include "chat/output_parser.h"

namespace {

using dsv4::ChatDelta;
using dsv4::OutputParser;

struct Result {
  std::string reasoning, content;
  std::vector<dsv4::ToolCall> calls;
};

Result whole(std::string_view text, bool thinking) {
  auto p = OutputParser::parse(text, thinking, "id_");
  return Result{p.reasoning(), p.content(), p.tool_calls()};
}

// Feeds `chunks`, concatenating the deltas; checks they agree with the parser's accumulators.
Result streamed(const std::vector<std::string_view>& chunks, bool thinking) {
  OutputParser p(thinking, "id_");
  Result r;
  const auto add = [&](const ChatDelta& d) {
    r.reasoning += d.reasoning;
    r.content += d.content;
    for (const auto& tc : d.tool_calls) {
      EXPECT_EQ(tc.index, static_cast<int>(r.calls.size()));
      r.calls.push_back(dsv4::ToolCall{tc.id, tc.name, tc.arguments});
    }
  };
  for (auto c : chunks) add(p.push(c));
  add(p.finish());
  EXPECT_EQ(r.reasoning, p.reasoning());
  EXPECT_EQ(r.content, p.content());
  EXPECT_EQ(r.calls.size(), p.tool_calls().size());
  return r;
}

void expect_same(const Result& a, const Result& b, const std::string& what) {
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << what;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].id, b.calls[i].id) << what;
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << what;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << what;
  }
}

// Every 2-way split and byte-by-byte feeding give the whole-text result.
void check_all_splits(const std::string& text, bool thinking) {
  const Result ref = whole(text, thinking);
  for (size_t i = 0; i <= text.size(); ++i) {
    std::string_view s(text);
    expect_same(streamed({s.substr(0, i), s.substr(i)}, thinking), ref, "split at " + std::to_string(i));
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
  expect_same(streamed(bytes, thinking), ref, "byte by byte");
  std::mt19937 rng(42);
  for (int t = 0; t < 20; ++t) {
    std::vector<std::string_view> chunks;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t n = 1 + rng() % 9;
      n = std::min(n, text.size() - pos);
      chunks.push_back(std::string_view(text).substr(pos, n));
      pos += n;
    }
    expect_same(streamed(chunks, thinking), ref, "random chunks");
  }
}

const std::string kCall =
    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Beijing \"north\"</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"a\": [1, 2.5], \"b\": null}</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"search\">\n"
    "<｜DSML｜parameter name=\"query\" string=\"true\">多行\n文本 </｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";

TEST(OutputParser, ReasoningContentSplit) {
  auto r = whole("I think.</think>The answer is 4.<｜end▁of▁sentence｜>", true);
  EXPECT_EQ(r.reasoning, "I think.");
  EXPECT_EQ(r.content, "The answer is 4.");
  EXPECT_TRUE(r.calls.empty());
  r = whole("Just content</think> with a stray marker", false);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Just content</think> with a stray marker");
  r = whole("still thinking when max_tokens hit", true);
  EXPECT_EQ(r.reasoning, "still thinking when max_tokens hit");
  EXPECT_EQ(r.content, "");
}

TEST(OutputParser, ToolCallsWithTypes) {
  auto r = whole("Plan.</think>Let me check." + kCall, true);
  EXPECT_EQ(r.reasoning, "Plan.");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].id, "id_0");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Beijing \"north\"", "days": 3, "opts": {"a": [1, 2.5], "b": null}})");
  EXPECT_EQ(r.calls[1].id, "id_1");
  EXPECT_EQ(r.calls[1].arguments, "{\"query\": \"多行\\n文本 \"}");
  for (const auto& c : r.calls) EXPECT_TRUE(nlohmann::json::parse(c.arguments).is_object());
}

TEST(OutputParser, StreamingEverySplitPoint) {
  check_all_splits("Plan.</think>Let me check." + kCall, true);
  check_all_splits("Hmm</think>Answer with <b>tags</b> and a 2 < 3 comparison.<｜end▁of▁sentence｜>", true);
  check_all_splits("Content ending in a marker prefix 2 <", false);
  check_all_splits("Content ending in newlines\n\n", false);
  check_all_splits("Content ending in </thi", false);
  check_all_splits("reasoning ending in </thi", true);
  check_all_splits("x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", false);
}

TEST(OutputParser, MarkerPrefixIsHeldThenFlushed) {
  OutputParser p(false, "id_");
  EXPECT_EQ(p.push("2 <").content, "2 ");
  EXPECT_EQ(p.push("").content, "");
  EXPECT_EQ(p.finish().content, "<");
  EXPECT_EQ(p.content(), "2 <");
  OutputParser q(true, "id_");
  EXPECT_EQ(q.push("abc</th").reasoning, "abc");
  auto d = q.push("ink>def");
  EXPECT_EQ(d.content, "def");
  EXPECT_EQ(d.reasoning, "");
}

TEST(OutputParser, ToolCallWithoutThinkEnd) {
  // antirez/ds4#318: the model skipped </think>; the call must not be lost.
  auto r = whole("I will call the tool." + kCall, true);
  EXPECT_EQ(r.reasoning, "I will call the tool.");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.calls.size(), 2u);
  check_all_splits("I will call the tool." + kCall, true);
}

TEST(OutputParser, BlockMarkerWithoutBlankLine) {
  auto r = whole("Text<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", false);
  EXPECT_EQ(r.content, "Text");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
}

TEST(OutputParser, MalformedDsmlBecomesContent) {
  const std::string bad[] = {
      "A\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke nam=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      "A\n\n<｜DSML｜tool_calls>\nnot dsml at all",
      "A\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"k\" string=\"maybe\">v"
      "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      "A\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"k\" string=\"true\">1"
      "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"k\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>",
      "A\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"k\" string=\"true\">unterminated",
  };
  for (const auto& text : bad) {
    auto r = whole(text, false);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text) << "no text may be lost";
    check_all_splits(text, false);
  }
  // A good call followed by a malformed one: the first is kept, the rest is content.
  const std::string mixed =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\" oops>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  auto r = whole(mixed, false);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
  EXPECT_EQ(r.content, "\n<｜DSML｜invoke name=\"g\" oops>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
  check_all_splits(mixed, false);
}

TEST(OutputParser, NonJsonFalseValueIsQuoted) {
  auto r = whole("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" string=\"false\">"
                 "twelve</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
                 false);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"n\": \"twelve\"}");
}

TEST(OutputParser, TextAfterBlockAndEos) {
  const std::string block = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  auto r = whole("A" + block + "\n  trailing words<｜end▁of▁sentence｜>ignored", false);
  EXPECT_EQ(r.content, "Atrailing words");
  EXPECT_EQ(r.calls.size(), 1u);
  r = whole("A" + block + "  \n", false);
  EXPECT_EQ(r.content, "A");
  auto p = OutputParser::parse("done<｜end▁of▁sentence｜>more", false, "x");
  EXPECT_TRUE(p.saw_eos());
  EXPECT_EQ(p.content(), "done");
  check_all_splits("A" + block + "\n  trailing words<｜end▁of▁sentence｜>ignored", false);
}

TEST(OutputParser, LeadingThinkTagDropped) {
  auto r = whole("<think>reason</think>answer", true);
  EXPECT_EQ(r.reasoning, "reason");
  EXPECT_EQ(r.content, "answer");
  check_all_splits("<think>reason</think>answer", true);
  r = whole("<thin", true);
  EXPECT_EQ(r.reasoning, "<thin");
}

TEST(OutputParser, RandomIdsAreUnique) {
  const std::string t = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  OutputParser a(false), b(false);
  a.push(t);
  a.finish();
  b.push(t);
  b.finish();
  ASSERT_EQ(a.tool_calls().size(), 1u);
  EXPECT_EQ(a.tool_calls()[0].id.rfind("call_", 0), 0u);
  EXPECT_NE(a.tool_calls()[0].id, b.tool_calls()[0].id);
}

// Round trip: render an assistant turn with the chat encoder, parse the generated part back.
TEST(OutputParser, RoundTripThroughRenderer) {
  using J = dsv4::OrderedJson;
  const J assistants[] = {
      {{"role", "assistant"}, {"reasoning_content", "think hard"}, {"content", "Final answer: 42."}},
      {{"role", "assistant"}, {"reasoning_content", "need tools"}, {"content", "Checking."},
       {"tool_calls",
        {{{"id", "a"}, {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Paris", "days": 3, "x": [1, {"y": null}]})"}}}},
         {{"id", "b"}, {"type", "function"},
          {"function", {{"name", "search"}, {"arguments", R"({"query": "多行\n文本 <b>", "flag": true})"}}}}}}},
      {{"role", "assistant"}, {"reasoning_content", ""}, {"content", ""},
       {"tool_calls", {{{"id", "c"}, {"function", {{"name", "noop"}, {"arguments", "{}"}}}}}}},
      {{"role", "assistant"}, {"reasoning_content", "r\n\nwith blank lines\n"}, {"content", "a\n\nb\n"}},
  };
  for (bool thinking : {true, false}) {
    for (const auto& asst : assistants) {
      J req = {{"messages", {{{"role", "user"}, {"content", "hi"}}, asst}}};
      if (!thinking) req["thinking"] = {{"type", "disabled"}};
      const std::string text = dsv4::render_chat(req).text();
      const std::string head = thinking ? "<｜Assistant｜><think>" : "<｜Assistant｜></think>";
      const size_t pos = text.find(head);
      ASSERT_NE(pos, std::string::npos);
      const std::string generated = text.substr(pos + head.size());
      const Result r = whole(generated, thinking);
      EXPECT_EQ(r.reasoning, thinking ? asst.value("reasoning_content", "") : "") << generated;
      EXPECT_EQ(r.content, asst.value("content", "")) << generated;
      const J calls = asst.value("tool_calls", J::array());
      ASSERT_EQ(r.calls.size(), calls.size());
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(r.calls[i].name, calls[i]["function"]["name"].get<std::string>());
        EXPECT_EQ(J::parse(r.calls[i].arguments), J::parse(calls[i]["function"]["arguments"].get<std::string>()));
      }
      check_all_splits(generated, thinking);
    }
  }
}

}  // namespace

namespace dsv4 {
namespace {

// Cut off at the token limit inside a tool-call block: the open call is dropped, never turned into content markup;
// calls completed before it are kept; without `truncated` the raw text still goes to content (nothing lost).
TEST(OutputParser, TruncatedInsideToolCallsDropsTheOpenCall) {
  const std::string cut = kCall.substr(0, kCall.find("<｜DSML｜invoke name=\"search\">") + 20);  // inside call 2
  for (const size_t step : {size_t(1), size_t(7), cut.size()}) {
    OutputParser p(false, "id_");
    std::string content;
    size_t calls = 0;
    const std::string text = "Checking." + cut;
    for (size_t i = 0; i < text.size(); i += step) {
      const ChatDelta d = p.push(std::string_view(text).substr(i, step));
      content += d.content;
      calls += d.tool_calls.size();
    }
    const ChatDelta f = p.finish(true);
    content += f.content;
    calls += f.tool_calls.size();
    EXPECT_EQ(content, "Checking.") << "step " << step;
    EXPECT_EQ(calls, 1u) << "step " << step;
    ASSERT_EQ(p.tool_calls().size(), 1u);
    EXPECT_EQ(p.tool_calls()[0].name, "get_weather");
    EXPECT_EQ(p.content().find("DSML"), std::string::npos);
  }
  // cut inside the very first call: no calls, no markup
  const std::string first = kCall.substr(0, kCall.find("Beijing"));
  OutputParser q(false, "id_");
  std::string content = q.push("Hi" + first).content;
  content += q.finish(true).content;
  EXPECT_EQ(content, "Hi");
  EXPECT_TRUE(q.tool_calls().empty());
  // not truncated (an unterminated block at a normal end): the raw text is kept as content, as before
  OutputParser r(false, "id_");
  std::string kept = r.push("Hi" + first).content;
  kept += r.finish().content;
  EXPECT_NE(kept.find("<｜DSML｜invoke name=\"get_weather\">"), std::string::npos);
}

// Cut off at the token limit inside the block marker itself (max_tokens of a few tokens with a forced tool call):
// the marker's beginning is not content, also when the cut split a character (the engine's U+FFFD), streamed
// byte by byte or whole; a normal end keeps such text.
TEST(OutputParser, TruncatedInsideTheBlockMarkerLeaksNoMarkup) {
  const std::string marker = "\n\n<｜DSML｜tool_calls>";
  const std::string fffd = "\xEF\xBF\xBD";
  for (size_t cut = 1; cut < marker.size(); ++cut) {
    for (const bool split_char : {false, true}) {
      std::string text = "Sure." + marker.substr(0, cut);
      if (split_char) text += fffd;  // a character of the marker cut in two
      for (const size_t step : {size_t(1), text.size()}) {
        OutputParser p(false, "id_");
        std::string content;
        for (size_t i = 0; i < text.size(); i += step) content += p.push(std::string_view(text).substr(i, step)).content;
        content += p.finish(true).content;
        EXPECT_EQ(content, "Sure.") << "cut " << cut << " split " << split_char << " step " << step;
        EXPECT_TRUE(p.tool_calls().empty());
      }
    }
  }
  OutputParser q(false, "id_");
  std::string kept = q.push("Sure.\n\n<｜DSML").content;
  kept += q.finish().content;
  EXPECT_EQ(kept, "Sure.\n\n<｜DSML");
  OutputParser r(false, "id_");  // truncated plain text ending in an ordinary character is kept whole
  std::string plain = r.push("Sure" + fffd).content;
  plain += r.finish(true).content;
  EXPECT_EQ(plain, "Sure" + fffd);
}

}  // namespace
}  // namespace dsv4
