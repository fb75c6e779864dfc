#include "sampling/stop_matcher.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_)
    if (s.empty()) fail("stop strings must not be empty");
}

StopMatcher::Result StopMatcher::push(std::string_view text) {
  Result r;
  if (stopped_) return r;
  pending_.append(text);
  // Earliest occurrence of any stop string (the longest one if several start there).
  size_t best = std::string::npos;
  const std::string* hit = nullptr;
  for (const auto& s : stops_) {
    size_t p = pending_.find(s);
    if (p != std::string::npos && (p < best || (p == best && s.size() > hit->size()))) {
      best = p;
      hit = &s;
    }
  }
  if (hit) {
    r.text = pending_.substr(0, best);
    r.stopped = stopped_ = true;
    r.matched = *hit;
    pending_.clear();
    return r;
  }
  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  }
  r.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return r;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? std::string() : out;
}

}  // namespace dsv4
