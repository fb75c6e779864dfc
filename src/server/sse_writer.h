// Server-sent events over a detached chunked response (server/chunked_stream.h): a thread-safe writer whose ok()
// turns false once the client is gone (closed, too slow, server stopping), and the `: keepalive` comment that the
// transport writes while nothing else is written (queue wait, long prefill). OpenAI frames are `data: {json}`;
// Anthropic frames add `event: <type>`. Each frame is one chunk of the response.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/chunked_stream.h"

namespace dsv4 {

class SseWriter {
 public:
  explicit SseWriter(std::shared_ptr<ChunkedStream> out) : out_(std::move(out)) {}
  bool send_raw(const std::string& s) { return out_->write(s); }
  bool data(const nlohmann::ordered_json& j);                            // data: {json}
  bool event(const std::string& type, const nlohmann::ordered_json& j);  // event: type + data: {json}
  bool ok() const { return out_->ok(); }
  // `: keepalive` comments whenever nothing was written for interval_s.
  void keepalive(double interval_s) { out_->set_idle_chunk(": keepalive\n\n", interval_s); }
  ChunkedStream& out() { return *out_; }

 private:
  std::shared_ptr<ChunkedStream> out_;
};

}  // namespace dsv4
