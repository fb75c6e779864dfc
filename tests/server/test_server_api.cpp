// Server features of issue 12 against the FakeLm double: log-probabilities, structured output, constrained tool
// calls, reasoning budgets, the Anthropic Messages API, API keys, park / unpark, and the 400s of bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <future>

#include "chat/chat_encoding.h"
#include "chat/tool_name.h"
#include "common/json_validator.h"
#include "server/openai_request.h"
#include "server/server_fixture.h"

using namespace dsv4;
using json = nlohmann::json;
using namespace std::chrono_literals;
using dsv4::test::chat_req;
using dsv4::test::expect_error_shape;
using dsv4::test::kDsmlCall;
using dsv4::test::ServerTest;

namespace {

std::vector<json> sse_json(const std::string& body) {
  std::vector<json> out;
  for (const auto& d : ServerTest::sse_data(body))
    if (d != "[DONE]") out.push_back(json::parse(d));
  return out;
}

// Anthropic SSE: (event, data) pairs.
std::vector<std::pair<std::string, json>> sse_events(const std::string& body) {
  std::vector<std::pair<std::string, json>> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind("event: ", 0) != 0) continue;
    const size_t nl = ev.find('\n');
    out.emplace_back(ev.substr(7, nl - 7), json::parse(ev.substr(nl + 7)));
  }
  return out;
}

json weather_tools() {
  return json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
      "days": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {},
      "additionalProperties": false}}}])");
}

}  // namespace

