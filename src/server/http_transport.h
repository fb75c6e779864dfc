// HttpServer: cpp-httplib's Server (routing, request parsing, responses, chunked streaming) over a connection layer
// that slow or idle clients cannot tie up (Linux, epoll).
//
// cpp-httplib 0.11 (Debian 12) runs a connection on one thread of its task queue from accept to close: reading the
// request with a per-read timeout only (a client sending one header byte per second is never timed out), then the
// handler, then the keep-alive wait for the next request. So every slow, idle or keep-alive client holds a thread,
// and a bounded pool is blocked by as many slowloris connections as it has threads. Here instead:
//   - accept: the accepted socket goes to a reactor thread (epoll) and no request thread is involved;
//   - the reactor reads the request — header and body (Content-Length, or a chunked body up to its last chunk; it
//     answers "Expect: 100-continue" itself) — into memory, under deadlines: the first byte within idle_timeout_s (of the accept or of the previous
//     response: keep-alive), the whole header within header_timeout_s of its first byte, the body within
//     body_timeout_s of the header; a connection past its deadline is closed (408 where a request had begun);
//   - a complete request goes to one of `workers` request threads, which runs httplib's request processing on a
//     stream that serves the buffered bytes (Server::process_request) and writes the response to the socket with
//     write_timeout_s per write (a client that stops reading is dropped); afterwards a keep-alive connection goes
//     back to the reactor.
// Threads: 1 reactor + `workers` (bounded, fixed at start); open connections at most max_connections (beyond: closed
// at accept). A request thread is busy only while its request runs — for a streamed response, as long as the stream:
// httplib pulls a chunked response on the thread that writes the socket, so C concurrent streams take C request
// threads (size `workers` for the streams to hold; the rest of their connections wait without a thread).
// Binding: SO_REUSEADDR only — httplib's default SO_REUSEPORT would let a second server share the port silently.
#pragma once
#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/http_options.h"

namespace dsv4 {


class HttpServer : public httplib::Server {
 public:
  HttpServer();
  ~HttpServer() override;
  // Before listen_after_bind(); the defaults otherwise.
  void set_transport(const HttpTransportOptions& o);
  // Bind without SO_REUSEPORT. Port 0 picks a free port. Returns the port, or -1 with the reason in `error`.
  int bind_port(const std::string& host, int port, std::string& error);

  // The socket of the request the calling thread is processing (a handler, a content provider), or -1.
  static int current_socket();

  struct Stats {
    int64_t open = 0;          // connections open
    int64_t waiting = 0;       // in the reactor (reading a request or idle)
    int64_t busy = 0;          // requests on a request thread
    int64_t queued = 0;        // complete requests waiting for a request thread
    int64_t timed_out = 0;     // connections closed by a deadline
    int64_t refused = 0;       // connections closed at accept (max_connections)
    int64_t requests = 0;      // requests handed to request threads
  };
  Stats stats() const;

 private:
  struct Conn;
  class Queue;
  class BufferedStream;
  bool process_and_close_socket(socket_t sock) override;  // called by httplib's accept loop
  void start();
  void shutdown();
  void reactor_loop();
  void worker_loop();
  void watch(std::unique_ptr<Conn> c);         // hand a connection to the reactor
  void on_readable(Conn& c, bool& done, bool& dispatch, const char*& reply);
  bool parse(Conn& c, bool& complete, const char*& reply);
  void close_conn(std::unique_ptr<Conn> c, const char* reply);

  HttpTransportOptions opts_;
  int epfd_ = -1, wakefd_ = -1;
  std::thread reactor_;
  std::vector<std::thread> workers_;
  std::atomic<bool> stopping_{false}, started_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;                 // ready requests / stop
  std::deque<std::unique_ptr<Conn>> ready_;    // complete requests, FIFO
  std::vector<std::unique_ptr<Conn>> incoming_;  // for the reactor to add
  std::atomic<int64_t> open_{0}, waiting_{0}, busy_{0}, timed_out_{0}, refused_{0}, requests_{0};
};

}  // namespace dsv4
