// The HTTP connection layer (server/http_transport.h): a port that is in use fails to bind with a clear error (no
// silent SO_REUSEPORT sharing); slowloris clients (one header byte at a time) and idle connections hold no request
// thread, so /health answers at once with more slow connections than threads, and they are closed at their
// deadlines (408); keep-alive, pipelining, Content-Length and chunked bodies, concurrent streamed responses beyond
// the number of threads, and the connection limit.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "server/connection_monitor.h"
#include "server/http_transport.h"
#include "server_fixture.h"

using namespace dsv4;
using namespace std::chrono_literals;

namespace {

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

bool send_all(int fd, const std::string& s) {
  return ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == ssize_t(s.size());
}

// Everything the server sends until it closes the connection (or `limit` passes: then `closed` is false).
std::string read_until_closed(int fd, std::chrono::milliseconds limit, bool& closed) {
  std::string out;
  const auto end = std::chrono::steady_clock::now() + limit;
  closed = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) return out;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, int(left.count())) <= 0) return out;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      closed = true;
      return out;
    }
    out.append(buf, size_t(n));
  }
}

// A bare HttpServer on a free port with a few routes, served on a thread.
struct TestServer {
  HttpServer http;
  int port = -1;
  std::thread th;
  explicit TestServer(const HttpTransportOptions& o) {
    http.set_transport(o);
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok", "text/plain"); });
    http.Post("/echo", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(std::to_string(req.body.size()) + ":" + req.body.substr(0, 16), "text/plain");
    });
    http.Post("/type", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(req.get_header_value("Content-Type") + ";" + std::to_string(req.body.size()), "text/plain");
    });
    http.Post("/unread", [](const httplib::Request&, httplib::Response& res) { res.status = 401; });
    http.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
      if (req.path != "/unread") return httplib::Server::HandlerResponse::Unhandled;
      res.status = 401;  // answered before the body is read (as an API-key check does)
      return httplib::Server::HandlerResponse::Handled;
    });
    http.Get("/socket", [](const httplib::Request& req, httplib::Response& res) {
      ConnectionMonitor mon(req.remote_addr, req.remote_port, req.local_port);
      res.set_content(std::string(HttpServer::current_socket() >= 0 ? "socket" : "none") +
                          (mon.found() && !mon.closed() ? " monitored" : ""),
                      "text/plain");
    });
    http.Get("/stream", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/plain", [](size_t, httplib::DataSink& sink) {
        for (int i = 0; i < 5; ++i) {
          const std::string chunk = "chunk" + std::to_string(i) + ";";
          if (!sink.write(chunk.data(), chunk.size())) return false;
          std::this_thread::sleep_for(20ms);
        }
        sink.done();
        return true;
      });
    });
    std::string why;
    port = http.bind_port("127.0.0.1", 0, why);
    EXPECT_GT(port, 0) << why;
    th = std::thread([this] { http.listen_after_bind(); });
    for (int i = 0; i < 200 && !client().Get("/health"); ++i) std::this_thread::sleep_for(5ms);
  }
  ~TestServer() {
    http.stop();
    th.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10, 0);
    c.set_connection_timeout(5, 0);
    return c;
  }
  // Wall time of one GET /health on a new connection; -1 when it failed.
  double health_seconds() const {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = client().Get("/health");
    if (!r || r->status != 200 || r->body != "ok") return -1;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

HttpTransportOptions small(int workers) {
  HttpTransportOptions o;
  o.workers = workers;
  o.idle_timeout_s = 0.5;
  o.header_timeout_s = 0.6;
  o.body_timeout_s = 0.6;
  return o;
}

}  // namespace

TEST(HttpTransport, APortInUseFailsToBindWithAClearError) {
  TestServer a(small(2));
  HttpServer b;
  std::string why;
  EXPECT_EQ(b.bind_port("127.0.0.1", a.port, why), -1);
  EXPECT_NE(why.find("already in use"), std::string::npos) << why;
  // a plain listener (no SO_REUSEPORT) holds a port too
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  HttpServer c;
  EXPECT_EQ(c.bind_port("127.0.0.1", ntohs(addr.sin_port), why), -1);
  EXPECT_NE(why.find("already in use"), std::string::npos) << why;
  ::close(fd);
  // the first server still answers (nobody took over its port)
  EXPECT_GE(a.health_seconds(), 0);
}

