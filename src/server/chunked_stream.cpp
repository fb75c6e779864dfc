// The producer side of a detached chunked response (chunked_stream.h); the reactor side is in http_transport.cpp.
#include "server/chunked_stream.h"

#include <cstdio>

#include "server/http_transport.h"

namespace dsv4 {

ChunkedStream::ChunkedStream(int fd, size_t max_buffer) : fd_(fd), max_buffer_(max_buffer) {}

bool ChunkedStream::append_locked(std::string_view data) {
  if (!ok_ || ended_) return false;
  char size[24];
  const int k = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  const size_t add = size_t(k) + data.size() + 2;
  if (out_.size() - sent_ + add > max_buffer_) {  // the client does not read: the reactor drops the connection
    ok_ = false;
    request_flush_locked();
    return false;
  }
  if (sent_ == out_.size()) last_progress_ = Clock::now();  // the write deadline runs from here
  out_.append(size, size_t(k));
  out_.append(data);
  out_.append("\r\n");
  last_write_ = Clock::now();
  request_flush_locked();
  return true;
}

void ChunkedStream::request_flush_locked() {
  if (flush_queued_ || !server_) return;
  flush_queued_ = true;
  server_->request_flush(shared_from_this());
}

bool ChunkedStream::write(std::string_view data) {
  std::lock_guard lk(mu_);
  if (data.empty()) return ok_ && !ended_;
  return append_locked(data);
}

void ChunkedStream::done() {
  std::lock_guard lk(mu_);
  if (!ok_ || ended_) return;
  if (sent_ == out_.size()) last_progress_ = Clock::now();
  out_.append("0\r\n\r\n");
  ended_ = true;
  request_flush_locked();
}

void ChunkedStream::abort() {
  std::lock_guard lk(mu_);
  if (ended_) return;
  ended_ = aborted_ = true;
  request_flush_locked();
}

bool ChunkedStream::ok() const {
  std::lock_guard lk(mu_);
  return ok_;
}

void ChunkedStream::set_idle_chunk(std::string bytes, double interval_s) {
  std::lock_guard lk(mu_);
  idle_chunk_ = std::move(bytes);
  idle_interval_ = interval_s > 0 ? std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s))
                                  : Clock::duration(0);
  last_write_ = Clock::now();
}

void ChunkedStream::on_gone(std::function<void()> fn) {
  std::lock_guard lk(mu_);
  gone_ = std::move(fn);
}

void ChunkedStream::on_closed(std::function<void()> fn) {
  std::lock_guard lk(mu_);
  closed_ = std::move(fn);
}

}  // namespace dsv4
