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