TEST(HttpTransport, SlowlorisAndIdleClientsHoldNoThreadAndAreClosedAtTheirDeadline) {
  HttpTransportOptions o = small(2);
  o.header_timeout_s = 1.5;  // after the last byte below, with room for a loaded machine
  TestServer s(o);
  // 20 slowloris connections (10x the request threads) and 10 idle ones
  std::vector<int> slow, idle;
  for (int i = 0; i < 20; ++i) slow.push_back(connect_to(s.port));
  for (int i = 0; i < 10; ++i) idle.push_back(connect_to(s.port));
  for (int fd : slow) ASSERT_GE(fd, 0);
  for (int fd : idle) ASSERT_GE(fd, 0);
  const std::string head = "GET /health HTTP/1.1\r\nHost: x\r\nUser-Agent: slow\r\n";
  double worst = 0;
  for (size_t b = 0; b < 4; ++b) {  // one header byte per connection every 100 ms
    for (int fd : slow) send_all(fd, head.substr(b, 1));
    const double t = s.health_seconds();
    ASSERT_GE(t, 0) << "/health failed while slow clients were connected";
    worst = std::max(worst, t);
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_LT(worst, 1.0);
  EXPECT_GE(s.http.stats().waiting, 30);  // every slow and idle connection is in the reactor, none on a thread
  // past the header deadline (nothing more sent, so no reset loses the answer): each slow connection got 408 and was
  // closed; the idle ones were closed silently
  for (int fd : slow) {
    bool closed = false;
    const std::string got = read_until_closed(fd, 3000ms, closed);
    EXPECT_TRUE(closed);
    EXPECT_NE(got.find("408"), std::string::npos) << got;
    ::close(fd);
  }
  for (int fd : idle) {
    bool closed = false;
    EXPECT_EQ(read_until_closed(fd, 3000ms, closed), "");
    EXPECT_TRUE(closed);
    ::close(fd);
  }
  EXPECT_GE(s.http.stats().timed_out, 30);
  EXPECT_GE(s.health_seconds(), 0);
}

TEST(HttpTransport, SlowBodiesAreTimedOutTooAndCompleteOnesAreServed) {
  TestServer s(small(1));
  // a body in two parts with a pause: served once complete
  int fd = connect_to(s.port);
  send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello");
  std::this_thread::sleep_for(100ms);
  send_all(fd, "world");
  bool closed = false;
  std::string got = read_until_closed(fd, 500ms, closed);
  EXPECT_NE(got.find("10:helloworld"), std::string::npos) << got;
  EXPECT_FALSE(closed);  // keep-alive
  ::close(fd);
  // a body that never completes: 408 at the body deadline, and the request thread stayed free meanwhile
  fd = connect_to(s.port);
  send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc");
  EXPECT_GE(s.health_seconds(), 0);
  got = read_until_closed(fd, 3000ms, closed);
  EXPECT_TRUE(closed);
  EXPECT_NE(got.find("408"), std::string::npos) << got;
  ::close(fd);
  // a chunked body
  fd = connect_to(s.port);
  send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
  std::this_thread::sleep_for(50ms);
  send_all(fd, "3\r\nabc\r\n0\r\n\r\n");
  got = read_until_closed(fd, 500ms, closed);
  EXPECT_NE(got.find("8:helloabc"), std::string::npos) << got;
  ::close(fd);
  // Expect: 100-continue: the body follows the interim answer, and only one interim answer is sent
  fd = connect_to(s.port);
  send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
  got = read_until_closed(fd, 300ms, closed);
  EXPECT_EQ(got, "HTTP/1.1 100 Continue\r\n\r\n");
  send_all(fd, "abcd");
  got = read_until_closed(fd, 500ms, closed);
  EXPECT_NE(got.find("4:abcd"), std::string::npos) << got;
  EXPECT_EQ(got.find("100 Continue"), std::string::npos) << got;
  ::close(fd);
  // a complete request followed by a half-close is still answered
  fd = connect_to(s.port);
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  ::shutdown(fd, SHUT_WR);
  got = read_until_closed(fd, 2000ms, closed);
  EXPECT_NE(got.find("ok"), std::string::npos) << got;
  EXPECT_TRUE(closed);
  ::close(fd);
}

TEST(HttpTransport, KeepAliveAndPipelinedRequestsShareAConnection) {
  TestServer s(small(1));
  const int fd = connect_to(s.port);
  // two requests in one write, then a third after the responses
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\nPOST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz");
  bool closed = false;
  std::string got = read_until_closed(fd, 400ms, closed);
  EXPECT_NE(got.find("ok"), std::string::npos) << got;
  EXPECT_NE(got.find("3:xyz"), std::string::npos) << got;
  EXPECT_FALSE(closed);
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  got = read_until_closed(fd, 2000ms, closed);
  EXPECT_NE(got.find("ok"), std::string::npos) << got;
  EXPECT_TRUE(closed);
  ::close(fd);
  // a body the handler does not read (a 401 answered from the header) is skipped, not taken for the next request
  const int fd2 = connect_to(s.port);
  const std::string unread = "{\"model\": \"not a request line\"}\r\n\r\n";
  send_all(fd2, "POST /unread HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(unread.size()) + "\r\n\r\n" +
                    unread + "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  got = read_until_closed(fd2, 2000ms, closed);
  EXPECT_NE(got.find("401"), std::string::npos) << got;
  EXPECT_EQ(got.find("400"), std::string::npos) << got;
  EXPECT_NE(got.find("ok"), std::string::npos) << got;
  EXPECT_TRUE(closed);
  ::close(fd2);
  // a keep-alive client making several requests on one connection
  httplib::Client c = s.client();
  c.set_keep_alive(true);
  for (int i = 0; i < 5; ++i) {
    auto r = c.Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "ok");
  }
}

// json_bodies: a form-urlencoded Content-Type reaches httplib as application/json, so that a body over httplib's
// 8 KiB cap for forms is served; with Expect: 100-continue before or after it (two edits of one header).
TEST(HttpTransport, FormUrlencodedBodiesAreTakenAsJson) {
  const std::string body(9000, 'x'), len = std::to_string(body.size());
  for (const bool json_bodies : {false, true}) {
    HttpTransportOptions o = small(1);
    o.json_bodies = json_bodies;
    TestServer s(o);
    for (const std::string& head :
         {"POST /type HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: " +
              len + "\r\n\r\n",
          "POST /type HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Type: "
          "application/x-www-form-urlencoded\r\nContent-Length: " + len + "\r\n\r\n",
          "POST /type HTTP/1.1\r\nHost: x\r\ncontent-type: application/x-www-form-urlencoded\r\nContent-Length: " +
              len + "\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"}) {
      const int fd = connect_to(s.port);
      bool closed = false;
      send_all(fd, head);
      if (head.find("Expect") != std::string::npos) {
        EXPECT_EQ(read_until_closed(fd, 300ms, closed), "HTTP/1.1 100 Continue\r\n\r\n");
      }
      send_all(fd, body);
      const std::string got = read_until_closed(fd, 500ms, closed);
      if (json_bodies) {
        EXPECT_NE(got.find("200 OK"), std::string::npos) << got;
        EXPECT_NE(got.find("application/json;9000"), std::string::npos) << got;
      } else {
        EXPECT_NE(got.find("413"), std::string::npos) << got;  // httplib's own cap for forms
      }
      ::close(fd);
    }
    // other content types are left as they are
    auto r = s.client().Post("/type", "abc", "text/plain");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "text/plain;3");
  }
}