TEST_F(ServerTest, ChatLogprobsWholeAndStreamed) {
  auto req = chat_req("hi");
  req["temperature"] = 0;
  req["logprobs"] = true;
  req["top_logprobs"] = 3;
  auto j = post_json("/v1/chat/completions", req);
  const auto& lp = j["choices"][0]["logprobs"];
  ASSERT_TRUE(lp["content"].is_array());
  ASSERT_EQ(lp["content"].size(), 11u);  // "Hello world": one byte token each
  EXPECT_TRUE(lp["refusal"].is_null());
  // The first token's log-probability is the FakeLm's log_softmax at the end of the prompt.
  auto prompt = tokenize_prompt(*tok, render_chat(OrderedJson::parse(req.dump())));
  std::vector<float> logits(lm->n_vocab());
  lm->logits_for(prompt, logits);
  double z = 0;
  for (float x : logits) z += std::exp(static_cast<double>(x));
  const auto& first = lp["content"][0];
  EXPECT_EQ(first["token"], "H");
  EXPECT_EQ(first["bytes"], json::array({'H'}));
  EXPECT_NEAR(first["logprob"].get<double>(), logits[*tok->token_id("H")] - std::log(z), 1e-4);
  ASSERT_EQ(first["top_logprobs"].size(), 3u);
  EXPECT_EQ(first["top_logprobs"][0]["token"], "H");
  EXPECT_GE(first["top_logprobs"][0]["logprob"].get<double>(), first["top_logprobs"][1]["logprob"].get<double>());
  std::string joined;
  for (const auto& e : lp["content"]) joined += e["token"].get<std::string>();
  EXPECT_EQ(joined, "Hello world");

  req["stream"] = true;
  auto r = post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(r);
  json streamed = json::array();
  for (const auto& ch : sse_json(r->body)) {
    const auto& l = ch["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (const auto& e : l["content"]) streamed.push_back(e);
  }
  EXPECT_EQ(streamed, lp["content"]);

  // Without logprobs: null.
  req.erase("logprobs");
  req.erase("top_logprobs");
  req["stream"] = false;
  EXPECT_TRUE(post_json("/v1/chat/completions", req)["choices"][0]["logprobs"].is_null());
}

// top_logprobs is capped at 20 like OpenAI's: 20 gives 20 entries per token, 21 (or a negative count) is a 400 naming
// the field and the limit, streamed or not, before anything is generated; the completions API's logprobs likewise.
TEST_F(ServerTest, TopLogprobsAbove20IsA400) {
  auto req = chat_req("hi");
  req["temperature"] = 0;
  req["max_tokens"] = 2;
  req["logprobs"] = true;
  req["top_logprobs"] = 20;
  const json ok = post_json("/v1/chat/completions", req);
  ASSERT_EQ(ok["choices"][0]["logprobs"]["content"].size(), 2u) << ok.dump();
  EXPECT_EQ(ok["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 20u);
  for (const bool stream : {false, true}) {
    for (const int n : {21, 100, -1}) {
      req["top_logprobs"] = n;
      req["stream"] = stream;
      const auto r = post("/v1/chat/completions", req.dump());
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 400) << n << ": " << r->body;
      const json j = json::parse(r->body);
      EXPECT_EQ(j["error"]["param"], "top_logprobs") << r->body;
      EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r->body;
      const std::string msg = j["error"]["message"];
      EXPECT_NE(msg.find("[0, 20]"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(n)), std::string::npos) << msg;
    }
  }
  const auto c = post("/v1/completions", json({{"prompt", "Say:"}, {"max_tokens", 2}, {"logprobs", 21}}).dump());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 400) << c->body;
  EXPECT_EQ(json::parse(c->body)["error"]["param"], "logprobs") << c->body;
  const json c20 = post_json("/v1/completions", {{"prompt", "Say:"}, {"max_tokens", 2}, {"logprobs", 20}});
  // (a {token: logprob} object: byte tokens that print the same string share one key)
  EXPECT_GT(c20["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u) << c20.dump();
  EXPECT_LE(c20["choices"][0]["logprobs"]["top_logprobs"][0].size(), 20u) << c20.dump();
}

TEST_F(ServerTest, ThinkingLogprobsAreSplitBySection) {
  script("Hmm.</think>Ok");
  auto req = chat_req("q", true);
  req["temperature"] = 0;
  req["logprobs"] = true;
  auto j = post_json("/v1/chat/completions", req);
  const auto& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["reasoning_content"].size(), 5u);  // "Hmm." + </think>
  EXPECT_EQ(lp["content"].size(), 2u);
  EXPECT_EQ(lp["reasoning_content"][4]["token"], "</think>");
  EXPECT_TRUE(lp["content"][0]["top_logprobs"].empty());
}

TEST_F(ServerTest, CompletionLogprobs) {
  auto j = post_json("/v1/completions",
                     {{"prompt", "Say:<｜Assistant｜>"}, {"max_tokens", 5}, {"logprobs", 2}, {"temperature", 0}});
  const auto& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);
  EXPECT_EQ(lp["tokens"][0], "H");
  EXPECT_EQ(lp["text_offset"], json::array({0, 1, 2, 3, 4}));
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_LE(lp["token_logprobs"][0].get<double>(), 0.0);
  auto r = post("/v1/completions",
                json({{"prompt", "Say:<｜Assistant｜>"}, {"max_tokens", 5}, {"logprobs", 0}, {"stream", true}}).dump());
  ASSERT_TRUE(r);
  int n = 0;
  for (const auto& ch : sse_json(r->body))
    if (!ch["choices"][0]["logprobs"].is_null()) n += static_cast<int>(ch["choices"][0]["logprobs"]["tokens"].size());
  EXPECT_EQ(n, 5);
}

// text_offset counts characters (code points), as clients slice the text, not UTF-8 bytes. Each CJK character is
// three byte tokens here: a character belongs to the token that completes it, so its first two tokens share the
// offset of the third. Whole and streamed alike.
TEST_F(ServerTest, CompletionTextOffsetsCountCharacters) {
  script("中文 ok");
  const json req = {{"prompt", "Say:<｜Assistant｜>"}, {"max_tokens", 9}, {"logprobs", 0}, {"temperature", 0}};
  const json j = post_json("/v1/completions", req);
  const auto& c = j["choices"][0];
  EXPECT_EQ(c["text"], "中文 ok");
  const json want = json::array({0, 0, 0, 1, 1, 1, 2, 3, 4});
  EXPECT_EQ(c["logprobs"]["text_offset"], want) << c.dump();
  json streamed_req = req;
  streamed_req["stream"] = true;
  auto r = post("/v1/completions", streamed_req.dump());
  ASSERT_TRUE(r);
  json offsets = json::array();
  for (const auto& ch : sse_json(r->body))
    if (!ch["choices"][0]["logprobs"].is_null())
      for (const auto& o : ch["choices"][0]["logprobs"]["text_offset"]) offsets.push_back(o);
  EXPECT_EQ(offsets, want);
}

// Log-probabilities list only tokens whose whole text is in the output: those whose text a stop string removed are
// left out, including the token that holds the stop string's first character when part of its text precedes it
// (OpenAI's rule; engine/text_output.h). Tokens held back as a possible stop string that turns out not to be one are
// listed. Whole and streamed alike.
TEST_F(ServerTest, LogprobsLeaveOutTokensCutByAStopString) {
  auto tokens = [](const json& lp, bool chat) {
    std::vector<std::string> out;
    if (chat) {
      for (const auto& e : lp["content"]) out.push_back(e["token"]);
    } else {
      for (const auto& t : lp["tokens"]) out.push_back(t);
    }
    return out;
  };
  auto streamed_tokens = [&](const std::string& path, json req, bool chat) {
    req["stream"] = true;
    auto r = post(path, req.dump());
    EXPECT_TRUE(r);
    std::vector<std::string> out;
    std::string text;
    for (const auto& ch : sse_json(r->body)) {
      if (ch["choices"].empty()) continue;
      const auto& c = ch["choices"][0];
      if (chat ? c["delta"].contains("content") : c.contains("text"))
        text += (chat ? c["delta"]["content"] : c["text"]).get<std::string>();
      if (!c["logprobs"].is_null())
        for (const auto& t : tokens(c["logprobs"], chat)) out.push_back(t);
    }
    return std::make_pair(text, out);
  };
  struct Case {
    std::string script, stop, text;
    std::vector<std::string> listed;
  };
  for (const Case& k : std::vector<Case>{
           {"Hello world", " wor", "Hello", {"H", "e", "l", "l", "o"}},         // cut at a token boundary
           {"Hello world", " wx", "Hello world", {"H", "e", "l", "l", "o", " ", "w", "o", "r", "l", "d"}},  // no stop
           {"ab</think>cd", "think>", "ab</", {"a", "b"}},  // "</think>" is one token: "</" is output, not listed
           {"a中b", "中", "a", {"a"}},                       // the stop's first character is three byte tokens
           {"中b", "b", "中", {"\xE4", "\xB8", "\xAD"}}}) {
    script(k.script);
    // completions (the text as generated)
    json req = {{"prompt", "Say:<｜Assistant｜>"}, {"max_tokens", 20}, {"logprobs", 0}, {"temperature", 0},
                {"stop", {k.stop}}};
    const json j = post_json("/v1/completions", req);
    const auto& c = j["choices"][0];
    EXPECT_EQ(c["text"], k.text) << k.script << " / " << k.stop;
    auto listed = tokens(c["logprobs"], false);
    std::vector<std::string> want = k.listed;
    // (a byte token that is not valid UTF-8 on its own is shown as U+FFFD)
    for (auto& t : want)
      if (t.size() == 1 && static_cast<uint8_t>(t[0]) >= 0x80) t = "\xEF\xBF\xBD";
    EXPECT_EQ(listed, want) << k.script << " / " << k.stop;
    EXPECT_EQ(c["logprobs"]["text_offset"].size(), want.size());
    const auto [text, streamed] = streamed_tokens("/v1/completions", req, false);
    EXPECT_EQ(text, k.text) << k.script << " / " << k.stop;
    EXPECT_EQ(streamed, want) << k.script << " / " << k.stop;
  }
  // chat: the reported case, content " and" with stop " the"
  script(" and the rest");
  json req = chat_req("q");
  req["temperature"] = 0;
  req["logprobs"] = true;
  req["stop"] = {" the"};
  const json j = post_json("/v1/chat/completions", req);
  EXPECT_EQ(j["choices"][0]["message"]["content"], " and");
  const std::vector<std::string> want = {" ", "a", "n", "d"};
  EXPECT_EQ(tokens(j["choices"][0]["logprobs"], true), want);
  const auto [text, streamed] = streamed_tokens("/v1/chat/completions", req, true);
  EXPECT_EQ(text, " and");
  EXPECT_EQ(streamed, want);
}

TEST_F(ServerTest, JsonSchemaOutputValidatesWhateverTheModelPrefers) {
  // The model wants to write "Hello world"; the grammar only lets it write JSON of the schema.
  const json schemas = json::parse(R"([
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer",
      "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}}, "required": ["name", "n"], "additionalProperties": false},
    {"type": "array", "items": {"enum": ["a", "b", 3]}, "minItems": 1, "maxItems": 3},
    {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"x": {"type": "number", "minimum": 0,
      "maximum": 5}}, "required": ["x"], "additionalProperties": false}]},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 4},
      "t": {"type": ["string", "null"], "maxLength": 3}}, "required": ["s", "t"], "additionalProperties": false}])");
  for (const auto& schema : schemas) {
    for (int seed : {1, 2, 3}) {
      auto req = chat_req("give me json");
      req["temperature"] = seed == 1 ? 0.0 : 1.0;
      req["seed"] = seed;
      req["max_tokens"] = 400;
      req["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "out"}, {"schema", schema}}}};
      auto j = post_json("/v1/chat/completions", req);
      const auto& c = j["choices"][0];
      ASSERT_EQ(c["finish_reason"], "stop") << c.dump();
      const std::string text = c["message"]["content"];
      const auto doc = nlohmann::ordered_json::parse(text, nullptr, false);
      ASSERT_FALSE(doc.is_discarded()) << text;
      const auto s = nlohmann::ordered_json::parse(schema.dump());
      EXPECT_EQ(test::JsonValidator(s).check(doc), "") << schema.dump() << "\n" << text;
    }
  }
}

