#include "server/openai_format.h"

namespace dsv4 {

namespace {

ojson bytes_json(const std::string& b) {
  ojson a = ojson::array();
  for (char c : b) a.push_back(static_cast<int>(static_cast<uint8_t>(c)));
  return a;
}

const std::string& token_text(const Tokenizer& tok, int32_t id) {
  static const std::string kNone;
  return id >= 0 && id < tok.n_vocab() ? tok.token_bytes(id) : kNone;
}

ojson entry_json(const TokenLogprobs& lp, const Tokenizer& tok) {
  ojson top = ojson::array();
  for (const auto& t : lp.top) {
    const std::string& b = token_text(tok, t.id);
    top.push_back({{"token", b}, {"logprob", t.logprob}, {"bytes", bytes_json(b)}});
  }
  const std::string& b = token_text(tok, lp.id);
  return {{"token", b}, {"logprob", lp.logprob}, {"bytes", bytes_json(b)}, {"top_logprobs", std::move(top)}};
}

}  // namespace

ojson usage_json(const GenerationResult& r, int64_t reasoning_tokens) {
  const auto& t = r.timings;
  const int64_t completion = static_cast<int64_t>(r.ids.size());
  return {{"prompt_tokens", t.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", t.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", t.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
          {"prompt_cache_hit_tokens", t.cached_tokens},
          {"prompt_cache_miss_tokens", t.prompt_tokens - t.cached_tokens}};
}

ojson timings_json(const GenerationTimings& t, int64_t predicted_n) {
  return {{"prompt_n", t.prefill_tokens},
          {"cache_n", t.cached_tokens},
          {"prompt_ms", t.prefill_ms},
          {"prompt_per_second", t.prefill_tokens_per_s()},
          {"predicted_n", predicted_n},
          {"predicted_ms", t.decode_ms},
          {"predicted_per_second", t.decode_ms > 0 ? double(predicted_n) * 1e3 / t.decode_ms : 0.0},
          {"draft_n", t.drafted_tokens},             // speculative decoding (--spec-draft): drafts verified
          {"draft_n_accepted", t.accepted_tokens}};  // ... and accepted (llama.cpp's names)
}

ojson tool_call_delta_json(const ToolCallDelta& d) {
  return {{"index", d.index},
          {"id", d.id},
          {"type", "function"},
          {"function", {{"name", d.name}, {"arguments", d.arguments}}}};
}

ojson chat_message_json(const GenerationOutput& out) {
  const auto& p = out.parser();
  ojson msg = {{"role", "assistant"}};
  const auto& calls = p.tool_calls();
  const std::string content = p.content();
  msg["content"] = content.empty() && !calls.empty() ? ojson(nullptr) : ojson(content);
  if (out.thinking()) msg["reasoning_content"] = p.reasoning();
  if (!calls.empty()) {
    ojson tc = ojson::array();
    for (const auto& c : calls)
      tc.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    msg["tool_calls"] = std::move(tc);
  }
  msg["refusal"] = nullptr;
  return msg;
}

const char* openai_finish_reason(const GenerationOutput& out, FinishReason f) {
  if (f == FinishReason::length) return "length";
  if (out.has_tool_calls()) return "tool_calls";
  return "stop";
}

ojson chat_logprobs_json(const std::vector<TokenLogprobs>& answer, const std::vector<TokenLogprobs>& reasoning,
                         const Tokenizer& tok) {
  ojson content = ojson::array();
  for (const auto& lp : answer) content.push_back(entry_json(lp, tok));
  ojson j = {{"content", std::move(content)}, {"refusal", nullptr}};
  if (!reasoning.empty()) {
    ojson r = ojson::array();
    for (const auto& lp : reasoning) r.push_back(entry_json(lp, tok));
    j["reasoning_content"] = std::move(r);
  }
  return j;
}

int64_t TextOffsets::next(int32_t id) {
  const int64_t at = chars_;
  for (const char c : decoder_.push(id))  // valid UTF-8: one character per byte that is not a continuation byte
    chars_ += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return at;
}

ojson completion_logprobs_json(const std::vector<TokenLogprobs>& tokens, const Tokenizer& tok, TextOffsets& offsets) {
  ojson toks = ojson::array(), lps = ojson::array(), tops = ojson::array(), offs = ojson::array();
  for (const auto& lp : tokens) {
    const std::string& b = token_text(tok, lp.id);
    toks.push_back(b);
    lps.push_back(lp.logprob);
    ojson top = ojson::object();
    for (const auto& t : lp.top) top[token_text(tok, t.id)] = t.logprob;
    tops.push_back(std::move(top));
    offs.push_back(offsets.next(lp.id));
  }
  return {{"tokens", std::move(toks)},
          {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offs)}};
}

}  // namespace dsv4
