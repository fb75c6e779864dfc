// The server on one engine loop (continuous batching) against the FakeLm double: concurrent requests — with stop
// strings, JSON-schema constraints, log-probabilities and seeds mixed — each give exactly the answer of the same
// request run alone while sharing forward steps; a 6-turn thinking chat with long replies reports, each turn,
// cached_tokens covering every whole block of the part shared with the previous turn; n > 1 choices (seeds
// seed + i, streamed and whole, sharing the prompt's cached blocks); /metrics parses and counts.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cctype>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "chat/chat_encoding.h"
#include "server/server_fixture.h"

using namespace dsv4;
using json = nlohmann::json;
using namespace std::chrono_literals;
using dsv4::test::chat_req;
using dsv4::test::ServerTest;

namespace {

// The parts of a response that must not depend on what else ran: choices (text, logprobs, finish) and token counts.
json answer_of(const json& j) {
  json a = {{"choices", j["choices"]},
            {"prompt_tokens", j["usage"]["prompt_tokens"]},
            {"completion_tokens", j["usage"]["completion_tokens"]}};
  return a;
}

// Metric name -> value (the bucket lines under their full name with labels).
std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> m;
  std::istringstream in(text);
  std::string line;
  const std::regex sample(R"(^(dsv4_[a-z_]+(\{le="[^"]+"\})?) (-?[0-9.]+(e[-+]?[0-9]+)?)$)");
  const std::regex meta(R"(^# (HELP|TYPE) dsv4_[a-z_]+ .+$)");
  while (std::getline(in, line)) {
    std::smatch sm;
    if (std::regex_match(line, meta)) continue;
    EXPECT_TRUE(std::regex_match(line, sm, sample)) << "not a Prometheus sample line: " << line;
    if (sm.size() > 3) m[sm[1]] = std::stod(sm[3]);
  }
  return m;
}

}  // namespace

