// TextOutput: the text side of one generation, shared by Engine (engine.h, engine_spec.cpp) and generate_on_loop
// (loop_generation.h): each generated id is appended to the result, detokenized (StreamDecoder) with the stop strings
// cut (StopMatcher), and handed to GenerationCallbacks::on_token with the text it completes; its log-probabilities go
// to GenerationCallbacks::on_logprobs once its text is settled.
//
// Log-probabilities and stop strings. A token's text is settled once all of it has been emitted: it is neither an
// incomplete UTF-8 character (a character split over tokens belongs to each token that holds some of its bytes) nor
// held back as a possible start of a stop string. Its log-probabilities are then handed over, right before the
// on_token call whose text completes it (so in token order, possibly several before one on_token). A stop string
// removes its own text and all after it, and the tokens whose text it removed get no log-probabilities: those from
// the token that holds the stop string's first character (its first byte) to the one that completed the match — the
// first of them also when part of its text precedes the stop string and is in the output. This is OpenAI's rule
// (the token containing the start of the stop string is not listed), so the listed tokens are exactly those whose
// whole text is in the output. Without a stop string every token's log-probabilities are handed over, the last ones
// by finish().
#pragma once
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "engine/generation.h"
#include "sampling/stop_matcher.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

class TextOutput {
 public:
  // tok may be null (ids only: log-probabilities are handed over at once); then `stop` must be empty (throws
  // dsv4::Error).
  TextOutput(const Tokenizer* tok, const std::vector<std::string>& stop);
  // Appends `id` to res.ids (and its text to res.text), hands over the log-probabilities that are now settled (lp:
  // this token's, or null when none were asked for), then calls cb.on_token. Returns FinishReason::stop when a stop
  // string completed (res.stop_matched set), FinishReason::cancelled when on_token returned false, else nothing.
  std::optional<FinishReason> push(int32_t id, const TokenLogprobs* lp, GenerationResult& res,
                                   const GenerationCallbacks& cb);
  // After the last token: releases the text held back (a partial stop-string prefix, incomplete UTF-8) and the
  // log-probabilities waiting for it, unless a stop string ended the output or it was cancelled (res.finish).
  void finish(GenerationResult& res, const GenerationCallbacks& cb);

 private:
  // Log-probabilities of a token whose text is not settled yet. end: where its text ends in the decoded text (the
  // end of the character that holds its last byte); -1 while that character is incomplete.
  struct Waiting {
    TokenLogprobs lp;
    int64_t end;
  };
  void hand_over(int64_t emitted, const GenerationCallbacks& cb);  // those with 0 <= end <= emitted

  StopMatcher stops_;
  std::optional<StreamDecoder> decoder_;
  std::deque<Waiting> waiting_;
  int64_t decoded_ = 0;  // bytes of text decoded so far (emitted or held back by stops_)
  int64_t emitted_ = 0;  // bytes of text emitted (handed to on_token)
};

}  // namespace dsv4
