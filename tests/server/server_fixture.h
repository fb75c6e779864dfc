// Fixture of the in-process server tests: a Server on an ephemeral port in front of the FakeLm test double and the
// tiny byte-level tokenizer (every byte is one token), with HTTP helpers. `configure` adjusts the ServerOptions
// before start(); the model loader used by /admin/unpark hands back the same FakeLm.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "chat/chat_encoding.h"
#include "common/fake_lm.h"
#include "common/tiny_tokenizer.h"
#include "server/server.h"

namespace dsv4::test {

using json = nlohmann::json;
using namespace std::chrono_literals;

inline const char* kDsmlCall =
    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
    "string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

class ServerTest : public ::testing::Test {
 public:
  void start(int queue = 4, int64_t n_ctx = 2048, int64_t parallel = 4) {
    tok = std::make_shared<Tokenizer>(Tokenizer::from_json_text(test::tiny_tokenizer_json()));
    lm = std::make_shared<test::FakeLm>(tok->n_vocab(), 8192);
    script("Hello world");
    ServerOptions o;
    o.port = 0;
    o.n_ctx = n_ctx;
    o.queue = queue;
    o.engine.max_running = parallel;
    o.engine.batch_tokens = 256;
    o.model_name = "test-model";
    o.keepalive_s = 0.05;
    o.reload = [this] { return std::shared_ptr<const BatchModel>(lm); };
    if (configure) configure(o);
    server = std::make_unique<Server>(o, lm, tok);
    port = server->bind();
    th = std::thread([this] { server->serve(); });
    for (int i = 0; i < 200 && !client().Get("/health"); ++i) std::this_thread::sleep_for(5ms);
  }
  void SetUp() override { start(); }
  void TearDown() override {
    server->stop();
    th.join();
  }
  void script(const std::string& text) {
    lm->set_script(tok->encode(text, true), *tok->token_id("<｜Assistant｜>"),
                   {*tok->token_id("<think>"), *tok->token_id("</think>")});
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(20, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body) {
    return client().Post(path.c_str(), body, "application/json");
  }
  json post_json(const std::string& path, const json& body, int want_status = 200) {
    auto r = post(path, body.dump());
    EXPECT_TRUE(r) << path;
    if (!r) return {};
    EXPECT_EQ(r->status, want_status) << r->body;
    return json::parse(r->body);
  }
  // Splits an SSE body into its data payloads; counts comment lines.
  static std::vector<std::string> sse_data(const std::string& body, int* comments = nullptr) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < body.size()) {
      size_t end = body.find("\n\n", pos);
      if (end == std::string::npos) end = body.size();
      std::string ev = body.substr(pos, end - pos);
      pos = end + 2;
      if (ev.rfind("data: ", 0) == 0)
        out.push_back(ev.substr(6));
      else if (ev.rfind(":", 0) == 0 && comments)
        ++*comments;
    }
    return out;
  }
  size_t prompt_len(const json& req) {
    return tokenize_prompt(*tok, render_chat(OrderedJson::parse(req.dump()))).size();
  }
  void wait_idle() {
    for (int i = 0; i < 400; ++i) {
      auto h = client().Get("/health");
      if (h && h->status == 200) {
        auto j = json::parse(h->body);
        if (!j["busy"].get<bool>() && j["waiting"] == 0) return;
      }
      std::this_thread::sleep_for(5ms);
    }
    FAIL() << "server did not become idle";
  }

  std::function<void(ServerOptions&)> configure;  // set before start() (e.g. an API key)
  std::shared_ptr<Tokenizer> tok;
  std::shared_ptr<test::FakeLm> lm;
  std::unique_ptr<Server> server;
  std::thread th;
  int port = 0;
};

inline json chat_req(const std::string& user, bool thinking = false) {
  return {{"model", "x"},
          {"messages", {{{"role", "user"}, {"content", user}}}},
          {"thinking", {{"type", thinking ? "enabled" : "disabled"}}}};
}

inline void expect_error_shape(const json& j, const std::string& param) {
  ASSERT_TRUE(j.contains("error")) << j.dump();
  const auto& e = j["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
  EXPECT_TRUE(e["type"].is_string());
  EXPECT_TRUE(e.contains("param"));
  EXPECT_TRUE(e.contains("code"));
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << j.dump();
  }
}

}  // namespace dsv4::test