TEST_F(ServerTest, ConcurrentMixedRequestsEqualTheirSoloRuns) {
  TearDown();
  start(/*queue=*/32, /*n_ctx=*/2048, /*parallel=*/8);
  lm->set_script({});  // hash-chosen tokens: every output depends on the whole history
  const std::string schema = R"({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 5}}, "required": ["a", "b"],
      "additionalProperties": false}}})";
  // A stop string each seeded request surely meets: two ASCII characters from the middle of its unstopped text.
  auto stop_for = [&](const json& r) {
    json probe = r;
    probe.erase("stop");
    const std::string t = post_json("/v1/completions", probe)["choices"][0]["text"].get<std::string>();
    for (size_t k = 4; k + 1 < t.size(); ++k)
      if (std::isalnum(static_cast<unsigned char>(t[k])) && std::isalnum(static_cast<unsigned char>(t[k + 1])))
        return t.substr(k, 2);
    for (size_t k = 2; k < t.size(); ++k)
      if (std::isalnum(static_cast<unsigned char>(t[k]))) return t.substr(k, 1);
    return std::string("\x01");
  };
  std::vector<std::pair<std::string, json>> reqs;
  for (int i = 0; i < 16; ++i) {
    const std::string prompt = std::string(size_t(40 + 23 * i), char('a' + i % 26)) + std::to_string(i);
    switch (i % 4) {
      case 0:  // plain greedy completion
        reqs.push_back({"/v1/completions", {{"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0}}});
        break;
      case 1: {  // seeded sampling with log-probabilities and a stop string that may or may not match
        json r = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 1.5}, {"seed", 100 + i}, {"logprobs", 2}};
        r["stop"] = json::array({stop_for(r), "\x02"});
        reqs.push_back({"/v1/completions", r});
        break;
      }
      case 2: {  // JSON-schema constrained chat
        json r = chat_req(prompt);
        r["max_tokens"] = 40;
        r["seed"] = i;
        r["response_format"] = json::parse(schema);
        reqs.push_back({"/v1/chat/completions", r});
        break;
      }
      default: {  // chat with top log-probabilities
        json r = chat_req(prompt);
        r["max_tokens"] = 12;
        r["temperature"] = 0;
        r["logprobs"] = true;
        r["top_logprobs"] = 2;
        reqs.push_back({"/v1/chat/completions", r});
      }
    }
  }
  // Alone, one after the other (a fresh server: no cache entries from the concurrent run).
  std::vector<json> solo;
  for (const auto& [path, body] : reqs) solo.push_back(answer_of(post_json(path, body)));
  TearDown();
  start(/*queue=*/32, /*n_ctx=*/2048, /*parallel=*/8);
  lm->set_script({});
  lm->set_delay(2ms);  // steps take a while: the requests overlap
  std::vector<std::future<json>> fs;
  for (const auto& [path, body] : reqs)
    fs.push_back(std::async(std::launch::async, [&, p = path, b = body] { return answer_of(post_json(p, b)); }));
  int64_t tokens = 0;
  for (size_t i = 0; i < fs.size(); ++i) {
    const json got = fs[i].get();
    EXPECT_EQ(got, solo[i]) << "request " << i << ": " << reqs[i].second.dump();
    tokens += got["completion_tokens"].get<int64_t>();
    if (i % 4 == 1) {
      EXPECT_EQ(got["choices"][0]["finish_reason"], "stop") << got.dump();  // the stop string was met
    }
    if (i % 4 == 2) {  // the constrained answer parses and follows the schema
      const json a = json::parse(got["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
      ASSERT_TRUE(a.is_object()) << got.dump();
      EXPECT_TRUE(a["a"].is_number_integer());
      EXPECT_TRUE(a["b"].is_string());
    }
  }
  EXPECT_LT(lm->steps.load(), tokens) << "the requests shared no forward step";
  EXPECT_EQ(lm->max_in_flight, 1);
}

TEST_F(ServerTest, SixTurnThinkingChatReusesEverythingBeforeTheNewPart) {
  // Long replies: 150 bytes of reasoning, then 200 of answer (one token per byte).
  const std::string reasoning(150, 'r'), answer = std::string(199, 'w') + ".";
  script(reasoning + "</think>" + answer);
  json req = {{"model", "x"}, {"thinking", {{"type", "enabled"}}}, {"temperature", 0}, {"messages", json::array()}};
  std::vector<int32_t> prev;
  for (int turn = 0; turn < 6; ++turn) {
    req["messages"].push_back({{"role", "user"}, {"content", "Question " + std::to_string(turn) + "?"}});
    const auto prompt = tokenize_prompt(*tok, render_chat(OrderedJson::parse(req.dump())));
    auto j = post_json("/v1/chat/completions", req);
    const auto& msg = j["choices"][0]["message"];
    ASSERT_EQ(msg["content"], answer) << "turn " << turn;
    ASSERT_EQ(msg["reasoning_content"], reasoning) << "turn " << turn;
    // The rendered history drops the earlier reasoning: the new prompt shares with the previous one everything up
    // to that turn's answer start; every whole block of the shared part is reused.
    size_t common = 0;
    while (common < prev.size() && common < prompt.size() && prev[common] == prompt[common]) ++common;
    common = std::min(common, prompt.size() - 1);
    if (turn > 0) {
      EXPECT_GE(common + 2, prev.size()) << "turn " << turn << ": the shared part is not the whole previous prompt";
    }
    EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
    EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], common / 128 * 128) << "turn " << turn;
    const int64_t cached = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    if (turn > 0) {
      EXPECT_GE(cached, (int64_t(prev.size()) - 2) / 128 * 128) << "turn " << turn;
    }
    if (turn == 5) {
      EXPECT_GE(cached, 512);  // five long turns before it
    }
    req["messages"].push_back({{"role", "assistant"}, {"content", answer}});
    prev = prompt;
  }
}

TEST_F(ServerTest, SeveralChoicesShareThePromptAndUseSeedPlusIndex) {
  lm->set_script({});
  lm->set_preference(0.0f);  // near-uniform tokens: different seeds give different texts
  const std::string prompt = std::string(300, 'q') + "?";
  auto one = [&](int seed) {
    json r = {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 1.5}, {"seed", seed}};
    return post_json("/v1/completions", r)["choices"][0]["text"].get<std::string>();
  };
  const std::vector<std::string> alone = {one(7), one(8), one(9)};
  EXPECT_NE(alone[0], alone[1]);
  EXPECT_NE(alone[1], alone[2]);
  const auto before = parse_metrics(client().Get("/metrics")->body);
  json r = {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 1.5}, {"seed", 7}, {"n", 3}};
  auto j = post_json("/v1/completions", r);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], alone[size_t(i)]) << "choice " << i << " samples with seed 7 + " << i;
  }
  const int64_t n_prompt = j["usage"]["prompt_tokens"].get<int64_t>();
  EXPECT_EQ(j["usage"]["completion_tokens"], 3 * 16);
  EXPECT_EQ(j["usage"]["total_tokens"], n_prompt + 3 * 16);
  const auto after = parse_metrics(client().Get("/metrics")->body);
  // Choices 1 and 2 reuse the prompt's blocks (choice 0 too: the solo runs cached them).
  EXPECT_EQ(after.at("dsv4_prefix_cache_hit_tokens_total") - before.at("dsv4_prefix_cache_hit_tokens_total"),
            3 * ((n_prompt - 1) / 128 * 128));

  // Streamed: chunks carry their choice's index; the texts are the same.
  r["stream"] = true;
  auto s = post("/v1/completions", r.dump());
  ASSERT_TRUE(s);
  std::vector<std::string> texts(3);
  std::vector<std::string> finish(3);
  for (const auto& d : sse_data(s->body)) {
    if (d == "[DONE]") continue;
    const json c = json::parse(d);
    for (const auto& ch : c["choices"]) {
      texts.at(ch["index"].get<size_t>()) += ch["text"].get<std::string>();
      if (!ch["finish_reason"].is_null()) finish.at(ch["index"].get<size_t>()) = ch["finish_reason"];
    }
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(texts[size_t(i)], alone[size_t(i)]);
    EXPECT_EQ(finish[size_t(i)], "length");
  }

  // Chat with n = 2 and greedy decoding: both choices are the scripted answer.
  lm->set_preference(20.0f);
  script("Hi!");
  auto c = chat_req("x");
  c["n"] = 2;
  c["temperature"] = 0;
  auto cj = post_json("/v1/chat/completions", c);
  ASSERT_EQ(cj["choices"].size(), 2u);
  EXPECT_EQ(cj["choices"][0]["message"]["content"], "Hi!");
  EXPECT_EQ(cj["choices"][1]["message"]["content"], "Hi!");
  EXPECT_EQ(cj["usage"]["completion_tokens"], 2 * 3);
}

