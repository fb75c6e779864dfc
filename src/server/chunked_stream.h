// ChunkedStream: the body of a chunked HTTP response after its connection left the request thread (a "detached"
// response, server/http_transport.h). Producers on any thread append chunks to a bounded buffer and return at
// once; the transport's reactor writes them to the socket without blocking (EPOLLOUT), writes the idle chunk (SSE
// `: keepalive`) when nothing else was written for a while, and drops the connection when the client goes away,
// stops reading (the buffer bound, or no write progress within write_timeout_s) or the server stops.
// Bytes on the wire are what cpp-httplib's chunked content provider writes: per write "<hex size>\r\n<data>\r\n",
// at the end "0\r\n\r\n"; afterwards the connection is kept alive (back to the reactor) or closed as httplib decided
// for the response.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace dsv4 {

class HttpServer;

class ChunkedStream : public std::enable_shared_from_this<ChunkedStream> {
 public:
  ChunkedStream(int fd, size_t max_buffer);
  // One chunk (nothing for empty data). false once the connection is gone (then nothing more is written).
  bool write(std::string_view data);
  // The last chunk: the response is complete once the buffer is written out.
  void done();
  // Ends the response without its last chunk: the connection is closed.
  void abort();
  bool ok() const;
  // Written as one chunk when nothing was written for `interval_s` (before done/abort); <= 0: never.
  void set_idle_chunk(std::string bytes, double interval_s);
  // Called on the reactor thread: `gone` when the connection is lost before done()/abort() (client closed or reset,
  // too slow, server stopping); `closed` once the response is over (written out, or dropped). Set them before
  // anything can happen to the connection (right after detaching).
  void on_gone(std::function<void()> fn);
  void on_closed(std::function<void()> fn);
  int fd() const { return fd_; }

 private:
  friend class HttpServer;
  using Clock = std::chrono::steady_clock;
  bool append_locked(std::string_view data);  // one chunk into out_ (mu_ held)
  void request_flush_locked();

  const int fd_;
  const size_t max_buffer_;
  mutable std::mutex mu_;
  HttpServer* server_ = nullptr;  // null once the reactor let go of the connection
  std::string out_;               // bytes not yet written, from sent_ on
  size_t sent_ = 0;
  bool ok_ = true, ended_ = false, aborted_ = false, keep_alive_ = false, flush_queued_ = false;
  std::string idle_chunk_;
  Clock::duration idle_interval_{0};
  Clock::time_point last_write_ = Clock::now(), last_progress_ = Clock::now();
  std::function<void()> gone_, closed_;
};

}  // namespace dsv4
