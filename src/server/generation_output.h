// What one generation produced, as the API formats need it: the parsed chat message (reasoning / content / tool
// calls, chat/output_parser.h) or the completion text, the reasoning token count, and the per-token
// log-probabilities split by section. Fed from the engine callbacks; shared by the OpenAI and Anthropic responders.
//
// Sections: a token belongs to the reasoning when the parser was still inside the reasoning before the text that
// completes it came (the token that closes the reasoning is therefore the last reasoning token for log-probabilities,
// but is not counted in reasoning_tokens(), which counts the tokens generated while the reasoning stayed open: with a
// budget B it is at most B). Every other token — content and DSML tool-call markup — is an answer token.
// Log-probabilities wait in pending lists until a response chunk takes them (take_*), so that a streamed chunk carries
// the entries of the tokens whose text it holds, or of earlier tokens whose text was held back; the whole lists stay
// available for a non-streamed response.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/output_parser.h"
#include "engine/generation.h"

namespace dsv4 {

class GenerationOutput {
 public:
  // chat: parse as a chat message (else plain completion text); thinking: the output starts in the reasoning.
  GenerationOutput(bool chat, bool thinking, std::string tool_id_prefix = "");

  // The log-probabilities of a token whose text is complete with the next push() (GenerationCallbacks::on_logprobs:
  // several may come before one push); they go to the section the parser is in before that push's text.
  void push_logprobs(const TokenLogprobs& lp);
  // Text of one token (id >= 0) or the final held-back text (id -1). Returns the deltas it completes.
  ChatDelta push(int32_t id, std::string_view text);
  // truncated: the generation hit its token limit (OutputParser::finish).
  ChatDelta finish(bool truncated = false);

  bool chat() const { return chat_; }
  bool thinking() const { return thinking_; }
  const OutputParser& parser() const { return parser_; }
  const std::string& text() const { return text_; }  // completion text (not chat)
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  bool has_tool_calls() const { return chat_ && !parser_.tool_calls().empty(); }

  const std::vector<TokenLogprobs>& reasoning_logprobs() const { return reasoning_lp_; }
  const std::vector<TokenLogprobs>& answer_logprobs() const { return answer_lp_; }
  // Entries not yet taken by a chunk.
  std::vector<TokenLogprobs> take_reasoning_logprobs();
  std::vector<TokenLogprobs> take_answer_logprobs();
  bool has_pending_logprobs() const {
    return reasoning_taken_ < reasoning_lp_.size() || answer_taken_ < answer_lp_.size();
  }

 private:
  bool chat_, thinking_;
  OutputParser parser_;
  std::string text_;
  int64_t reasoning_tokens_ = 0;
  std::vector<TokenLogprobs> next_lp_;  // for the next push()
  std::vector<TokenLogprobs> reasoning_lp_, answer_lp_;
  size_t reasoning_taken_ = 0, answer_taken_ = 0;
};

}  // namespace dsv4
