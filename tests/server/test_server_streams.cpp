// Many concurrent streamed responses on few threads (server/http_transport.h: detached responses, server/stream_pump.h):
// a single-threaded raw-socket client opens N streams at once against a server with 4 request threads; every stream
// completes with the output of the same request run alone, more streams are open at once than the server has request
// threads, and the process's thread count stays far below N. Also: the bytes of a detached response (chunked framing,
// keep-alive reuse of the connection), a client that stops reading being dropped without holding up the others, and
// streams that wait for the model to load getting keepalives without holding a request thread.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "server/server_fixture.h"

namespace dsv4::test {
namespace {

int thread_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string post_bytes(const std::string& path, const std::string& body, bool keep_alive = false) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + (keep_alive ? "\r\n" : "\r\nConnection: close\r\n") + "\r\n" + body;
}

// A chunked response read so far: the header, and the body's chunks once whole.
struct Reply {
  std::string raw;
  size_t header_end = 0;  // 0: header incomplete
  std::vector<std::string> chunks;
  bool complete = false;  // the last chunk arrived
  size_t pos = 0;         // next chunk-size line in raw
  void parse() {
    if (header_end == 0) {
      const size_t p = raw.find("\r\n\r\n");
      if (p == std::string::npos) return;
      header_end = pos = p + 4;
    }
    while (!complete) {
      const size_t eol = raw.find("\r\n", pos);
      if (eol == std::string::npos) return;
      const size_t size = std::strtoull(raw.substr(pos, eol - pos).c_str(), nullptr, 16);
      if (raw.size() < eol + 2 + size + 2) return;
      if (size == 0) {
        complete = true;
        pos = eol + 4;
        return;
      }
      chunks.push_back(raw.substr(eol + 2, size));
      pos = eol + 2 + size + 2;
    }
  }
  std::string body() const {
    std::string b;
    for (const auto& c : chunks) b += c;
    return b;
  }
};

// The content deltas of an OpenAI chat stream, concatenated; "" unless it ended with a finish_reason and [DONE].
std::string stream_content(const std::string& body) {
  std::string content;
  bool finished = false, done = false;
  for (const auto& d : ServerTest::sse_data(body)) {
    if (d == "[DONE]") {
      done = true;
      continue;
    }
    auto j = json::parse(d);
    if (j.contains("error")) return "error: " + j.dump();
    for (const auto& c : j["choices"]) {
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
      if (!c["finish_reason"].is_null()) finished = true;
    }
  }
  return finished && done ? content : "incomplete: " + body;
}

class ServerStreamsTest : public ServerTest {
 public:
  void SetUp() override {
    configure = [](ServerOptions& o) {
      o.http.workers = kWorkers;
      o.keepalive_s = 0.05;
    };
    start(/*queue=*/kStreams, /*n_ctx=*/2048, /*parallel=*/8);
  }
  static constexpr int kWorkers = 4;
  static constexpr int kStreams = 200;
};

TEST_F(ServerStreamsTest, ManyConcurrentStreamsOnFewThreads) {
  script("Hello world, streamed");
  lm->set_delay(2ms);
  auto req = chat_req("hi");
  req["stream"] = true;
  req["temperature"] = 0;
  // alone
  auto solo = post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(solo);
  const std::string want = stream_content(solo->body);
  ASSERT_EQ(want, "Hello world, streamed");

  const int threads_before = thread_count();
  std::vector<int> fds;
  std::vector<Reply> replies(kStreams);
  const std::string bytes = post_bytes("/v1/chat/completions", req.dump());
  for (int i = 0; i < kStreams; ++i) {
    const int fd = connect_to(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
    fds.push_back(fd);
  }
  int peak_threads = thread_count(), peak_open = 0, left = kStreams;
  std::vector<bool> closed(kStreams, false);
  char buf[65536];
  for (int round = 0; left > 0 && round < 20000; ++round) {
    std::vector<pollfd> ps;
    std::vector<int> idx;
    for (int i = 0; i < kStreams; ++i)
      if (!closed[size_t(i)]) {
        ps.push_back({fds[size_t(i)], POLLIN, 0});
        idx.push_back(i);
      }
    if (::poll(ps.data(), ps.size(), 1000) <= 0) continue;
    for (size_t k = 0; k < ps.size(); ++k) {
      if (!(ps[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const int i = idx[k];
      const ssize_t n = ::recv(fds[size_t(i)], buf, sizeof buf, 0);
      if (n > 0) {
        replies[size_t(i)].raw.append(buf, size_t(n));
        replies[size_t(i)].parse();
      }
      if (n <= 0) {
        closed[size_t(i)] = true;
        --left;
      }
    }
    int open = 0;  // streams whose header arrived and whose body is not complete
    for (const auto& r : replies) open += r.header_end > 0 && !r.complete;
    peak_open = std::max(peak_open, open);
    peak_threads = std::max(peak_threads, thread_count());
  }
  for (int fd : fds) ::close(fd);
  ASSERT_EQ(left, 0) << "streams still open";
  for (int i = 0; i < kStreams; ++i) {
    const Reply& r = replies[size_t(i)];
    ASSERT_TRUE(r.complete) << i << ": " << r.raw.substr(0, 300);
    EXPECT_EQ(r.raw.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << i;
    EXPECT_EQ(stream_content(r.body()), want) << i;
  }
  // more streams were open at once than the server has request threads, and no thread per stream was started
  EXPECT_GT(peak_open, 4 * kWorkers) << "streams were not concurrent";
  EXPECT_LT(peak_threads - threads_before, 16) << "threads before " << threads_before << ", peak " << peak_threads;
  std::printf("%d streams: at most %d open at once, threads %d before, %d at most\n", kStreams, peak_open,
              threads_before, peak_threads);
}

TEST_F(ServerStreamsTest, DetachedResponseBytesAndKeepAlive) {
  script("abc");
  auto req = chat_req("hi");
  req["stream"] = true;
  const int fd = connect_to(port);
  ASSERT_GE(fd, 0);
  for (int round = 0; round < 2; ++round) {  // the same connection twice: kept alive after the stream
    const std::string bytes = post_bytes("/v1/chat/completions", req.dump(), /*keep_alive=*/true);
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
    Reply r;
    char buf[4096];
    while (!r.complete) {
      pollfd p{fd, POLLIN, 0};
      ASSERT_GT(::poll(&p, 1, 10000), 0) << "no reply in round " << round;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      ASSERT_GT(n, 0) << "closed in round " << round << ": " << r.raw;
      r.raw.append(buf, size_t(n));
      r.parse();
    }
    const std::string head = r.raw.substr(0, r.header_end);
    EXPECT_EQ(head.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << head;
    EXPECT_NE(head.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << head;
    EXPECT_NE(head.find("Content-Type: text/event-stream\r\n"), std::string::npos) << head;
    EXPECT_NE(head.find("Keep-Alive: timeout="), std::string::npos) << head;
    EXPECT_EQ(r.pos, r.raw.size()) << "bytes after the last chunk";
    ASSERT_GE(r.chunks.size(), 3u);
    for (const auto& c : r.chunks) {  // one SSE frame per chunk
      EXPECT_TRUE(c.rfind("data: ", 0) == 0 || c == ": keepalive\n\n") << c;
      EXPECT_EQ(c.find("\n\n"), c.size() - 2) << c;
    }
    EXPECT_EQ(r.chunks.back(), "data: [DONE]\n\n");
    EXPECT_EQ(stream_content(r.body()), "abc");
  }
  ::close(fd);
}

TEST_F(ServerStreamsTest, ClientThatStopsReadingIsDroppedAndOthersGoOn) {
  // a long stream to a client that never reads: its output outgrows the socket buffers and the stream buffer (or
  // stalls past the write deadline), the server drops it and cancels its request; a stream started after it completes
  std::string text(4000, 'x');
  script(text);
  server->stop();
  th.join();
  configure = [](ServerOptions& o) {
    o.http.workers = 2;
    o.http.max_stream_buffer = 16 << 10;
    o.http.write_timeout_s = 0.5;
  };
  start(4, 8192, 2);
  script(text);
  auto big = chat_req("hi");
  big["stream"] = true;
  big["max_tokens"] = 4000;
  const int stalled = connect_to(port);
  ASSERT_GE(stalled, 0);
  int small = 4096;  // a small receive buffer: the server's writes back up soon
  ::setsockopt(stalled, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  const std::string bytes = post_bytes("/v1/chat/completions", big.dump());
  ASSERT_EQ(::send(stalled, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
  // the dropped client's connection is reset or closed by the server: wait for the end while not reading it
  bool dropped = false;
  for (int i = 0; i < 400 && !dropped; ++i) {
    std::this_thread::sleep_for(25ms);
    auto h = client().Get("/health");
    ASSERT_TRUE(h);
    dropped = json::parse(h->body)["in_flight"] == 0;
  }
  EXPECT_TRUE(dropped) << "the stalled stream still holds its admission";
  // what reached the stalled client is cut off: no last chunk, no [DONE] (it was dropped, not served)
  std::string got;
  char buf[65536];
  for (;;) {
    pollfd p{stalled, POLLIN, 0};
    if (::poll(&p, 1, 2000) <= 0) break;
    const ssize_t n = ::recv(stalled, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  EXPECT_EQ(got.find("[DONE]"), std::string::npos) << got.size() << " bytes";
  EXPECT_NE(got.substr(got.size() >= 5 ? got.size() - 5 : 0), "0\r\n\r\n");
  script("fine");
  auto req = chat_req("hi");
  req["stream"] = true;
  auto r = post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(stream_content(r->body), "fine");
  ::close(stalled);
}

// The text of an Anthropic stream's text deltas; "" unless it ended with message_stop.
std::string anthropic_text(const std::string& body) {
  std::string text;
  bool stopped = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    const size_t d = ev.find("data: ");
    if (ev.rfind("event: ", 0) != 0 || d == std::string::npos) continue;
    const json j = json::parse(ev.substr(d + 6));
    if (j["type"] == "error") return "error: " + j.dump();
    if (j["type"] == "message_stop") stopped = true;
    if (j["type"] == "content_block_delta" && j["delta"]["type"] == "text_delta")
      text += j["delta"]["text"].get<std::string>();
  }
  return stopped ? text : "incomplete: " + body;
}

TEST_F(ServerStreamsTest, StreamsWaitingForTheModelToLoadGetKeepalivesAndHoldNoRequestThread) {
  // The model is parked and loads again on demand (auto_unpark) through a loader that blocks until released: the
  // streams that come meanwhile (more than the 2 request threads) get their header and keepalive comments while it
  // loads, /health answers, and once it is loaded (one load for all) every stream completes.
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    int loads = 0;
    void release() {
      {
        std::lock_guard lk(mu);
        open = true;
      }
      cv.notify_all();
    }
  };
  auto gate = std::make_shared<Gate>();
  struct Opener {  // whatever happens, the loader returns before the server stops
    std::shared_ptr<Gate> g;
    ~Opener() { g->release(); }
  } opener{gate};
  server->stop();
  th.join();
  configure = [this, gate](ServerOptions& o) {
    o.http.workers = 2;
    o.keepalive_s = 0.05;
    o.auto_unpark = true;
    o.reload = [this, gate] {
      std::unique_lock lk(gate->mu);
      ++gate->loads;
      gate->cv.wait(lk, [&] { return gate->open; });
      return std::shared_ptr<const BatchModel>(lm);
    };
  };
  start(/*queue=*/16, /*n_ctx=*/2048, /*parallel=*/2);
  script("Hello world");
  auto park = post("/admin/park", "");
  ASSERT_TRUE(park);
  ASSERT_EQ(park->status, 200);

  constexpr int kOpenAi = 5, kAll = kOpenAi + 1;  // the last one: Anthropic /v1/messages
  auto chat = chat_req("hi");
  chat["stream"] = true;
  chat["temperature"] = 0;
  const json msg = {{"max_tokens", 64},
                    {"stream", true},
                    {"temperature", 0},
                    {"thinking", {{"type", "disabled"}}},
                    {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  std::vector<int> fds;
  std::vector<Reply> replies(kAll);
  for (int i = 0; i < kAll; ++i) {
    const std::string bytes =
        i < kOpenAi ? post_bytes("/v1/chat/completions", chat.dump()) : post_bytes("/v1/messages", msg.dump());
    const int fd = connect_to(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
    fds.push_back(fd);
  }
  struct Closer {
    std::vector<int>& fds;
    ~Closer() {
      for (int fd : fds) ::close(fd);
    }
  } closer{fds};
  auto keepalives = [](const Reply& r) {
    int n = 0;
    for (const auto& c : r.chunks) n += c == ": keepalive\n\n";
    return n;
  };
  // reads what arrives (rounds of at most 100 ms) until done() or the rounds are spent
  char buf[65536];
  std::vector<bool> eof(fds.size(), false);
  auto read_until = [&](const std::function<bool()>& done, int rounds) {
    for (int round = 0; round < rounds && !done(); ++round) {
      std::vector<pollfd> ps;
      for (size_t k = 0; k < fds.size(); ++k) ps.push_back({eof[k] ? -1 : fds[k], POLLIN, 0});
      if (::poll(ps.data(), ps.size(), 100) <= 0) continue;
      for (size_t k = 0; k < ps.size(); ++k) {
        if (!(ps[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::recv(fds[k], buf, sizeof buf, 0);
        if (n > 0) {
          replies[k].raw.append(buf, size_t(n));
          replies[k].parse();
        } else {
          eof[k] = true;
        }
      }
    }
  };
  // while the loader is blocked: every stream has its header and keepalives (nothing else: no lease yet)
  read_until(
      [&] {
        for (const auto& r : replies)
          if (r.header_end == 0 || keepalives(r) < 2) return false;
        return true;
      },
      200);
  for (int i = 0; i < kAll; ++i) {
    const Reply& r = replies[size_t(i)];
    EXPECT_EQ(r.raw.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << i << ": " << r.raw;
    EXPECT_GE(keepalives(r), 2) << i << ": no keepalives while the model loads: " << r.raw;
    EXPECT_EQ(size_t(keepalives(r)), r.chunks.size()) << i << ": output before the model was loaded: " << r.raw;
    EXPECT_FALSE(r.complete) << i;
  }
  {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(5, 0);
    auto h = c.Get("/health");
    ASSERT_TRUE(h) << "/health got no request thread while streams wait for the model";
    EXPECT_EQ(json::parse(h->body)["model_state"], "loading") << h->body;
  }
  {
    std::lock_guard lk(gate->mu);
    EXPECT_EQ(gate->loads, 1);
  }
  gate->release();
  read_until(
      [&] {
        for (const auto& r : replies)
          if (!r.complete) return false;
        return true;
      },
      200);
  for (int i = 0; i < kAll; ++i) {
    const Reply& r = replies[size_t(i)];
    ASSERT_TRUE(r.complete) << i << ": " << r.raw;
    if (i < kOpenAi) EXPECT_EQ(stream_content(r.body()), "Hello world") << i;
    else EXPECT_EQ(anthropic_text(r.body()), "Hello world") << r.body();
  }
  std::lock_guard lk(gate->mu);
  EXPECT_EQ(gate->loads, 1) << "one load for all the streams that waited";
}

TEST_F(ServerStreamsTest, StreamWhoseModelFailsToLoadEndsWithAnErrorEvent) {
  // auto_unpark with a loader that fails once: the streams that waited for that load end with the error (OpenAI: the
  // error and [DONE]; Anthropic: an error event), written from the lease's waiting thread; the next stream loads
  // the model again and works
  auto failures = std::make_shared<std::atomic<int>>(1);
  server->stop();
  th.join();
  configure = [this, failures](ServerOptions& o) {
    o.keepalive_s = 0.05;
    o.auto_unpark = true;
    o.reload = [this, failures] {
      if (failures->fetch_sub(1) > 0) fail("disk on fire");
      return std::shared_ptr<const BatchModel>(lm);
    };
  };
  start(/*queue=*/8, /*n_ctx=*/2048, /*parallel=*/2);
  script("abc");
  ASSERT_EQ(post("/admin/park", "")->status, 200);
  auto req = chat_req("hi");
  req["stream"] = true;
  auto r = post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  const auto data = sse_data(r->body);
  ASSERT_EQ(data.size(), 2u) << r->body;
  const json e = json::parse(data[0]);
  EXPECT_EQ(e["error"]["type"], "server_error") << r->body;
  EXPECT_NE(e["error"]["message"].get<std::string>().find("loading the model failed: disk on fire"),
            std::string::npos)
      << r->body;
  EXPECT_EQ(data[1], "[DONE]");
  EXPECT_EQ(json::parse(client().Get("/health")->body)["model_state"], "parked");
  // Anthropic: the load fails again
  failures->store(1);
  const json msg = {{"max_tokens", 8}, {"stream", true}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto a = post("/v1/messages", msg.dump());
  ASSERT_TRUE(a);
  EXPECT_EQ(a->body.rfind("event: error\n", 0), 0u) << a->body;
  EXPECT_NE(a->body.find("disk on fire"), std::string::npos) << a->body;
  // now the load works
  auto ok = post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(ok);
  EXPECT_EQ(stream_content(ok->body), "abc");
  EXPECT_EQ(json::parse(client().Get("/health")->body)["model_state"], "loaded");
}

}  // namespace
}  // namespace dsv4::test
