// The text side of one generation (text_output.h).
#include "engine/text_output.h"

#include "core/error.h"

namespace dsv4 {

namespace {
const std::vector<std::string>& need_tokenizer(const Tokenizer* tok, const std::vector<std::string>& stop) {
  if (!stop.empty() && !tok) fail("stop strings need a tokenizer");
  return stop;
}
}  // namespace

TextOutput::TextOutput(const Tokenizer* tok, const std::vector<std::string>& stop)
    : stops_(need_tokenizer(tok, stop)) {
  if (tok) decoder_.emplace(*tok);
}

std::optional<FinishReason> TextOutput::push(int32_t id, GenerationResult& res, const GenerationCallbacks& cb) {
  res.ids.push_back(id);
  std::string piece;
  bool stopped = false;
  if (decoder_) {
    auto r = stops_.push(decoder_->push(id));
    piece = std::move(r.text);
    res.text += piece;
    if (r.stopped) {
      stopped = true;
      res.stop_matched = r.matched;
    }
  }
  const bool go_on = !cb.on_token || cb.on_token(id, piece);
  if (stopped) return FinishReason::stop;
  if (!go_on) return FinishReason::cancelled;
  return std::nullopt;
}

void TextOutput::finish(GenerationResult& res, const GenerationCallbacks& cb) {
  if (!decoder_ || !res.stop_matched.empty() || res.finish == FinishReason::cancelled) return;
  std::string tail = stops_.push(decoder_->flush()).text + stops_.flush();
  if (tail.empty()) return;
  res.text += tail;
  if (cb.on_token) cb.on_token(-1, tail);
}

}  // namespace dsv4