// `timings` (llama.cpp's names): prompt_ms is the prompt processing, predicted_ms the generation after it; prompt_n +
// cache_n is usage.prompt_tokens and predicted_n usage.completion_tokens, also for n > 1 (all choices' tokens) and
// in the last chunk of a stream.
TEST_F(ServerTest, TimingsMeasurePromptAndGenerationAlsoForSeveralChoices) {
  lm->set_script({});
  lm->set_preference(0.0f);
  const std::string prompt = std::string(200, 'r') + "?";
  auto check = [](const json& j, const std::string& what) {
    ASSERT_TRUE(j.contains("timings")) << what << ": " << j.dump();
    const json& t = j["timings"];
    const json& u = j["usage"];
    EXPECT_GT(t["prompt_ms"].get<double>(), 0.0) << what << ": " << t.dump();
    EXPECT_GT(t["predicted_ms"].get<double>(), 0.0) << what << ": " << t.dump();
    EXPECT_NE(t["prompt_ms"].get<double>(), t["predicted_ms"].get<double>()) << what << ": " << t.dump();
    EXPECT_GT(t["prompt_n"].get<int64_t>(), 0) << what;
    EXPECT_EQ(t["prompt_n"].get<int64_t>() + t["cache_n"].get<int64_t>(), u["prompt_tokens"].get<int64_t>())
        << what << ": " << j.dump();
    EXPECT_EQ(t["cache_n"], u["prompt_tokens_details"]["cached_tokens"]) << what;
    EXPECT_EQ(t["predicted_n"], u["completion_tokens"]) << what << ": " << j.dump();
    EXPECT_GT(t["predicted_per_second"].get<double>(), 0.0) << what;
    EXPECT_GT(t["prompt_per_second"].get<double>(), 0.0) << what;
  };
  for (int n : {1, 3}) {
    for (int max_tokens : {1, 12}) {
      const std::string what = "n " + std::to_string(n) + ", max_tokens " + std::to_string(max_tokens);
      json r = {{"prompt", prompt + std::to_string(n * 100 + max_tokens)}, {"max_tokens", max_tokens},
                {"temperature", 1.0}, {"seed", 3}, {"n", n}};
      const json j = post_json("/v1/completions", r);
      EXPECT_EQ(j["usage"]["completion_tokens"], n * max_tokens) << what;
      check(j, what);
      // streamed: the usage chunk carries the timings
      r["stream"] = true;
      r["stream_options"] = {{"include_usage", true}};
      r["prompt"] = "s" + r["prompt"].get<std::string>();
      auto s = post("/v1/completions", r.dump());
      ASSERT_TRUE(s);
      json last;
      for (const auto& d : sse_data(s->body))
        if (d != "[DONE]") last = json::parse(d);
      ASSERT_TRUE(last.contains("usage")) << s->body;
      check(last, "streamed " + what);
    }
  }
  auto c = chat_req("timings");
  c["n"] = 2;
  c["max_tokens"] = 5;
  check(post_json("/v1/chat/completions", c), "chat n 2");
}

