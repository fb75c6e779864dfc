// The HTTP server on the demo model (CPU). Issue 10 acceptance #1: 50 concurrent clients, each greedy output equal to
// the same request run alone (the single-sequence Engine, engine/engine.h: another code path). A 6-turn chat with
// thinking on and long replies: each turn reports cached_tokens = every whole block shared with the previous turn's
// prompt, and answers exactly what a cold run of the same prompt answers (a hit that forgot context would not).
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "chat/chat_encoding.h"
#include "engine/batch_model.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/server.h"

using namespace dsv4;
using json = nlohmann::json;

namespace {
const std::filesystem::path kDir = std::filesystem::path(DSV4_SOURCE_DIR) / "models" / "dsv4-demo";
std::shared_ptr<const Model> demo_model() {
  static std::shared_ptr<const Model> m = Model::load(kDir);
  return m;
}
}  // namespace

TEST(ServerDemo, FiftyConcurrentClientsEqualTheirSoloRuns) {
  ASSERT_TRUE(std::filesystem::exists(kDir / "config.json")) << "demo model missing: " << kDir;
  std::shared_ptr<const Model> model = demo_model();
  auto tok = std::make_shared<Tokenizer>(Tokenizer::from_file(kDir / "tokenizer.json"));

  constexpr int kClients = 50, kTokens = 6;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kClients; ++i) {
    std::vector<int32_t> p{model->bos_id()};
    for (int32_t t : tok->encode("Story " + std::to_string(i) + ": the " + (i % 2 ? "river" : "mountain") +
                                 std::string(size_t(i % 5), '!'), false))
      p.push_back(t);
    prompts.push_back(std::move(p));
  }
  // Alone: one sequence, nothing else in its steps.
  std::vector<std::string> solo;
  {
    Engine engine(model, 256);
    for (const auto& p : prompts) {
      GenerationRequest g;
      g.prompt = p;
      g.sampling.temperature = 0;
      g.max_tokens = kTokens;
      solo.push_back(engine.generate(g, tok.get()).text);
      engine.reset();
    }
  }

  ServerOptions so;
  so.port = 0;
  so.n_ctx = 256;
  so.queue = kClients;
  so.engine.max_running = 16;
  so.engine.batch_tokens = 256;
  so.engine.state_bytes = uint64_t(256) << 20;
  Server server(so, batch_model_of(model), tok);
  const int port = server.bind();
  std::thread th([&] { server.serve(); });
  std::vector<std::future<json>> fs;
  for (int i = 0; i < kClients; ++i)
    fs.push_back(std::async(std::launch::async, [&, i] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(300, 0);
      json body = {{"prompt", prompts[size_t(i)]}, {"max_tokens", kTokens}, {"temperature", 0}};
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      if (!r || r->status != 200) return json{{"error", r ? r->body : httplib::to_string(r.error())}};
      return json::parse(r->body);
    }));
  for (int i = 0; i < kClients; ++i) {
    const json j = fs[size_t(i)].get();
    ASSERT_TRUE(j.contains("choices")) << j.dump();
    EXPECT_EQ(j["choices"][0]["text"], solo[size_t(i)]) << "client " << i;
  }
  httplib::Client c("127.0.0.1", port);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("dsv4_requests_finished_total 50"), std::string::npos) << m->body;
  server.stop();
  th.join();
}

