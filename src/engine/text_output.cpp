// The text side of one generation (text_output.h).
#include "engine/text_output.h"

#include "core/error.h"

namespace dsv4 {

namespace {
const std::vector<std::string>& need_tokenizer(const Tokenizer* tok, const std::vector<std::string>& stop) {
  if (!stop.empty() && !tok) fail("stop strings need a tokenizer");
  return stop;
}

// Bytes of the UTF-8 character that starts with `lead` (valid UTF-8).
int64_t char_bytes(char lead) {
  const auto c = static_cast<uint8_t>(lead);
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}
}  // namespace

TextOutput::TextOutput(const Tokenizer* tok, const std::vector<std::string>& stop)
    : stops_(need_tokenizer(tok, stop)) {
  if (tok) decoder_.emplace(*tok);
}

void TextOutput::hand_over(int64_t emitted, const GenerationCallbacks& cb) {
  while (!waiting_.empty() && waiting_.front().end >= 0 && waiting_.front().end <= emitted) {
    cb.on_logprobs(waiting_.front().lp);
    waiting_.pop_front();
  }
}

std::optional<FinishReason> TextOutput::push(int32_t id, const TokenLogprobs* lp, GenerationResult& res,
                                             const GenerationCallbacks& cb) {
  res.ids.push_back(id);
  if (!cb.on_logprobs) lp = nullptr;
  std::string piece;
  bool stopped = false;
  if (decoder_) {
    const bool was_incomplete = decoder_->pending_bytes() > 0;
    std::string decoded = decoder_->push(id);
    // The first character decoded completes the one that the waiting tokens with an unknown end hold bytes of.
    if (was_incomplete && !decoded.empty())
      for (Waiting& w : waiting_)
        if (w.end < 0) w.end = decoded_ + char_bytes(decoded[0]);
    if (lp) waiting_.push_back({*lp, decoder_->pending_bytes() > 0 ? -1 : decoded_ + int64_t(decoded.size())});
    decoded_ += int64_t(decoded.size());
    auto r = stops_.push(decoded);
    piece = std::move(r.text);
    emitted_ += int64_t(piece.size());
    res.text += piece;
    if (r.stopped) {
      stopped = true;
      res.stop_matched = r.matched;
    }
    // At a stop, emitted_ is where the stop string starts: the tokens ending after it had text removed.
    if (cb.on_logprobs) hand_over(emitted_, cb);
    if (stopped) waiting_.clear();
  } else if (lp) {
    cb.on_logprobs(*lp);
  }
  const bool go_on = !cb.on_token || cb.on_token(id, piece);
  if (stopped) return FinishReason::stop;
  if (!go_on) return FinishReason::cancelled;
  return std::nullopt;
}

void TextOutput::finish(GenerationResult& res, const GenerationCallbacks& cb) {
  if (!decoder_ || !res.stop_matched.empty() || res.finish == FinishReason::cancelled) return;
  std::string tail = stops_.push(decoder_->flush()).text + stops_.flush();
  for (const Waiting& w : waiting_) cb.on_logprobs(w.lp);  // the tail settles them all
  waiting_.clear();
  if (tail.empty()) return;
  res.text += tail;
  if (cb.on_token) cb.on_token(-1, tail);
}

}  // namespace dsv4