TEST_F(ServerTest, JsonObjectAfterReasoningAndStreamed) {
  script("Think.</think>{\"x\": [1, 2]}");
  auto req = chat_req("q", true);
  req["temperature"] = 0;
  req["response_format"] = {{"type", "json_object"}};
  auto j = post_json("/v1/chat/completions", req);
  const auto& m = j["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "Think.");
  EXPECT_EQ(m["content"], "{\"x\": [1, 2]}");  // what the model wanted was valid: unchanged
  // The reasoning is free but cannot end the answer early: EOS is masked until </think>.
  script("ab");
  req["max_tokens"] = 40;
  req["temperature"] = 0;  // deterministic: after "ab" the model wants EOS, then the best other token
  req["stream"] = true;
  auto r = post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(r);
  std::string reasoning;
  for (const auto& ch : sse_json(r->body))
    if (!ch["choices"].empty() && ch["choices"][0]["delta"].contains("reasoning_content"))
      reasoning += ch["choices"][0]["delta"]["reasoning_content"].get<std::string>();
  EXPECT_EQ(reasoning.rfind("ab", 0), 0u);
  EXPECT_GT(reasoning.size(), 2u) << "EOS after the reasoning must have been masked";
}

// max_tokens ending inside a tool-call block: finish_reason "length", the open call dropped, no DSML markup in
// content (plain or streamed).
TEST_F(ServerTest, ToolCallCutByMaxTokensLeaksNoMarkup) {
  script(
      "Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
      "string=\"true\">Paris and a long city name that goes on</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>");
  json req = chat_req("weather?");
  req["temperature"] = 0;
  req["max_tokens"] = 40;  // inside the block (after its opening marker)
  req["tools"] = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {
      "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  auto c = post_json("/v1/chat/completions", req)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "length") << c.dump();
  const std::string content = c["message"]["content"].is_string() ? c["message"]["content"].get<std::string>() : "";
  EXPECT_EQ(content.find("DSML"), std::string::npos) << c.dump();
  EXPECT_TRUE(!c["message"].contains("tool_calls") || c["message"]["tool_calls"].empty()) << c.dump();
  req["stream"] = true;
  auto r = post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(r);
  std::string streamed;
  for (const auto& ch : sse_json(r->body))
    if (!ch["choices"].empty() && ch["choices"][0]["delta"].contains("content") &&
        ch["choices"][0]["delta"]["content"].is_string())
      streamed += ch["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(streamed.find("DSML"), std::string::npos) << streamed;
  EXPECT_EQ(streamed, content);
}

TEST_F(ServerTest, ToolChoiceRequiredNamedAndParallel) {
  json req = chat_req("weather?");
  req["tools"] = weather_tools();
  req["max_tokens"] = 400;
  req["temperature"] = 0;
  req["tool_choice"] = "required";
  auto j = post_json("/v1/chat/completions", req);
  auto c = j["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls") << c.dump();
  EXPECT_TRUE(c["message"]["content"].is_null());
  ASSERT_GE(c["message"]["tool_calls"].size(), 1u);
  for (const auto& call : c["message"]["tool_calls"]) {
    const std::string name = call["function"]["name"];
    EXPECT_TRUE(name == "get_weather" || name == "ping");
    EXPECT_TRUE(json::parse(call["function"]["arguments"].get<std::string>()).is_object());
  }
  // Named: that function, with arguments valid against its schema.
  req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  req["parallel_tool_calls"] = false;
  for (int seed : {1, 2, 3, 4}) {
    req["temperature"] = 1.0;
    req["seed"] = seed;
    c = post_json("/v1/chat/completions", req)["choices"][0];
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << c.dump();
    const auto& f = c["message"]["tool_calls"][0]["function"];
    EXPECT_EQ(f["name"], "get_weather");
    const auto args = nlohmann::ordered_json::parse(f["arguments"].get<std::string>());
    const auto schema = nlohmann::ordered_json::parse(weather_tools()[0]["function"]["parameters"].dump());
    EXPECT_EQ(test::JsonValidator(schema).check(args), "") << args.dump();
  }
  // parallel_tool_calls false in auto mode: the model's second call is cut off (the grammar allows one).
  script(
      "Two.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
      "string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>");
  json two = chat_req("weather?");
  two["temperature"] = 0;
  two["tools"] = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {
      "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  auto both = post_json("/v1/chat/completions", two)["choices"][0];
  ASSERT_EQ(both["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(both["message"]["content"], "Two.");
  two["parallel_tool_calls"] = false;
  auto one = post_json("/v1/chat/completions", two)["choices"][0];
  ASSERT_EQ(one["message"]["tool_calls"].size(), 1u) << one.dump();
  EXPECT_EQ(one["message"]["tool_calls"][0]["function"]["arguments"], R"({"city": "Paris"})");
  EXPECT_EQ(one["message"]["content"], "Two.");
  EXPECT_EQ(one["finish_reason"], "tool_calls");
}

TEST_F(ServerTest, StreamedToolCallsCarryNoMarkupInContent) {
  // Every byte is one token (tiny tokenizer): the DSML block arrives split at every byte.
  script(std::string("Checking.") + kDsmlCall);
  json req = chat_req("weather?");
  req["tools"] = weather_tools();
  req["temperature"] = 0;
  req["stream"] = true;
  auto r = post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(r);
  std::string content;
  int calls = 0;
  for (const auto& ch : sse_json(r->body)) {
    if (ch["choices"].empty()) continue;
    const auto& d = ch["choices"][0]["delta"];
    if (d.contains("content")) {
      const std::string piece = d["content"];
      EXPECT_EQ(piece.find("DSML"), std::string::npos) << piece;
      EXPECT_EQ(piece.find('<'), std::string::npos) << piece;
      content += piece;
    }
    if (d.contains("tool_calls")) ++calls;
  }
  EXPECT_EQ(content, "Checking.");
  EXPECT_EQ(calls, 1);
}

TEST_F(ServerTest, ReasoningBudgetClosesTheReasoning) {
  script("one two three four five six seven eight</think>Answer.");
  auto req = chat_req("q", true);
  req["temperature"] = 0;
  req["thinking"]["budget_tokens"] = 5;
  auto j = post_json("/v1/chat/completions", req);
  const auto& m = j["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "one t");  // five byte tokens, then the forced </think>
  EXPECT_EQ(j["usage"]["completion_tokens_details"]["reasoning_tokens"], 5);
  EXPECT_FALSE(m["content"].get<std::string>().empty());
  // Without a budget the model reasons to its own </think>.
  req["thinking"].erase("budget_tokens");
  EXPECT_EQ(post_json("/v1/chat/completions", req)["choices"][0]["message"]["reasoning_content"],
            "one two three four five six seven eight");
}

TEST_F(ServerTest, ServerDefaultReasoningBudget) {
  TearDown();
  configure = [](ServerOptions& o) { o.reasoning_budget = 3; };
  start();
  script("abcdefgh</think>Done");
  auto req = chat_req("q", true);
  req["temperature"] = 0;
  auto j = post_json("/v1/chat/completions", req);
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "abc");
  EXPECT_LE(j["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int>(), 3);
  req["thinking"]["budget_tokens"] = 6;  // the request's own budget wins
  EXPECT_EQ(post_json("/v1/chat/completions", req)["choices"][0]["message"]["reasoning_content"], "abcdef");
}

TEST_F(ServerTest, AnthropicMessagesWholeAndStreamed) {
  json req = {{"model", "claude-x"},
              {"max_tokens", 64},
              {"temperature", 0},
              {"system", "You are terse."},
              {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto j = post_json("/v1/messages", req);
  EXPECT_EQ(j["type"], "message");
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_EQ(j["model"], "test-model");
  EXPECT_EQ(j["id"].get<std::string>().rfind("msg_", 0), 0u);
  ASSERT_EQ(j["content"].size(), 1u);
  EXPECT_EQ(j["content"][0], json({{"type", "text"}, {"text", "Hello world"}}));
  EXPECT_EQ(j["stop_reason"], "end_turn");
  EXPECT_EQ(j["usage"]["output_tokens"], 11);
  // The prompt is the OpenAI rendering of the same conversation.
  json oai = {
      {"messages", {{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "hi"}}}},
      {"thinking", {{"type", "disabled"}}}};
  const int64_t n_prompt = static_cast<int64_t>(prompt_len(oai));
  EXPECT_EQ(post_json("/v1/messages/count_tokens", req)["input_tokens"], n_prompt);
  EXPECT_EQ(j["usage"]["input_tokens"].get<int64_t>() + j["usage"]["cache_read_input_tokens"].get<int64_t>(), n_prompt);

  // Stop sequences and max_tokens.
  req["stop_sequences"] = {"wor"};
  j = post_json("/v1/messages", req);
  EXPECT_EQ(j["content"][0]["text"], "Hello ");
  EXPECT_EQ(j["stop_reason"], "stop_sequence");
  EXPECT_EQ(j["stop_sequence"], "wor");
  req.erase("stop_sequences");
  req["max_tokens"] = 3;
  EXPECT_EQ(post_json("/v1/messages", req)["stop_reason"], "max_tokens");

  // Streaming with thinking.
  script("Plan.</think>Hi!");
  req["max_tokens"] = 64;
  req["thinking"] = {{"type", "enabled"}, {"budget_tokens", 32}};
  req["stream"] = true;
  auto r = post("/v1/messages", req.dump());
  ASSERT_TRUE(r);
  const auto ev = sse_events(r->body);
  ASSERT_GE(ev.size(), 8u);
  EXPECT_EQ(ev.front().first, "message_start");
  EXPECT_EQ(ev.back().first, "message_stop");
  EXPECT_EQ(ev[ev.size() - 2].first, "message_delta");
  EXPECT_EQ(ev[ev.size() - 2].second["delta"]["stop_reason"], "end_turn");
  std::string thinking, text;
  for (const auto& [t, d] : ev) {
    EXPECT_EQ(d["type"], t);
    if (t != "content_block_delta") continue;
    if (d["delta"]["type"] == "thinking_delta") thinking += d["delta"]["thinking"].get<std::string>();
    if (d["delta"]["type"] == "text_delta") text += d["delta"]["text"].get<std::string>();
  }
  EXPECT_EQ(thinking, "Plan.");
  EXPECT_EQ(text, "Hi!");
}

// A stop sequence that matches before any text: one empty text block (whole) / one empty text block opened and closed
// (streamed), stop_reason stop_sequence, stop_sequence set.
TEST_F(ServerTest, AnthropicStopSequenceBeforeAnyText) {
  for (bool thinking : {false, true}) {
    script(thinking ? "</think>Hello world" : "Hello world");  // thinking: no reasoning either
    json req = {{"model", "claude-x"},
                {"max_tokens", 64},
                {"temperature", 0},
                {"stop_sequences", {"Hel"}},
                {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
    if (thinking) req["thinking"] = {{"type", "enabled"}, {"budget_tokens", 32}};
    const std::string what = thinking ? "thinking" : "plain";
    auto j = post_json("/v1/messages", req);
    ASSERT_TRUE(j["content"].is_array()) << what << ": " << j.dump();
    ASSERT_GE(j["content"].size(), 1u) << what << ": " << j.dump();
    const json& last = j["content"].back();
    EXPECT_EQ(last, json({{"type", "text"}, {"text", ""}})) << what << ": " << j.dump();
    for (const auto& b : j["content"]) {
      ASSERT_TRUE(b.contains("type")) << j.dump();
      if (b["type"] == "thinking") {
        EXPECT_TRUE(b["thinking"].is_string() && b["signature"].is_string()) << j.dump();
      }
    }
    EXPECT_EQ(j["stop_reason"], "stop_sequence") << what << ": " << j.dump();
    EXPECT_EQ(j["stop_sequence"], "Hel") << what;

    req["stream"] = true;
    auto r = post("/v1/messages", req.dump());
    ASSERT_TRUE(r);
    const auto ev = sse_events(r->body);
    ASSERT_GE(ev.size(), 5u) << r->body;
    EXPECT_EQ(ev.front().first, "message_start");
    EXPECT_EQ(ev.back().first, "message_stop");
    const json& md = ev[ev.size() - 2].second;
    EXPECT_EQ(ev[ev.size() - 2].first, "message_delta");
    EXPECT_EQ(md["delta"]["stop_reason"], "stop_sequence") << r->body;
    EXPECT_EQ(md["delta"]["stop_sequence"], "Hel") << r->body;
    // every block started is stopped, indexes count from 0, and the last one is a text block
    int open = -1, next = 0;
    std::string last_type;
    for (const auto& [t, d] : ev) {
      if (t == "content_block_start") {
        EXPECT_EQ(open, -1) << r->body;
        EXPECT_EQ(d["index"], next) << r->body;
        open = d["index"];
        last_type = d["content_block"]["type"];
        if (last_type == "text") {
          EXPECT_EQ(d["content_block"]["text"], "");
        }
      } else if (t == "content_block_delta") {
        EXPECT_EQ(d["index"], open) << r->body;
        if (d["delta"]["type"] == "text_delta") {
          EXPECT_FALSE(d["delta"]["text"].get<std::string>().empty());
        }
      } else if (t == "content_block_stop") {
        EXPECT_EQ(d["index"], open) << r->body;
        open = -1;
        ++next;
      }
    }
    EXPECT_EQ(open, -1) << r->body;
    EXPECT_GE(next, 1) << r->body;
    EXPECT_EQ(last_type, "text") << what << ": " << r->body;
  }
}

// A stop sequence inside the reasoning: a thinking block and no text, the same whole and streamed.
TEST_F(ServerTest, AnthropicStopSequenceInsideTheReasoning) {
  script("Plan Hello</think>world");
  json req = {{"model", "claude-x"},
              {"max_tokens", 64},
              {"temperature", 0},
              {"stop_sequences", {"Hel"}},
              {"thinking", {{"type", "enabled"}, {"budget_tokens", 32}}},
              {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto j = post_json("/v1/messages", req);
  EXPECT_EQ(j["stop_reason"], "stop_sequence") << j.dump();
  EXPECT_EQ(j["stop_sequence"], "Hel") << j.dump();
  ASSERT_TRUE(j["content"].is_array() && !j["content"].empty()) << j.dump();
  std::vector<std::string> whole;
  for (const auto& b : j["content"]) whole.push_back(b["type"]);
  req["stream"] = true;
  auto r = post("/v1/messages", req.dump());
  ASSERT_TRUE(r);
  std::vector<std::string> streamed;
  for (const auto& [t, d] : sse_events(r->body))
    if (t == "content_block_start") streamed.push_back(d["content_block"]["type"]);
  EXPECT_EQ(streamed, whole) << j.dump() << "\n" << r->body;
  EXPECT_EQ(j["content"][0]["type"], "thinking") << j.dump();
  EXPECT_EQ(j["content"][0]["thinking"], "Plan ") << j.dump();
}

TEST_F(ServerTest, AnthropicToolUseRoundTrip) {
  json req = {{"model", "x"},
              {"max_tokens", 400},
              {"tools",
               {{{"name", "get_weather"},
                 {"description", "Weather"},
                 {"input_schema", json::parse(R"({"type": "object", "properties": {"city": {"enum":
                                                            ["Paris", "Rome"]}}, "required": ["city"]})")}}}},
              {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}},
              {"messages", {{{"role", "user"}, {"content", "weather?"}}}}};
  auto j = post_json("/v1/messages", req);
  EXPECT_EQ(j["stop_reason"], "tool_use") << j.dump();
  ASSERT_EQ(j["content"].size(), 1u) << j.dump();
  const auto& block = j["content"].back();
  ASSERT_EQ(block["type"], "tool_use");
  EXPECT_EQ(block["name"], "get_weather");
  EXPECT_TRUE(block["input"]["city"] == "Paris" || block["input"]["city"] == "Rome");
  // Anthropic's id form, whole and streamed: "toolu_" and base62 characters (the OpenAI routes' ids start "call_")
  const auto anthropic_id = [](const json& id) {
    const std::string s = id.get<std::string>();
    return s.size() > 6 && s.rfind("toolu_", 0) == 0 &&
           std::all_of(s.begin() + 6, s.end(), [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)); });
  };
  EXPECT_TRUE(anthropic_id(block["id"])) << block["id"];
  json streamed_req = req;
  streamed_req["stream"] = true;
  auto sr = post("/v1/messages", streamed_req.dump());
  ASSERT_TRUE(sr);
  int streamed_uses = 0;
  for (const auto& [t, d] : sse_events(sr->body))
    if (t == "content_block_start" && d["content_block"]["type"] == "tool_use") {
      ++streamed_uses;
      EXPECT_TRUE(anthropic_id(d["content_block"]["id"])) << d.dump();
    }
  EXPECT_EQ(streamed_uses, 1) << sr->body;
  // The call and its result go back in.
  script("Sunny.");
  json follow = req;
  follow["temperature"] = 0;
  follow.erase("tool_choice");
  follow["messages"].push_back({{"role", "assistant"}, {"content", j["content"]}});
  json result = {{"type", "tool_result"}, {"tool_use_id", block["id"]}, {"content", "22 C, clear"}};
  follow["messages"].push_back({{"role", "user"}, {"content", json::array({result})}});
  auto f = post_json("/v1/messages", follow);
  EXPECT_EQ(f["content"][0]["text"], "Sunny.");
  EXPECT_EQ(f["stop_reason"], "end_turn");
}

TEST_F(ServerTest, AnthropicErrorsHaveAnthropicShape) {
  struct Case {
    std::string body;
    int status;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"messages": [{"role": "user", "content": "x"}]})", 400},                     // max_tokens missing
           {R"({"max_tokens": 5, "messages": []})", 400},                                    // empty
           {R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})", 400},  // role
           {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]})", 400},
           {R"({"max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 0}, "messages": [{"role": "user",
               "content": "x"}]})",
            400},
           {R"({"max_tokens": 5, "thinking": {"type": "enabled", "budget": 10}, "messages": [{"role": "user",
               "content": "x"}]})",
            400},
           {R"({"max_tokens": 5, "tool_choice": {"type": "tool", "name": "nope"}, "tools": [{"name": "a",
               "input_schema": {"type": "object"}}], "messages": [{"role": "user", "content": "x"}]})",
            400},
           {R"({"max_tokens": 5, "tools": [{"name": "a b", "input_schema": {"type": "object"}}], "messages": [{"role":
               "user", "content": "x"}]})",
            400},
           {"{bad", 400}}) {
    auto r = post("/v1/messages", c.body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, c.status) << c.body << " -> " << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["type"], "error") << r->body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
  }
  auto nf = client().Post("/v1/messages/nope", "{}", "application/json");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_EQ(json::parse(nf->body)["error"]["type"], "not_found_error");
}

