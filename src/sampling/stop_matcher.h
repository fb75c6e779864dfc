// Text-level stop strings (OpenAI `stop`): matched on the decoded text, across token boundaries, and never emitted.
// Text that might be the start of a stop string is held back until it is known not to be one.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

class StopMatcher {
 public:
  // Throws dsv4::Error on an empty stop string.
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;      // text safe to emit now (contains no stop string, nor a prefix of one at its end)
    bool stopped = false;  // a stop string was found; `text` ends right before it and the rest is discarded
    std::string matched;   // the stop string found
  };
  // Feed newly decoded text. After a stop, further pushes return nothing.
  Result push(std::string_view text);
  // End of generation without a stop: the held-back text.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::vector<std::string>& stops() const { return stops_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace dsv4
