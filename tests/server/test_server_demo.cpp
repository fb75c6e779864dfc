// Issue 10 acceptance #1 through the HTTP server: 50 concurrent clients on the demo model (CPU), each greedy output
// equal to the same request run alone (the single-sequence Engine, engine/engine.h: another code path).
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/batch_model.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/server.h"

using namespace dsv4;
using json = nlohmann::json;

TEST(ServerDemo, FiftyConcurrentClientsEqualTheirSoloRuns) {
  const std::filesystem::path dir = std::filesystem::path(DSV4_SOURCE_DIR) / "models" / "dsv4-demo";
  ASSERT_TRUE(std::filesystem::exists(dir / "config.json")) << "demo model missing: " << dir;
  std::shared_ptr<const Model> model = Model::load(dir);
  auto tok = std::make_shared<Tokenizer>(Tokenizer::from_file(dir / "tokenizer.json"));

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