// As Anthropic's API: thinking.budget_tokens counts within max_tokens, so it must be below it (it was accepted).
TEST_F(ServerTest, AnthropicThinkingBudgetBelowMaxTokens) {
  for (int budget : {5, 6}) {
    auto r = post("/v1/messages", R"({"max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": )" +
                                      std::to_string(budget) + R"(}, "messages": [{"role": "user", "content": "x"}]})");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    const std::string msg = json::parse(r->body)["error"]["message"];
    EXPECT_NE(msg.find("'thinking.budget_tokens' must be less than 'max_tokens'"), std::string::npos) << msg;
  }
  script("Plan.</think>Hi!");
  auto ok = post("/v1/messages", R"({"max_tokens": 6, "thinking": {"type": "enabled", "budget_tokens": 5},
      "messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// An unknown tool_choice name is reported with Anthropic's field name (tool_choice.name), not the OpenAI one that the
// request is translated to.
TEST_F(ServerTest, AnthropicUnknownToolChoiceNamesAnthropicsField) {
  auto r = post("/v1/messages", R"({"max_tokens": 5, "tool_choice": {"type": "tool", "name": "nope"}, "tools":
      [{"name": "a", "input_schema": {"type": "object"}}], "messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  const std::string msg = json::parse(r->body)["error"]["message"];
  EXPECT_NE(msg.find("'tool_choice.name'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nope"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("function"), std::string::npos) << msg;
}

TEST_F(ServerTest, InvalidJsonNamesTheParsePositionOnEveryEndpoint) {
  // The same malformed body gets the same message, with the parser's line and column, from the OpenAI and the
  // Anthropic endpoints; each in its own error shape.
  const std::string bad = "{\"max_tokens\": 5,\n \"messages\": [}";
  std::string openai_msg;
  for (const char* path : {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens"}) {
    auto r = post(path, bad);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 400) << path << " -> " << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r->body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << path << " -> " << r->body;
    const std::string msg = j["error"]["message"];
    EXPECT_NE(msg.find("invalid JSON in the request body"), std::string::npos) << path << ": " << msg;
    EXPECT_NE(msg.find("line 2, column 15"), std::string::npos) << path << ": " << msg;
    if (openai_msg.empty()) openai_msg = msg;
    EXPECT_EQ(msg, openai_msg) << path;
    if (std::string(path).rfind("/v1/messages", 0) == 0) {
      EXPECT_EQ(j["type"], "error") << r->body;
    }
  }
}

TEST_F(ServerTest, ApiKeyIsRequiredOnEveryRouteButHealth) {
  TearDown();
  configure = [](ServerOptions& o) { o.api_key = "sekret-key"; };
  start();
  struct Route {
    std::string method, path;
  };
  const std::vector<Route> routes = {{"GET", "/v1/models"},
                                     {"POST", "/v1/chat/completions"},
                                     {"POST", "/v1/completions"},
                                     {"POST", "/v1/messages"},
                                     {"POST", "/v1/messages/count_tokens"},
                                     {"POST", "/admin/park"},
                                     {"POST", "/admin/unpark"},
                                     {"GET", "/nothing/here"}};
  const std::string body = json({{"prompt", "x"}, {"max_tokens", 1}}).dump();
  auto send = [&](const Route& r, const httplib::Headers& h) {
    auto c = client();
    return r.method == "GET" ? c.Get(r.path.c_str(), h) : c.Post(r.path.c_str(), h, body, "application/json");
  };
  for (const auto& r : routes) {
    for (const httplib::Headers& h :
         {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer wrong"}},
          httplib::Headers{{"x-api-key", "sekret-ke"}}, httplib::Headers{{"Authorization", "sekret-key"}}}) {
      auto res = send(r, h);
      ASSERT_TRUE(res) << r.path;
      EXPECT_EQ(res->status, 401) << r.method << " " << r.path;
      const json j = json::parse(res->body);
      if (r.path.rfind("/v1/messages", 0) == 0)
        EXPECT_EQ(j["error"]["type"], "authentication_error") << res->body;
      else
        EXPECT_EQ(j["error"]["code"], "invalid_api_key") << res->body;
    }
  }
  EXPECT_EQ(client().Get("/health")->status, 200);
  auto ok = client().Post("/v1/completions", {{"Authorization", "Bearer sekret-key"}}, body, "application/json");
  EXPECT_EQ(ok->status, 200);
  auto ok2 = client().Get("/v1/models", {{"x-api-key", "sekret-key"}});
  EXPECT_EQ(ok2->status, 200);
}

TEST_F(ServerTest, ParkUnparkGivesTheSameGreedyOutput) {
  auto req = chat_req("hi");
  req["temperature"] = 0;
  const auto before = post_json("/v1/chat/completions", req)["choices"][0]["message"]["content"];
  auto park = post("/admin/park", "");
  ASSERT_TRUE(park);
  EXPECT_EQ(park->status, 200);
  EXPECT_EQ(json::parse(client().Get("/health")->body)["model_state"], "parked");
  auto r = post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "model_parked");
  EXPECT_EQ(r->get_header_value("Retry-After"), "5");
  auto am =
      post("/v1/messages", json({{"max_tokens", 3}, {"messages", {{{"role", "user"}, {"content", "x"}}}}}).dump());
  EXPECT_EQ(am->status, 503);
  EXPECT_EQ(json::parse(am->body)["error"]["type"], "overloaded_error");
  EXPECT_EQ(post("/admin/park", "")->status, 200);  // idempotent
  auto up = post("/admin/unpark", "");
  ASSERT_TRUE(up);
  EXPECT_EQ(up->status, 200);
  EXPECT_EQ(json::parse(up->body)["model_state"], "loaded");
  EXPECT_EQ(post_json("/v1/chat/completions", req)["choices"][0]["message"]["content"], before);
}

TEST_F(ServerTest, ParkWaitsForTheRunningRequestAndAutoUnpark) {
  TearDown();
  configure = [](ServerOptions& o) { o.auto_unpark = true; };
  start();
  lm->set_delay(20ms);
  auto running = std::async(std::launch::async, [&] {
    return post("/v1/completions",
                json({{"prompt", "Say:<｜Assistant｜>"}, {"stream", true}, {"temperature", 0}}).dump());
  });
  std::this_thread::sleep_for(80ms);
  auto park = post("/admin/park", "");
  ASSERT_TRUE(park);
  EXPECT_EQ(park->status, 200);
  auto done = running.get();
  ASSERT_TRUE(done);
  EXPECT_NE(done->body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(done->body.find("error"), std::string::npos) << "the running request completes before the park";
  lm->set_delay(0ms);
  // auto_unpark: the next request loads the model.
  EXPECT_EQ(json::parse(client().Get("/health")->body)["model_state"], "parked");
  auto j = post_json("/v1/completions", {{"prompt", "Say:<｜Assistant｜>"}, {"temperature", 0}});
  EXPECT_EQ(j["choices"][0]["text"], "Hello world");
  EXPECT_EQ(json::parse(client().Get("/health")->body)["model_state"], "loaded");
}

TEST_F(ServerTest, ParkWithoutLoaderIsRefused) {
  TearDown();
  configure = [](ServerOptions& o) { o.reload = nullptr; };
  start();
  auto r = post("/admin/park", "");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409);
}

TEST_F(ServerTest, BadSchemasToolsAndBudgetsName400Fields) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  const auto first = post_json("/v1/chat/completions", chat_req("hi"));
  struct Case {
    std::string body, param;
  };
  const std::vector<Case> cases = {
      {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "string",
          "pattern": "a+"}}}, )" +
           user + "}",
       "response_format.json_schema.schema.pattern"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"properties": {"a":
          {"type": "string", "format": "email"}}}}}, )" +
           user + "}",
       "response_format.json_schema.schema.properties.a.format"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "bad name", "schema": {}}}, )" + user +
           "}",
       "response_format.json_schema.name"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "strictly": true}}, )" +
           user + "}",
       "response_format.json_schema.strictly"},
      {R"({"response_format": {"type": "json_schema"}, )" + user + "}", "response_format.json_schema"},
      {R"({"response_format": {"type": "json_object", "extra": 1}, )" + user + "}", "response_format.extra"},
      {R"({"thinking": {"type": "enabled", "budget_tokens": 0}, )" + user + "}", "thinking.budget_tokens"},
      {R"({"thinking": {"type": "enabled", "budget_tokens": -4}, )" + user + "}", "thinking.budget_tokens"},
      {R"({"thinking": {"type": "enabled", "budget_tokens": "many"}, )" + user + "}", "thinking.budget_tokens"},
      {R"({"thinking": {"type": "enabled", "budget": 5}, )" + user + "}", "thinking.budget"},
      {R"({"tool_choice": {"type": "function", "function": {"name": "f", "strict": true}}, "tools": [{"type":
          "function", "function": {"name": "f"}}], )" +
           user + "}",
       "tool_choice.function.strict"},
      {R"({"tool_choice": {"type": "function", "function": {"name": "g"}}, "tools": [{"type": "function",
          "function": {"name": "f"}}], )" +
           user + "}",
       "tool_choice.function.name"},
      {R"({"tool_choice": "sometimes", )" + user + "}", "tool_choice"},
      {R"({"tool_choice": "required", )" + user + "}", "tool_choice"},
      {R"({"tools": [{"type": "function", "function": {"name": "has space"}}], )" + user + "}",
       "tools[0].function.name"},
      {R"({"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}],
          )" +
           user + "}",
       "tools[1].function.name"},
      {R"({"tools": [{"type": "function"}], )" + user + "}", "tools[0].function"},
      {R"({"tools": [{"type": "retrieval", "function": {"name": "f"}}], )" + user + "}", "tools[0].type"},
      {R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}], )" + user + "}",
       "tools[0].function.parameters"},
      {R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], )" + user +
           "}",
       "tools[0].function.parameters.type"},
      {R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties":
          {"a": {"$ref": "#/nowhere"}}}}}], )" +
           user + "}",
       "tools[0].function.parameters.properties.a.$ref"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}]})",
       "messages[1].tool_call_id"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{"id":
          "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]})",
       "messages[1].tool_calls[0].function.arguments"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{"id":
          "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]})",
       "messages[1].tool_calls[0].function.arguments"},
      {R"({"top_logprobs": 2, )" + user + "}", "top_logprobs"},
      {R"({"reasoning_effort": "extreme", )" + user + "}", "reasoning_effort"},
  };
  for (const auto& c : cases) {
    auto r = post("/v1/chat/completions", c.body);
    ASSERT_TRUE(r) << c.body;
    EXPECT_EQ(r->status, 400) << c.body << " -> " << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r->body;
    expect_error_shape(j, c.param);
  }
  // Nothing was lost: the server still answers, with the prefix cache's blocks of the first request (whole blocks).
  auto ok = post_json("/v1/chat/completions", chat_req("hi"));
  EXPECT_EQ(ok["choices"][0]["message"]["content"], "Hello world");
  EXPECT_EQ(ok["usage"]["prompt_tokens_details"]["cached_tokens"],
            (first["usage"]["prompt_tokens"].get<int>() - 1) / 128 * 128);
  EXPECT_EQ(json::parse(client().Get("/health")->body)["model_state"], "loaded");
}

