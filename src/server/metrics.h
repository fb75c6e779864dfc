// GET /metrics: the server's and the engine loop's counters in the Prometheus text exposition format (version 0.0.4),
// every name prefixed dsv4_. Counters end in _total; dsv4_step_seconds is a histogram of forward-step times;
// dsv4_generated_tokens_per_second is the generation rate between this scrape and the oldest of the scrapes of
// the last 10 s (since the server started on the first scrape).
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "engine/engine_loop.h"
#include "model/state_layout.h"

namespace dsv4 {

struct ServerCounters {
  int64_t in_flight = 0;          // admitted sequences (running, waiting in the loop, or being answered)
  int64_t capacity = 0;           // max admitted (parallel + queue)
  int64_t rejected = 0;           // requests answered 503 queue_full
  int64_t http_requests = 0;      // generation requests received
  bool loaded = true;             // false while parked
};

class Metrics {
 public:
  Metrics();
  // stats: nullopt while parked (the engine gauges are then 0; the counters keep their last values).
  std::string render(const std::optional<EngineLoop::Stats>& stats, const StateLayout& layout,
                     const ServerCounters& server);

 private:
  using Clock = std::chrono::steady_clock;
  std::mutex mu_;
  std::deque<std::pair<Clock::time_point, int64_t>> samples_;  // (scrape time, generated tokens)
  EngineLoop::Stats last_;                                     // counters of the last loaded scrape
};

}  // namespace dsv4
