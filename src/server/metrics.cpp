#include "server/metrics.h"

#include <fmt/format.h>

namespace dsv4 {

namespace {

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  fmt::format_to(std::back_inserter(out), "# HELP dsv4_{} {}\n# TYPE dsv4_{} {}\ndsv4_{} {}\n", name, help, name,
                 type, name, value);
}

}  // namespace

Metrics::Metrics() { samples_.emplace_back(Clock::now(), 0); }

std::string Metrics::render(const std::optional<EngineLoop::Stats>& stats, const StateLayout& layout,
                            const ServerCounters& sc) {
  std::lock_guard lk(mu_);
  // While parked the counters stay at their last values; an unpark starts a new loop whose counters start from 0
  // (a counter reset, as after a restart).
  EngineLoop::Stats s = stats ? *stats : EngineLoop::Stats{};
  if (stats) last_ = s;
  const EngineLoop::Stats& c = stats ? s : last_;
  const auto now = Clock::now();
  while (samples_.size() > 1 && now - samples_[1].first >= std::chrono::seconds(10)) samples_.pop_front();
  const double dt = std::chrono::duration<double>(now - samples_.front().first).count();
  const int64_t dg = c.generated_tokens - samples_.front().second;
  const double rate = dt > 0 && dg >= 0 ? double(dg) / dt : 0.0;
  samples_.emplace_back(now, c.generated_tokens);

  std::string o;
  metric(o, "model_loaded", "gauge", "1 while the model is loaded, 0 while parked", sc.loaded ? 1 : 0);
  metric(o, "requests_running", "gauge", "Sequences in the running batch", double(s.running));
  metric(o, "requests_waiting", "gauge", "Sequences waiting for a slot or state memory", double(s.waiting));
  metric(o, "requests_in_flight", "gauge", "Sequences admitted by the server (running, waiting or being answered)",
         double(sc.in_flight));
  metric(o, "requests_capacity", "gauge", "Sequences the server admits at once (parallel + queue)",
         double(sc.capacity));
  metric(o, "http_generation_requests_total", "counter", "Generation requests received", double(sc.http_requests));
  metric(o, "requests_rejected_total", "counter", "Requests refused because the queue was full",
         double(sc.rejected));
  metric(o, "requests_submitted_total", "counter", "Sequences submitted to the engine loop",
         double(c.requests_submitted));
  metric(o, "requests_finished_total", "counter", "Sequences that ended", double(c.requests_finished));
  metric(o, "prompt_tokens_total", "counter", "Prompt tokens of finished sequences", double(c.prompt_tokens));
  metric(o, "generated_tokens_total", "counter", "Tokens generated", double(c.generated_tokens));
  metric(o, "generated_tokens_per_second", "gauge", "Generation rate over the last 10 s of scrapes", rate);
  metric(o, "step_tokens_total", "counter", "Tokens computed by forward steps (prefill + decode)",
         double(c.step_tokens));
  metric(o, "spec_drafted_tokens_total", "counter", "Speculative decoding: MTP draft tokens verified",
         double(c.drafted_tokens));
  metric(o, "spec_accepted_tokens_total", "counter", "Speculative decoding: draft tokens accepted",
         double(c.accepted_tokens));
  metric(o, "spec_acceptance_rate", "gauge", "Accepted / drafted tokens since the start (0 without drafts)",
         c.drafted_tokens > 0 ? double(c.accepted_tokens) / double(c.drafted_tokens) : 0.0);
  metric(o, "preemptions_total", "counter", "Sequences preempted for state memory", double(c.preemptions));
  metric(o, "prefix_cache_hits_total", "counter", "Finished sequences that reused cached prompt blocks",
         double(c.cache_hits));
  metric(o, "prefix_cache_hit_tokens_total", "counter", "Prompt tokens supplied by the prefix cache",
         double(c.cached_tokens));
  metric(o, "prefix_cache_blocks", "gauge", "128-token blocks held by the prefix cache", double(s.cache.cached_blocks));
  metric(o, "prefix_cache_bytes", "gauge", "Bytes of state held by cached blocks and their snapshots",
         double(uint64_t(s.cache.cached_blocks) * layout.page_bytes +
                uint64_t(s.cache.snapshots_attached) * layout.snapshot_bytes));
  metric(o, "prefix_cache_evicted_pages_total", "counter", "Cached pages evicted (LRU)", double(c.cache.evicted_pages));
  metric(o, "state_slots_total", "gauge", "Sequence slots of the state pool", double(s.pool_slots));
  metric(o, "state_slots_used", "gauge", "Sequence slots in use", double(s.running));
  metric(o, "state_pages_total", "gauge", "128-token pages of the state pool", double(s.pool_pages));
  metric(o, "state_pages_used", "gauge", "Pages referenced by running sequences", double(s.cache.pages_referenced));
  metric(o, "state_pages_cached", "gauge", "Pages held only by the prefix cache (evictable)",
         double(s.cache.pages_idle));
  metric(o, "state_snapshots_total", "gauge", "Boundary snapshots of the state pool", double(s.pool_snapshots));
  metric(o, "state_snapshots_used", "gauge", "Snapshots attached to cached blocks", double(s.cache.snapshots_attached));
  metric(o, "state_bytes", "gauge", "Bytes of device memory of the state pool", double(s.pool_bytes));

  o += "# HELP dsv4_step_seconds Time of one forward step (batched forward and sampling)\n";
  o += "# TYPE dsv4_step_seconds histogram\n";
  int64_t cum = 0;
  for (size_t b = 0; b < EngineLoop::kStepBuckets.size(); ++b) {
    cum += c.step_buckets[b];
    fmt::format_to(std::back_inserter(o), "dsv4_step_seconds_bucket{{le=\"{}\"}} {}\n", EngineLoop::kStepBuckets[b],
                   cum);
  }
  cum += c.step_buckets.back();
  fmt::format_to(std::back_inserter(o), "dsv4_step_seconds_bucket{{le=\"+Inf\"}} {}\n", cum);
  fmt::format_to(std::back_inserter(o), "dsv4_step_seconds_sum {}\ndsv4_step_seconds_count {}\n", c.forward_seconds,
                 c.steps);
  return o;
}

}  // namespace dsv4
