#include "server/generation_output.h"

namespace dsv4 {

GenerationOutput::GenerationOutput(bool chat, bool thinking, std::string tool_id_prefix)
    : chat_(chat), thinking_(thinking), parser_(chat && thinking, std::move(tool_id_prefix)) {}

void GenerationOutput::push_logprobs(const TokenLogprobs& lp) {
  lp_ = lp;
  have_lp_ = true;
}

ChatDelta GenerationOutput::push(int32_t id, std::string_view text) {
  ChatDelta d;
  const bool was_reasoning = chat_ && parser_.in_reasoning();
  if (have_lp_) {
    (was_reasoning ? reasoning_lp_ : answer_lp_).push_back(std::move(lp_));
    have_lp_ = false;
  }
  if (!chat_) {
    d.content = std::string(text);
    text_ += text;
    return d;
  }
  d = parser_.push(text);
  if (id >= 0 && was_reasoning && parser_.in_reasoning()) ++reasoning_tokens_;
  return d;
}

ChatDelta GenerationOutput::finish(bool truncated) { return chat_ ? parser_.finish(truncated) : ChatDelta{}; }

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