TEST_F(ServerTest, MetricsParseAndCount) {
  auto first = client().Get("/metrics");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 200);
  EXPECT_NE(first->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  const auto m0 = parse_metrics(first->body);
  for (const char* name : {"dsv4_requests_running", "dsv4_requests_waiting", "dsv4_generated_tokens_total",
                           "dsv4_generated_tokens_per_second", "dsv4_prompt_tokens_total",
                           "dsv4_prefix_cache_hits_total", "dsv4_prefix_cache_hit_tokens_total",
                           "dsv4_prefix_cache_bytes", "dsv4_state_slots_total", "dsv4_state_slots_used",
                           "dsv4_state_pages_total", "dsv4_state_pages_used", "dsv4_step_seconds_count",
                           "dsv4_step_seconds_sum", "dsv4_step_seconds_bucket{le=\"+Inf\"}"})
    EXPECT_TRUE(m0.count(name)) << name;
  EXPECT_EQ(m0.at("dsv4_state_slots_total"), 4);
  EXPECT_EQ(m0.at("dsv4_generated_tokens_total"), 0);

  const std::string prompt = std::string(200, 'm');
  int64_t generated = 0, prompt_tokens = 0;
  for (int i = 0; i < 3; ++i) {
    auto j = post_json("/v1/completions", {{"prompt", prompt}, {"max_tokens", 5 + i}, {"temperature", 0}});
    generated += j["usage"]["completion_tokens"].get<int64_t>();
    prompt_tokens += j["usage"]["prompt_tokens"].get<int64_t>();
  }
  wait_idle();
  const auto m = parse_metrics(client().Get("/metrics")->body);
  EXPECT_EQ(m.at("dsv4_generated_tokens_total"), generated);
  EXPECT_EQ(m.at("dsv4_prompt_tokens_total"), prompt_tokens);
  EXPECT_EQ(m.at("dsv4_requests_finished_total"), 3);
  EXPECT_EQ(m.at("dsv4_prefix_cache_hits_total"), 2);  // the 2nd and 3rd reuse the first's block
  EXPECT_EQ(m.at("dsv4_prefix_cache_hit_tokens_total"), 2 * 128);
  EXPECT_GT(m.at("dsv4_prefix_cache_bytes"), 0);
  EXPECT_EQ(m.at("dsv4_requests_running"), 0);
  EXPECT_EQ(m.at("dsv4_state_slots_used"), 0);
  EXPECT_EQ(m.at("dsv4_http_generation_requests_total"), 3);
  EXPECT_GE(m.at("dsv4_step_seconds_count"), 1);
  EXPECT_EQ(m.at("dsv4_step_seconds_bucket{le=\"+Inf\"}"), m.at("dsv4_step_seconds_count"));
  double prev = 0;
  for (const auto& [k, v] : m)
    if (k.rfind("dsv4_step_seconds_bucket", 0) == 0 && k.find("+Inf") == std::string::npos) {
      EXPECT_LE(v, m.at("dsv4_step_seconds_count"));
      prev = std::max(prev, v);
    }
  EXPECT_GT(prev, 0);
}

