// TextOutput: the text side of one generation, shared by Engine (engine.h, engine_spec.cpp) and generate_on_loop
// (loop_generation.h): each generated id is appended to the result, detokenized (StreamDecoder) with the stop strings
// cut (StopMatcher), and handed to GenerationCallbacks::on_token with the text it completes.
#pragma once
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
  // tok may be null (ids only); then `stop` must be empty (throws dsv4::Error).
  TextOutput(const Tokenizer* tok, const std::vector<std::string>& stop);
  // Appends `id` to res.ids (and its text to res.text), then calls cb.on_token. Returns FinishReason::stop when a stop
  // string completed (res.stop_matched set), FinishReason::cancelled when on_token returned false, else nothing.
  std::optional<FinishReason> push(int32_t id, GenerationResult& res, const GenerationCallbacks& cb);
  // After the last token: releases the text held back (a partial stop-string prefix, incomplete UTF-8) unless a stop
  // string ended the output or it was cancelled (res.finish).
  void finish(GenerationResult& res, const GenerationCallbacks& cb);

 private:
  StopMatcher stops_;
  std::optional<StreamDecoder> decoder_;
};

}  // namespace dsv4
