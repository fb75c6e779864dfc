// Streaming split points of tool calls through the responders' output state (server/generation_output.h): the
// model's text cut into two pieces at every byte, and into single bytes, must give the same message, and no chunk
// may carry DSML markup in content. Also the reasoning token count and the log-probability sections.
#include <gtest/gtest.h>

#include "server/anthropic_api.h"
#include "server/generation_output.h"

using namespace dsv4;

namespace {

const std::string kCall =
    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
    "string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" "
    "string=\"false\">3</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"ping\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

struct Streamed {
  std::string reasoning, content;
  std::vector<ToolCallDelta> calls;
  bool markup_in_content = false;
};

Streamed stream(const std::vector<std::string>& pieces, bool thinking) {
  GenerationOutput out(true, thinking, "call_");
  Streamed s;
  auto take = [&](const ChatDelta& d) {
    s.reasoning += d.reasoning;
    s.content += d.content;
    if (d.content.find("DSML") != std::string::npos || d.content.find("｜") != std::string::npos ||
        d.content.find("<") != std::string::npos)
      s.markup_in_content = true;
    for (const auto& c : d.tool_calls) s.calls.push_back(c);
  };
  for (const auto& p : pieces) take(out.push(0, p));
  take(out.finish());
  return s;
}

}  // namespace

TEST(GenerationOutput, ToolCallsAtEverySplitPoint) {
  for (bool thinking : {false, true}) {
    const std::string text = (thinking ? "Let me check.</think>" : "") + std::string("Checking.") + kCall;
    std::vector<std::vector<std::string>> splits;
    for (size_t k = 0; k <= text.size(); ++k) splits.push_back({text.substr(0, k), text.substr(k)});
    std::vector<std::string> bytes;
    for (char c : text) bytes.push_back(std::string(1, c));
    splits.push_back(bytes);
    for (const auto& pieces : splits) {
      const Streamed s = stream(pieces, thinking);
      const std::string where = pieces.size() == 2 ? "split at " + std::to_string(pieces[0].size()) : "bytes";
      EXPECT_FALSE(s.markup_in_content) << where;
      EXPECT_EQ(s.content, "Checking.") << where;
      EXPECT_EQ(s.reasoning, thinking ? "Let me check." : "") << where;
      ASSERT_EQ(s.calls.size(), 2u) << where;
      EXPECT_EQ(s.calls[0].index, 0);
      EXPECT_EQ(s.calls[0].name, "get_weather");
      EXPECT_EQ(s.calls[0].arguments, R"({"city": "Paris", "days": 3})") << where;
      EXPECT_EQ(s.calls[1].index, 1);
      EXPECT_EQ(s.calls[1].name, "ping");
      EXPECT_EQ(s.calls[1].arguments, "{}");
    }
  }
}

TEST(GenerationOutput, AnthropicEventsAtEverySplitPoint) {
  const std::string text = "Hmm.</think>Checking." + kCall;
  for (size_t k = 0; k <= text.size(); k += 3) {
    std::vector<std::pair<std::string, ojson>> events;
    AnthropicStream as([&](const std::string& t, const ojson& d) { events.emplace_back(t, d); }, "msg_1", "m");
    GenerationOutput out(true, true, "toolu_");
    as.start(10);
    as.delta(out.push(0, text.substr(0, k)));
    as.delta(out.push(1, text.substr(k)));
    as.delta(out.finish());
    GenerationResult r;
    r.ids = {0, 1};
    r.finish = FinishReason::stop;
    as.finish(out, r);
    std::vector<std::string> types;  // consecutive content_block_delta events collapsed
    std::vector<ojson> starts;
    std::string thinking, text, json_args;
    for (const auto& [t, d] : events) {
      EXPECT_EQ(d["type"], t);
      if (t != "content_block_delta" || types.back() != t) types.push_back(t);
      if (t == "content_block_start") starts.push_back(d["content_block"]);
      if (t != "content_block_delta") continue;
      const auto& delta = d["delta"];
      if (delta["type"] == "thinking_delta") thinking += delta["thinking"].get<std::string>();
      if (delta["type"] == "text_delta") text += delta["text"].get<std::string>();
      if (delta["type"] == "input_json_delta") json_args += delta["partial_json"].get<std::string>() + ";";
    }
    const std::vector<std::string> want = {
        "message_start",       "content_block_start", "content_block_delta", "content_block_stop",  // thinking
        "content_block_start", "content_block_delta", "content_block_stop",                         // text
        "content_block_start", "content_block_delta", "content_block_stop",                         // tool_use
        "content_block_start", "content_block_delta", "content_block_stop",                         // tool_use
        "message_delta",       "message_stop"};
    EXPECT_EQ(types, want) << "split at " << k;
    ASSERT_EQ(starts.size(), 4u);
    EXPECT_EQ(starts[0]["type"], "thinking");
    EXPECT_EQ(starts[1]["type"], "text");
    EXPECT_EQ(starts[2]["name"], "get_weather");
    EXPECT_EQ(starts[3]["name"], "ping");
    EXPECT_EQ(thinking, "Hmm.");
    EXPECT_EQ(text, "Checking.");
    EXPECT_EQ(json_args, "{\"city\": \"Paris\", \"days\": 3};{};");
    EXPECT_EQ(events[events.size() - 2].second["delta"]["stop_reason"], "tool_use");
  }
}

TEST(GenerationOutput, ReasoningTokensAndLogprobSections) {
  GenerationOutput out(true, true);
  const std::vector<std::string> pieces = {"a", "b", "</think>", "c", "d"};
  for (size_t i = 0; i < pieces.size(); ++i) {
    TokenLogprobs lp;
    lp.id = static_cast<int32_t>(i);
    out.push_logprobs(lp);
    out.push(static_cast<int32_t>(i), pieces[i]);
  }
  out.finish();
  EXPECT_EQ(out.reasoning_tokens(), 2);  // the closing </think> is not counted
  ASSERT_EQ(out.reasoning_logprobs().size(), 3u);
  ASSERT_EQ(out.answer_logprobs().size(), 2u);
  EXPECT_EQ(out.answer_logprobs()[0].id, 3);
  EXPECT_EQ(out.take_reasoning_logprobs().size(), 3u);
  EXPECT_EQ(out.take_reasoning_logprobs().size(), 0u);
  EXPECT_EQ(out.take_answer_logprobs().size(), 2u);
  EXPECT_FALSE(out.has_pending_logprobs());
}
