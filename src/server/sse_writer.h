// Server-sent events over a cpp-httplib chunked response: a thread-safe writer that remembers a failed write (the
// client went away), and a background keepalive that writes `: keepalive` comment lines while nothing else is
// written (queue wait, long prefill). OpenAI frames are `data: {json}`; Anthropic frames add `event: <type>`.
#pragma once
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

namespace dsv4 {

class SseWriter {
 public:
  explicit SseWriter(httplib::DataSink& sink) : sink_(sink) {}
  bool send_raw(const std::string& s);
  bool data(const nlohmann::ordered_json& j);                            // data: {json}
  bool event(const std::string& type, const nlohmann::ordered_json& j);  // event: type + data: {json}
  bool ok();
  // A keepalive comment if nothing was written for `interval`.
  void keepalive_if_idle(std::chrono::duration<double> interval);

 private:
  httplib::DataSink& sink_;
  std::mutex mu_;
  bool ok_ = true;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// Runs keepalive_if_idle on a background thread for its lifetime.
class Keepalive {
 public:
  Keepalive(SseWriter& w, double interval_s);
  ~Keepalive();
  Keepalive(const Keepalive&) = delete;
  Keepalive& operator=(const Keepalive&) = delete;

 private:
  SseWriter& w_;
  std::chrono::duration<double> interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread th_;
};

}  // namespace dsv4
