// Limits of the HTTP connection layer (server/http_transport.h), part of ServerOptions. Times in seconds.
#pragma once
#include <cstddef>

namespace dsv4 {

struct HttpTransportOptions {
  int workers = 0;               // request threads (0: 32)
  int max_connections = 16384;   // open connections at most (raise the fd limit to match)
  double idle_timeout_s = 5;     // a connection without a request in progress
  double header_timeout_s = 10;  // from the request's first byte to the end of its header
  double body_timeout_s = 60;    // from the end of the header to the end of the body
  double read_timeout_s = 5;     // one read the reactor did not cover (an Expect: 100-continue body)
  double write_timeout_s = 10;   // one write to a client that does not read
  size_t max_header_bytes = 64 << 10;
  size_t max_stream_buffer = 1 << 20;  // bytes of a detached (streamed) response not yet written (beyond: dropped)
  // Every request body is JSON: a Content-Type of application/x-www-form-urlencoded (curl -d's default) is rewritten
  // to application/json before httplib parses the request. httplib would otherwise parse such a body as a query
  // string and refuse one over 8 KiB (CPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH, compiled into Debian's
  // library) with a 413, whatever the server's own limit.
  bool json_bodies = false;
};

}  // namespace dsv4