// The server and the chat renderer (dsv4 render, chat) take the same tool names (chat/tool_name.h): render used to
// take any name, also those the server answers with 400.
TEST(ToolNames, ServerAndRendererAgree) {
  for (const std::string& name : std::vector<std::string>{"f", "get_weather", "a.b-c_9", std::string(64, 'x'), "",
                                                         "has space", "翻译", "a\"b", "a>b", "a/b", "tab\t",
                                                         std::string(65, 'x')}) {
    const nlohmann::ordered_json tools = {{{"type", "function"}, {"function", {{"name", name}}}}};
    bool server_ok = true, render_ok = true;
    try {
      parse_tools(tools);
    } catch (const Error&) {
      server_ok = false;
    }
    try {
      render_chat(nlohmann::ordered_json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", tools}});
    } catch (const Error&) {
      render_ok = false;
    }
    EXPECT_EQ(server_ok, render_ok) << "'" << name << "': server " << server_ok << ", render " << render_ok;
    EXPECT_EQ(server_ok, valid_tool_name(name)) << name;
  }
}

TEST_F(ServerTest, ChatMessageWithoutContentIs400NamingItsIndex) {
  const std::string call = R"("tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f",
      "arguments": "{}"}}])";
  struct Case {
    std::string messages, param, needle;
  };
  const std::vector<Case> bad = {
      {R"([{"role": "user"}])", "messages[0].content", "messages[0].content: is required for a user message"},
      {R"([{"role": "user", "content": null}])", "messages[0].content", "messages[0].content: must not be null"},
      {R"([{"role": "system"}, {"role": "user", "content": "x"}])", "messages[0].content",
       "messages[0].content: is required for a system message"},
      {R"([{"role": "user", "content": "x"}, {"role": "assistant"}, {"role": "user", "content": "y"}])",
       "messages[1].content", "messages[1].content: is required for an assistant message without tool_calls"},
      {R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": null, "tool_calls": []},
          {"role": "user", "content": "y"}])",
       "messages[1].content", "messages[1].content: must not be null for an assistant message"},
      {R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": null, )" + call +
           R"(}, {"role": "tool", "tool_call_id": "c1"}])",
       "messages[2].content", "messages[2].content: is required for a tool message"},
  };
  for (const auto& c : bad) {
    auto r = post("/v1/chat/completions", R"({"model": "x", "messages": )" + c.messages + "}");
    ASSERT_TRUE(r) << c.messages;
    EXPECT_EQ(r->status, 400) << c.messages << " -> " << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r->body;
    expect_error_shape(j, c.param);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_NE(j["error"]["message"].get<std::string>().find(c.needle), std::string::npos) << r->body;
  }
  // An assistant message with tool calls may leave its content out or set it to null.
  for (const std::string content : {"", R"("content": null, )"}) {
    const std::string msgs = R"([{"role": "user", "content": "x"}, {"role": "assistant", )" + content + call +
                             R"(}, {"role": "tool", "tool_call_id": "c1", "content": "r"}])";
    auto r = post("/v1/chat/completions", R"({"model": "x", "max_tokens": 4, "messages": )" + msgs + "}");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << msgs << " -> " << r->body;
  }
}

