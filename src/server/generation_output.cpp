#include "server/generation_output.h"

namespace dsv4 {

GenerationOutput::GenerationOutput(bool chat, bool thinking, std::string tool_id_prefix)
    : chat_(chat), thinking_(thinking), parser_(chat && thinking, std::move(tool_id_prefix)) {}

void GenerationOutput::push_logprobs(const TokenLogprobs& lp) { next_lp_.push_back(lp); }

ChatDelta GenerationOutput::push(int32_t id, std::string_view text) {
  ChatDelta d;
  const bool was_reasoning = chat_ && parser_.in_reasoning();
  std::vector<TokenLogprobs>& section = was_reasoning ? reasoning_lp_ : answer_lp_;
  section.insert(section.end(), next_lp_.begin(), next_lp_.end());
  next_lp_.clear();
  if (!chat_) {
    d.content = std::string(text);
    text_ += text;
    return d;
  }
  d = parser_.push(text);
  if (id >= 0 && was_reasoning && parser_.in_reasoning()) ++reasoning_tokens_;
  return d;
}

ChatDelta GenerationOutput::finish(bool truncated) {
  if (!next_lp_.empty()) push(-1, "");  // (log-probabilities with no text after them: filed as for text)
  return chat_ ? parser_.finish(truncated) : ChatDelta{};
}

std::vector<TokenLogprobs> GenerationOutput::take_reasoning_logprobs() {
  std::vector<TokenLogprobs> out(reasoning_lp_.begin() + static_cast<std::ptrdiff_t>(reasoning_taken_),
                                 reasoning_lp_.end());
  reasoning_taken_ = reasoning_lp_.size();
  return out;
}

std::vector<TokenLogprobs> GenerationOutput::take_answer_logprobs() {
  std::vector<TokenLogprobs> out(answer_lp_.begin() + static_cast<std::ptrdiff_t>(answer_taken_), answer_lp_.end());
  answer_taken_ = answer_lp_.size();
  return out;
}

}  // namespace dsv4