TEST(ServerDemo, SixTurnThinkingChatHitsEqualColdRuns) {
  ASSERT_TRUE(std::filesystem::exists(kDir / "config.json")) << "demo model missing: " << kDir;
  std::shared_ptr<const Model> model = demo_model();
  auto tok = std::make_shared<Tokenizer>(Tokenizer::from_file(kDir / "tokenizer.json"));
  ServerOptions so;
  so.port = 0;
  so.n_ctx = 2048;
  so.engine.max_running = 4;
  so.engine.state_bytes = uint64_t(256) << 20;
  Server server(so, batch_model_of(model), tok);
  const int port = server.bind();
  std::thread th([&] { server.serve(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(300, 0);
  Engine cold(model, 2048);
  json req = {{"model", "x"}, {"thinking", {{"type", "enabled"}}}, {"temperature", 0}, {"max_tokens", 128},
              {"messages", json::array()}};
  std::vector<int32_t> prev;
  int64_t last_cached = 0;
  for (int turn = 0; turn < 6; ++turn) {
    req["messages"].push_back(
        {{"role", "user"}, {"content", "Turn " + std::to_string(turn) + ": tell me more about the river and the hills."}});
    const auto prompt = tokenize_prompt(*tok, render_chat(OrderedJson::parse(req.dump())));
    auto r = c.Post("/v1/chat/completions", req.dump(), "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    const json j = json::parse(r->body);
    // The same prompt, cold, through the single-sequence engine.
    GenerationRequest g;
    g.prompt = prompt;
    g.sampling.temperature = 0;
    g.max_tokens = 128;
    cold.reset();
    const GenerationResult want = cold.generate(g, tok.get());
    EXPECT_EQ(j["usage"]["completion_tokens"], int64_t(want.ids.size())) << "turn " << turn;
    const json& msg = j["choices"][0]["message"];
    const std::string got = msg.value("reasoning_content", std::string()) + msg.value("content", std::string());
    std::string want_text = want.text;
    const size_t close = want_text.find("</think>");
    if (close != std::string::npos) want_text.erase(close, 8);
    EXPECT_EQ(got, want_text) << "turn " << turn;
    size_t common = 0;
    while (common < prev.size() && common < prompt.size() && prev[common] == prompt[common]) ++common;
    common = std::min(common, prompt.size() - 1);
    const int64_t cached = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    EXPECT_EQ(cached, int64_t(common / 128 * 128)) << "turn " << turn;
    if (turn > 0) {
      EXPECT_GE(common + 2, prev.size()) << "turn " << turn << ": the rendered history changed before the new part";
    }
    last_cached = cached;
    // The next turn carries the reply as the assistant's answer, with its reasoning (which the template drops: the
    // demo model rarely closes its reasoning, so the text it wrote stands in for the answer to keep replies long).
    req["messages"].push_back({{"role", "assistant"},
                               {"content", got},
                               {"reasoning_content", msg.value("reasoning_content", std::string())}});
    prev = prompt;
  }
  EXPECT_GE(last_cached, 512) << "long replies: the last turns reuse several blocks";
  server.stop();
  th.join();
}

// --spec-draft through the server: the same greedy text as without speculation, the drafts and the accepted drafts
// in `timings` (draft_n, draft_n_accepted) and in /metrics (the demo's MTP module is trained: most drafts accepted).
TEST(ServerDemo, SpeculativeDecodingKeepsTheTextAndReportsDrafts) {
  ASSERT_TRUE(std::filesystem::exists(kDir / "config.json")) << "demo model missing: " << kDir;
  auto tok = std::make_shared<Tokenizer>(Tokenizer::from_file(kDir / "tokenizer.json"));
  ModelOptions mo;
  mo.spec_draft = 2;
  std::shared_ptr<const Model> spec_model = Model::load(kDir, mo);
  const json body = {{"prompt", "The Congress of the United States"}, {"max_tokens", 24}, {"temperature", 0},
                     {"ignore_eos", true}};
  auto run = [&](std::shared_ptr<const Model> m, int spec_draft, std::string* metrics) {
    ServerOptions so;
    so.port = 0;
    so.n_ctx = 256;
    so.engine.max_running = 4;
    so.engine.state_bytes = uint64_t(64) << 20;
    so.engine.spec_draft = spec_draft;
    Server server(so, batch_model_of(std::move(m)), tok);
    const int port = server.bind();
    std::thread th([&] { server.serve(); });
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    json j = r && r->status == 200 ? json::parse(r->body) : json{{"error", r ? r->body : "no answer"}};
    if (metrics) {
      auto mr = c.Get("/metrics");
      *metrics = mr ? mr->body : "";
    }
    server.stop();
    th.join();
    return j;
  };
  const json plain = run(demo_model(), 0, nullptr);
  std::string metrics;
  const json spec = run(spec_model, 2, &metrics);
  ASSERT_TRUE(plain.contains("choices")) << plain.dump();
  ASSERT_TRUE(spec.contains("choices")) << spec.dump();
  EXPECT_EQ(spec["choices"][0]["text"], plain["choices"][0]["text"]);
  EXPECT_EQ(plain["timings"]["draft_n"], 0);
  const int64_t drafted = spec["timings"]["draft_n"], accepted = spec["timings"]["draft_n_accepted"];
  EXPECT_GT(drafted, 0);
  EXPECT_GT(accepted, 0);
  EXPECT_LE(accepted, drafted);
  EXPECT_NE(metrics.find("dsv4_spec_drafted_tokens_total " + std::to_string(drafted)), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dsv4_spec_accepted_tokens_total " + std::to_string(accepted)), std::string::npos)
      << metrics;
}

namespace {
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
}  // namespace

// --spec-draft through the Anthropic API (/v1/messages): usage reports the drafts and the accepted drafts (draft_n,
// draft_n_accepted: the names of the OpenAI path's timings), streamed (message_delta) and not, with the text of a
// server without speculation (which reports 0 drafts). And an OpenAI chat request with a JSON-schema response
// format and log-probabilities speculates too: the same content and log-probabilities as without, drafts reported.
TEST(ServerDemo, SpeculativeDecodingReportsDraftsThroughAnthropicAndConstrainedRequests) {
  ASSERT_TRUE(std::filesystem::exists(kDir / "config.json")) << "demo model missing: " << kDir;
  auto tok = std::make_shared<Tokenizer>(Tokenizer::from_file(kDir / "tokenizer.json"));
  ModelOptions mo;
  mo.spec_draft = 3;
  std::shared_ptr<const Model> spec_model = Model::load(kDir, mo);
  const json msg = {{"model", "x"}, {"max_tokens", 32}, {"temperature", 0},
                    {"messages", {{{"role", "user"}, {"content", "Tell me about the river and the hills."}}}}};
  json stream_msg = msg;
  stream_msg["stream"] = true;
  const json schema = json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
      "age": {"type": "integer"}}, "required": ["name", "age"]})");
  const json chat = {{"model", "x"}, {"max_tokens", 40}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2},
                     {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "p"}, {"schema", schema}}}}},
                     {"messages", {{{"role", "user"}, {"content", "A person as JSON."}}}}};
  struct Answers {
    json message, events, chat;
  };
  auto run = [&](std::shared_ptr<const Model> m, int spec_draft) {
    ServerOptions so;
    so.port = 0;
    so.n_ctx = 512;
    so.engine.max_running = 4;
    so.engine.state_bytes = uint64_t(64) << 20;
    so.engine.spec_draft = spec_draft;
    Server server(so, batch_model_of(std::move(m)), tok);
    const int port = server.bind();
    std::thread th([&] { server.serve(); });
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    auto post = [&](const std::string& path, const json& body) -> std::string {
      auto r = c.Post(path, body.dump(), "application/json");
      return r && r->status == 200 ? r->body : "";
    };
    Answers a;
    const std::string m1 = post("/v1/messages", msg);
    a.message = m1.empty() ? json() : json::parse(m1);
    a.events = json::array();
    for (const auto& [t, d] : sse_events(post("/v1/messages", stream_msg))) a.events.push_back({t, d});
    const std::string c1 = post("/v1/chat/completions", chat);
    a.chat = c1.empty() ? json() : json::parse(c1);
    server.stop();
    th.join();
    return a;
  };
  const Answers plain = run(demo_model(), 0);
  const Answers spec = run(spec_model, 3);
  for (const Answers* a : {&plain, &spec}) {
    ASSERT_TRUE(a->message.contains("usage")) << a->message.dump();
    ASSERT_GE(a->events.size(), 3u);
    ASSERT_TRUE(a->chat.contains("choices")) << a->chat.dump();
  }
  EXPECT_EQ(spec.message["content"], plain.message["content"]);
  EXPECT_EQ(plain.message["usage"]["draft_n"], 0);
  EXPECT_EQ(plain.message["usage"]["draft_n_accepted"], 0);
  const int64_t drafted = spec.message["usage"]["draft_n"], accepted = spec.message["usage"]["draft_n_accepted"];
  EXPECT_GT(drafted, 0);
  EXPECT_GT(accepted, 0);
  EXPECT_LE(accepted, drafted);
  EXPECT_EQ(spec.message["usage"]["output_tokens"], plain.message["usage"]["output_tokens"]);
  // streamed: message_delta's usage, the same text
  auto streamed = [](const json& events, json& usage) {
    std::string text;
    for (const auto& e : events) {
      if (e[0] == "message_delta") usage = e[1]["usage"];
      if (e[0] == "content_block_delta" && e[1]["delta"]["type"] == "text_delta")
        text += e[1]["delta"]["text"].get<std::string>();
    }
    return text;
  };
  json su, pu;
  const std::string stext = streamed(spec.events, su), ptext = streamed(plain.events, pu);
  EXPECT_EQ(stext, ptext);
  EXPECT_EQ(stext, spec.message["content"][0].value("text", std::string()));
  EXPECT_EQ(pu["draft_n"], 0);
  EXPECT_EQ(su["draft_n"], drafted) << "the same request drafts the same";
  EXPECT_EQ(su["draft_n_accepted"], accepted);
  // constrained + logprobs chat
  const json &sc = spec.chat["choices"][0], &pc = plain.chat["choices"][0];
  EXPECT_EQ(sc["message"]["content"], pc["message"]["content"]);
  EXPECT_TRUE(json::parse(pc["message"]["content"].get<std::string>(), nullptr, false).is_object())
      << pc["message"]["content"];
  EXPECT_EQ(sc["logprobs"], pc["logprobs"]);
  EXPECT_FALSE(pc["logprobs"]["content"].empty());
  EXPECT_EQ(plain.chat["timings"]["draft_n"], 0);
  EXPECT_GT(spec.chat["timings"]["draft_n"].get<int64_t>(), 0) << "the constrained request decoded without drafts";
}