TEST(HttpTransport, HandlersSeeTheirConnectionsSocket) {
  TestServer s(small(1));
  auto r = s.client().Get("/socket");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "socket monitored");
  EXPECT_EQ(HttpServer::current_socket(), -1);  // not on a request thread
}

TEST(HttpTransport, MoreConcurrentStreamsThanThreadsAllComplete) {
  TestServer s(small(4));
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; ++i)
    ts.emplace_back([&] {
      auto r = s.client().Get("/stream");
      if (r && r->status == 200 && r->body == "chunk0;chunk1;chunk2;chunk3;chunk4;") ++ok;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 16);
  EXPECT_GE(s.http.stats().requests, 16);
}

TEST(HttpTransport, ConnectionsBeyondTheLimitAreClosedAtAccept) {
  HttpTransportOptions o = small(2);
  o.max_connections = 3;
  o.idle_timeout_s = 5;
  TestServer s(o);
  std::this_thread::sleep_for(50ms);  // the readiness probe's connection is gone
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) fds.push_back(connect_to(s.port));
  std::this_thread::sleep_for(100ms);
  const int extra = connect_to(s.port);
  bool closed = false;
  read_until_closed(extra, 2000ms, closed);
  EXPECT_TRUE(closed);
  EXPECT_GE(s.http.stats().refused, 1);
  ::close(extra);
  for (int fd : fds) ::close(fd);
}

