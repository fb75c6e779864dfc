// HttpServer: cpp-httplib's Server (routing, request parsing, responses, chunked streaming) over a connection layer
// that slow or idle clients cannot tie up (Linux, epoll).
//
// cpp-httplib 0.11 (Debian 12) runs a connection on one thread of its task queue from accept to close: reading the
// request with a per-read timeout only (a client sending one header byte per second is never timed out), then the
// handler, then the keep-alive wait for the next request. So every slow, idle or keep-alive client holds a thread,
// and a bounded pool is blocked by as many slowloris connections as it has threads. Here instead:
//   - accept: the accepted socket goes to a reactor thread (epoll) and no request thread is involved;
//   - the reactor reads the request — header and body (Content-Length, or a chunked body up to its last chunk; it
//     answers "Expect: 100-continue" itself; with json_bodies it rewrites a form-urlencoded Content-Type to JSON,
//     http_options.h) — into memory, under deadlines: the first byte within idle_timeout_s (of the accept or of the
//     previous response: keep-alive), the whole header within header_timeout_s of its first byte, the body within
//     body_timeout_s of the header; a connection past its deadline is closed (408 where a request had begun);
//   - a complete request goes to one of `workers` request threads, which runs httplib's request processing on a
//     stream that serves the buffered bytes (Server::process_request) and writes the response to the socket with
//     write_timeout_s per write (a client that stops reading is dropped); afterwards a keep-alive connection goes
//     back to the reactor;
//   - a streamed (chunked) response detaches: its content provider, called once the header is written, calls
//     detach_current() and returns false; the request thread is then free, and the connection goes to the reactor
//     with a ChunkedStream (chunked_stream.h) that producers on other threads append chunks to. The reactor writes
//     them without blocking (EPOLLOUT), writes the stream's idle chunk (SSE keepalive) when nothing else was written
//     for its interval, drops the connection when the client closes or resets it (EPOLLRDHUP/HUP/ERR), when its
//     unwritten bytes exceed max_stream_buffer or make no progress for write_timeout_s, or at shutdown (the
//     producer hears of it through on_gone), and after the last chunk keeps the connection alive or closes it as
//     httplib decided for the response. The bytes are those httplib's chunked provider would have written.
// Threads: 1 reactor + `workers` (bounded, fixed at start); open connections at most max_connections (beyond: closed
// at accept). A request thread is busy only while its request runs — for a detached stream, only until its first
// bytes are handed over — so C concurrent streams need no thread each (server.cpp runs their generations on a
// StreamPump of a few threads); a whole response holds its request thread until it is written.
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

#include "server/chunked_stream.h"
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
  // In a chunked content provider (its first call: the response header is written): takes the rest of the response
  // off the request thread. The provider returns false right after (httplib then leaves the connection alone); the
  // request thread returns and the connection goes to the reactor, which writes what the returned stream is given
  // (chunked_stream.h). Null outside a request thread. Called again for the same request: the same stream.
  static std::shared_ptr<ChunkedStream> detach_current();

  struct Stats {
    int64_t open = 0;          // connections open
    int64_t waiting = 0;       // in the reactor (reading a request or idle)
    int64_t busy = 0;          // requests on a request thread
    int64_t queued = 0;        // complete requests waiting for a request thread
    int64_t timed_out = 0;     // connections closed by a deadline
    int64_t refused = 0;       // connections closed at accept (max_connections)
    int64_t requests = 0;      // requests handed to request threads
    int64_t streaming = 0;     // detached responses being written by the reactor
  };
  Stats stats() const;

 private:
  struct Conn;
  class Queue;
  class BufferedStream;
  friend class ChunkedStream;
  bool process_and_close_socket(socket_t sock) override;  // called by httplib's accept loop
  void request_flush(std::shared_ptr<ChunkedStream> s);  // a producer wrote: the reactor flushes
  void release_stream(ChunkedStream& s, bool gone);
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
  std::vector<std::pair<std::unique_ptr<Conn>, std::shared_ptr<ChunkedStream>>> incoming_streams_;  // detached
  std::vector<std::shared_ptr<ChunkedStream>> flush_;  // streams with bytes to write (or ended)
  std::atomic<int64_t> open_{0}, waiting_{0}, busy_{0}, timed_out_{0}, refused_{0}, requests_{0}, streaming_{0};
};

// Whether host:port can be bound now (a test bind with the server's socket options, closed at once), so that a port
// in use is reported before the model loads. "" if it can (or port is 0), else the reason, worded as bind_port's.
std::string probe_listen(const std::string& host, int port);

}  // namespace dsv4