TEST_F(ServerTest, AnthropicUsageReportsCacheReadInputTokens) {
  const json req = {{"max_tokens", 4}, {"messages", {{{"role", "user"}, {"content", std::string(400, 'z')}}}}};
  const json a = post_json("/v1/messages", req);
  EXPECT_EQ(a["usage"]["cache_read_input_tokens"], 0);
  const int64_t n = a["usage"]["input_tokens"].get<int64_t>();
  const json b = post_json("/v1/messages", req);
  const int64_t cached = (n - 1) / 128 * 128;
  ASSERT_GE(cached, 384);
  EXPECT_EQ(b["usage"]["cache_read_input_tokens"], cached);
  EXPECT_EQ(b["usage"]["input_tokens"], n - cached);  // Anthropic: input_tokens excludes the cache reads
  EXPECT_EQ(b["content"], a["content"]);
}

TEST_F(ServerTest, ContextIsClampedToWhatTheStatePoolHolds) {
  TearDown();
  // 4 slots + 1 snapshot + 5 pages of 128 positions (the FakeLm's nominal 1 MiB each).
  configure = [](ServerOptions& o) { o.engine.state_bytes = uint64_t(10) << 20; };
  start();
  const json h = json::parse(client().Get("/health")->body);
  EXPECT_EQ(h["n_ctx"], 5 * 128);
  auto r = post("/v1/completions", json({{"prompt", std::string(700, 'p')}, {"max_tokens", 2}}).dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "context_length_exceeded");
  // What fits is served.
  lm->set_script({});
  auto ok = post_json("/v1/completions", {{"prompt", std::string(500, 'p')}, {"max_tokens", 4}, {"temperature", 0}});
  EXPECT_EQ(ok["usage"]["completion_tokens"], 4);
}

TEST_F(ServerTest, ConcurrentStreamsEqualTheirWholeSoloAnswers) {
  lm->set_script({});
  std::vector<json> reqs;
  for (int i = 0; i < 6; ++i)
    reqs.push_back({{"prompt", std::string(size_t(30 + 41 * i), char('k' + i))}, {"max_tokens", 18},
                    {"temperature", i % 2 ? 1.2 : 0.0}, {"seed", 5 + i}, {"logprobs", 1}});
  std::vector<std::pair<std::string, json>> solo;  // text and log-probability tokens, whole, one at a time
  for (const auto& r : reqs) {
    const json j = post_json("/v1/completions", r);
    solo.push_back({j["choices"][0]["text"], j["choices"][0]["logprobs"]["token_logprobs"]});
  }
  lm->set_delay(3ms);
  std::vector<std::future<std::pair<std::string, json>>> fs;
  for (const auto& r : reqs)
    fs.push_back(std::async(std::launch::async, [&, r] {
      json s = r;
      s["stream"] = true;
      auto res = post("/v1/completions", s.dump());
      std::string text;
      json lps = json::array();
      if (!res) return std::make_pair(text, lps);
      for (const auto& d : sse_data(res->body)) {
        if (d == "[DONE]") continue;
        const json c = json::parse(d);
        text += c["choices"][0]["text"].get<std::string>();
        if (!c["choices"][0]["logprobs"].is_null())
          for (const auto& v : c["choices"][0]["logprobs"]["token_logprobs"]) lps.push_back(v);
      }
      return std::make_pair(text, lps);
    }));
  for (size_t i = 0; i < fs.size(); ++i) {
    const auto got = fs[i].get();
    EXPECT_EQ(got.first, solo[i].first) << "request " << i;
    EXPECT_EQ(got.second, solo[i].second) << "request " << i;
  }
}
