// Detects that an HTTP client went away while its whole (non-streamed) request is queued or generating (Linux);
// a streamed response's connection is watched by the transport's reactor instead (server/chunked_stream.h, on_gone).
// cpp-httplib 0.11 does not expose the connection's socket to handlers, so the socket is found once by its
// addresses (local port + remote address/port: the request thread's socket, server/http_transport.h, else a search of
// /proc/self/fd with getsockname/getpeername) and then polled:
// the peer closed when poll reports POLLRDHUP/POLLHUP/POLLERR or a MSG_PEEK read returns 0.
#pragma once
#include <string>

namespace dsv4 {

class ConnectionMonitor {
 public:
  // Finds the connection's socket; if none is found, closed() always returns false.
  ConnectionMonitor(const std::string& remote_addr, int remote_port, int local_port);
  // True once the client has closed (or reset) the connection. Cheap: one poll() per call.
  bool closed();
  bool found() const { return fd_ >= 0; }

 private:
  bool still_same_socket() const;
  int fd_ = -1;
  int remote_port_;
  int local_port_;
  bool closed_ = false;
};

}  // namespace dsv4