TEST_F(ServerTest, StructuredAnswerIsClosedWithinMaxTokens) {
  // The FakeLm never ends its strings on its own; the answer must still parse when max_tokens runs out.
  lm->set_script({});
  const json schema = json::parse(R"({"type": "object", "properties": {"text": {"type": "string"}, "more": {"type":
      "array", "items": {"type": "string"}}}, "required": ["text"], "additionalProperties": false})");
  for (bool thinking : {false, true}) {
    for (int max_tokens : {14, 25, 60}) {
      auto req = chat_req("q", thinking);
      req["max_tokens"] = max_tokens;
      req["seed"] = max_tokens;
      req["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}}}};
      auto j = post_json("/v1/chat/completions", req);
      const auto& c = j["choices"][0];
      const std::string text = c["message"]["content"];
      const auto doc = nlohmann::ordered_json::parse(text, nullptr, false);
      ASSERT_FALSE(doc.is_discarded()) << max_tokens << " " << thinking << ": " << text;
      EXPECT_EQ(test::JsonValidator(nlohmann::ordered_json::parse(schema.dump())).check(doc), "") << text;
      EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), max_tokens);
      EXPECT_EQ(c["finish_reason"], "length") << text;
    }
  }
}

// Deeply nested JSON (70,000 levels in ~0.5 MB, far under the body limit) crashed the server: parsing worked, but
// copying and printing the parsed value recursed once per level. Every client JSON text is now checked for depth
// first (core/json_depth.h): a 400 in the endpoint's error shape, and the server goes on serving.
TEST_F(ServerTest, DeeplyNestedJsonIsA400AndTheServerLives) {
  const int levels = 70000;
  const std::string deep = std::string(size_t(levels), '[') + std::string(size_t(levels), ']');
  const std::string deep_obj = [&] {
    std::string s;
    for (int i = 0; i < levels; ++i) s += "{\"a\":";
    s += "1";
    s += std::string(size_t(levels), '}');
    return s;
  }();
  const json user = {{"role", "user"}, {"content", "x"}};
  // the body itself nested deeply (in a field the server would otherwise ignore, and in a schema)
  const std::string chat_unknown = R"({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}], "x": )" + deep + "}";
  const std::string chat_schema = R"({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": )" + deep_obj + "}}}";
  const std::string anth_tool = R"({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"name": "f", "input_schema": )" + deep_obj + "}]}";
  // tool-call arguments: a string holding deeply nested JSON
  json with_args = {{"max_tokens", 2},
                    {"messages",
                     {user,
                      {{"role", "assistant"},
                       {"content", nullptr},
                       {"tool_calls",
                        {{{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", deep_obj}}}}}}},
                      {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "r"}}}}};
  struct Case {
    std::string path, body, needle;
  };
  for (const Case& c : std::vector<Case>{{"/v1/chat/completions", chat_unknown, "nested deeper than"},
                                         {"/v1/chat/completions", chat_schema, "nested deeper than"},
                                         {"/v1/completions", R"({"max_tokens": 2, "prompt": )" + deep + "}",
                                          "nested deeper than"},
                                         {"/v1/messages", anth_tool, "nested deeper than"},
                                         {"/v1/messages/count_tokens", anth_tool, "nested deeper than"},
                                         {"/v1/chat/completions", with_args.dump(), "function.arguments"}}) {
    auto r = post(c.path, c.body);
    ASSERT_TRUE(r) << c.path << ": no response (the server died?)";
    EXPECT_EQ(r->status, 400) << c.path << " -> " << r->body.substr(0, 300);
    const std::string msg = json::parse(r->body)["error"]["message"];
    EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  }
  // nesting up to the limit is still fine (a 400 for another reason or a 200, never "nested deeper")
  const std::string ok_deep = std::string(100, '[') + std::string(100, ']');
  auto ok = post("/v1/chat/completions",
                 R"({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}], "x": )" + ok_deep + "}");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->body.find("nested deeper"), std::string::npos) << ok->body.substr(0, 300);
  EXPECT_EQ(client().Get("/health")->status, 200);
}

// count_tokens answers for a prompt longer than the context too (it answered 400 context_length_exceeded, which made
// it useless for finding how much to trim); generating from that prompt is still a 400.
TEST_F(ServerTest, CountTokensCountsPromptsBeyondTheContext) {
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "word ";  // > 2,048 tokens (the fixture's context)
  const json req = {{"messages", {{{"role", "user"}, {"content", text}}}}};
  auto r = post("/v1/messages/count_tokens", req.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body.substr(0, 300);
  EXPECT_GT(json::parse(r->body)["input_tokens"].get<int64_t>(), 2048);
  json gen = req;
  gen["max_tokens"] = 2;
  auto g = post("/v1/messages", gen.dump());
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 400) << g->body.substr(0, 300);
}