// The dsv4 server: its bind error, and /health under slowloris with more slow connections than request threads.
class ServerTransportTest : public test::ServerTest {};

TEST_F(ServerTransportTest, ASecondServerOnTheSamePortFailsToBind) {
  ServerOptions o;
  o.port = port;
  Server second(o, lm, tok);
  try {
    second.bind();
    FAIL() << "bound to a port in use";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already in use"), std::string::npos) << e.what();
  }
}

TEST_F(ServerTransportTest, SlowlorisConnectionsDoNotDelayHealth) {
  // queue 4: 20 request threads; 40 slow connections would have blocked every one of them
  std::vector<int> slow;
  for (int i = 0; i < 40; ++i) {
    slow.push_back(connect_to(port));
    ASSERT_GE(slow.back(), 0);
  }
  const std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n";
  for (int fd : slow) send_all(fd, head.substr(0, 1));
  std::this_thread::sleep_for(300ms);  // every slow connection accepted and in its header
  for (size_t b = 1; b < 4; ++b) {
    for (int fd : slow) send_all(fd, head.substr(b, 1));
    const auto t0 = std::chrono::steady_clock::now();
    auto r = client().Get("/health");
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_LT(t, 1.0);
    std::this_thread::sleep_for(100ms);
  }
  for (int fd : slow) ::close(fd);
}

// A POST without Content-Length or Transfer-Encoding has an empty body (RFC 9112 §6.3), as `curl -X POST URL`
// sends it (e.g. /admin/park): answered like one with "Content-Length: 0", also when another request follows.
TEST(HttpTransport, APostWithoutALengthHasAnEmptyBody) {
  TestServer s(small(1));
  const int fd = connect_to(s.port);
  send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\n\r\nPOST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
  bool closed = false;
  const std::string got = read_until_closed(fd, 500ms, closed);
  EXPECT_NE(got.find("200 OK"), std::string::npos) << got;
  EXPECT_NE(got.find("0:"), std::string::npos) << got;
  EXPECT_NE(got.find("3:abc"), std::string::npos) << got;
  EXPECT_EQ(got.find("400"), std::string::npos) << got;
  ::close(fd);
}

// A Content-Length that is not 1*DIGIT (a sign, letters, more digits than any length) is a 400 with a JSON error,
// answered at once (not a 413 after the body timeout); the connection is closed.
TEST(HttpTransport, AnInvalidContentLengthIsA400) {
  TestServer s(small(1));
  for (const char* len : {"-5", "12abc", "99999999999999999999", "+3", ""}) {
    const int fd = connect_to(s.port);
    send_all(fd, std::string("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: ") + len + "\r\n\r\n{}");
    bool closed = false;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string got = read_until_closed(fd, 2000ms, closed);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms) << len;
    EXPECT_EQ(got.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << len << ": " << got;
    const size_t body = got.find("\r\n\r\n");
    ASSERT_NE(body, std::string::npos) << got;
    EXPECT_EQ(nlohmann::json::parse(got.substr(body + 4))["error"]["message"], "invalid Content-Length") << got;
    EXPECT_TRUE(closed) << len;
    ::close(fd);
  }
}
