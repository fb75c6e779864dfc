#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>

#include "chat/chat_encoding.h"
#include "server/api_error.h"

namespace dsv4 {

namespace {

using J = OrderedJson;

const J* field(const J& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> number(const J& body, const char* key, double lo, double hi, bool lo_open = false) {
  const J* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_request(key, fmt::format("'{}' must be a number", key));
  double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
    bad_request(key, fmt::format("'{}' must be in {}{}, {}], got {}", key, lo_open ? "(" : "[", lo, hi, v->dump()));
  return x;
}

std::optional<int64_t> integer(const J& body, const char* key) {
  const J* v = field(body, key);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    double x = v->get<double>();
    if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9e15) return static_cast<int64_t>(x);
  }
  bad_request(key, fmt::format("'{}' must be an integer", key));
}

std::optional<bool> boolean(const J& body, const char* key) {
  const J* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_request(key, fmt::format("'{}' must be a boolean", key));
  return v->get<bool>();
}

[[noreturn]] void unsupported(const char* key, const std::string& what) {
  bad_request(key, fmt::format("{} is not supported by this server", what), "unsupported_parameter");
}

J parse_body(std::string_view body) {
  J j;
  try {
    j = J::parse(body);
  } catch (const std::exception& e) {
    throw ApiError(400, fmt::format("invalid JSON in the request body: {}", e.what()), "invalid_request_error", "",
                   "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

// Fields shared by both endpoints: stream, sampling, stop, max_tokens, n.
void parse_common(const J& body, ApiRequest& r, int64_t n_ctx, const char* prompt_param) {
  if (const J* m = field(body, "model"); m && !m->is_string()) bad_request("model", "'model' must be a string");
  r.stream = boolean(body, "stream").value_or(false);
  if (const J* so = field(body, "stream_options")) {
    if (!so->is_object()) bad_request("stream_options", "'stream_options' must be an object");
    r.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  if (auto n = integer(body, "n"); n && *n != 1) unsupported("n", "n > 1 (several choices)");
  if (const J* lb = field(body, "logit_bias"); lb && !(lb->is_object() && lb->empty()))
    unsupported("logit_bias", "logit_bias");

  auto& s = r.gen.sampling;
  s.temperature = static_cast<float>(number(body, "temperature", 0, 2).value_or(1.0));
  s.top_p = static_cast<float>(number(body, "top_p", 0, 1, true).value_or(1.0));
  s.min_p = static_cast<float>(number(body, "min_p", 0, 1).value_or(0.0));
  s.presence_penalty = static_cast<float>(number(body, "presence_penalty", -2, 2).value_or(0.0));
  s.frequency_penalty = static_cast<float>(number(body, "frequency_penalty", -2, 2).value_or(0.0));
  s.repetition_penalty = static_cast<float>(number(body, "repetition_penalty", 0, 10, true).value_or(1.0));
  if (auto k = integer(body, "top_k")) {
    if (*k < -1) bad_request("top_k", fmt::format("'top_k' must be >= -1 (0 or -1: off), got {}", *k));
    s.top_k = static_cast<int32_t>(std::min<int64_t>(*k, 1 << 30));
  }
  if (auto seed = integer(body, "seed")) {
    s.seed = static_cast<uint64_t>(*seed);
  } else {
    s.seed = std::random_device{}();
  }

  if (const J* st = field(body, "stop")) {
    std::vector<std::string> stops;
    if (st->is_string()) {
      stops.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (st->size() > 16) bad_request("stop", "'stop' may hold at most 16 strings");
      for (const auto& x : *st) {
        if (!x.is_string()) bad_request("stop", "'stop' must be a string or an array of strings");
        stops.push_back(x.get<std::string>());
      }
    } else {
      bad_request("stop", "'stop' must be a string or an array of strings");
    }
    for (const auto& x : stops)
      if (x.empty()) bad_request("stop", "stop strings must not be empty");
    r.gen.stop = std::move(stops);
  }

  const int64_t n_prompt = static_cast<int64_t>(r.gen.prompt.size());
  if (n_prompt >= n_ctx)
    bad_request(prompt_param,
                fmt::format("the prompt has {} tokens, the context size is {} (it must leave room for at least one "
                            "generated token)",
                            n_prompt, n_ctx),
                "context_length_exceeded");
  const char* mt_key = field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (auto mt = integer(body, mt_key)) {
    if (*mt < 1) bad_request(mt_key, fmt::format("'{}' must be at least 1, got {}", mt_key, *mt));
    if (n_prompt + *mt > n_ctx)
      bad_request(
          mt_key,
          fmt::format("the prompt ({} tokens) plus {} = {} exceeds the context size {}", n_prompt, mt_key, *mt, n_ctx),
          "context_length_exceeded");
    r.gen.max_tokens = *mt;
  } else {
    r.gen.max_tokens = n_ctx - n_prompt;
  }
}

}  // namespace

ApiRequest parse_chat_completion_request(std::string_view body_text, const Tokenizer& tok, int64_t n_ctx) {
  J body = parse_body(body_text);
  ApiRequest r;
  r.chat = true;
  const J* msgs = field(body, "messages");
  if (!msgs) bad_request("messages", "'messages' is required");
  if (!msgs->is_array()) bad_request("messages", "'messages' must be an array");
  if (msgs->empty()) bad_request("messages", "'messages' must not be empty");
  if (auto lp = boolean(body, "logprobs"); lp && *lp) unsupported("logprobs", "logprobs");
  if (auto tl = integer(body, "top_logprobs"); tl && *tl > 0) unsupported("top_logprobs", "top_logprobs");
  if (const J* rf = field(body, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      bad_request("response_format", "'response_format' must be an object with a string 'type'");
    if ((*rf)["type"] != "text")
      unsupported("response_format",
                  fmt::format("response_format type '{}' (constrained decoding)", (*rf)["type"].get<std::string>()));
  }
  if (const J* tools = field(body, "tools"); tools && !tools->is_array())
    bad_request("tools", "'tools' must be an array");
  if (const J* tc = field(body, "tool_choice")) {
    if (tc->is_string() && (*tc == "none" || *tc == "auto")) {
      if (*tc == "none") body.erase("tools");
    } else {
      unsupported("tool_choice", "tool_choice other than \"auto\" or \"none\"");
    }
  }
  ChatPrompt prompt;
  try {
    prompt = render_chat(body);
    r.gen.prompt = tokenize_prompt(tok, prompt);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    std::string msg = e.what();
    std::string param = "messages";
    if (auto colon = msg.find(':'); colon != std::string::npos && colon < 80 && msg.find(' ') > colon)
      param = msg.substr(0, colon);
    bad_request(param, msg);
  }
  r.thinking = prompt.thinking;
  parse_common(body, r, n_ctx, "messages");
  return r;
}

ApiRequest parse_completion_request(std::string_view body_text, const Tokenizer& tok, int64_t n_ctx, int32_t bos_id) {
  J body = parse_body(body_text);
  ApiRequest r;
  r.chat = false;
  const J* p = field(body, "prompt");
  if (!p) bad_request("prompt", "'prompt' is required");
  // A one-element list of prompts is the same as the prompt itself.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    std::string text = p->get<std::string>();
    if (text.empty()) bad_request("prompt", "'prompt' must not be empty");
    r.gen.prompt = tok.encode(text, true);
    if (r.gen.prompt.empty() || r.gen.prompt.front() != bos_id) r.gen.prompt.insert(r.gen.prompt.begin(), bos_id);
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    for (const auto& x : *p) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok.n_vocab())
        bad_request("prompt", fmt::format("prompt token ids must be integers in [0, {})", tok.n_vocab()));
      r.gen.prompt.push_back(x.get<int32_t>());
    }
  } else if (p->is_array() && p->size() > 1) {
    unsupported("prompt", "more than one prompt per request");
  } else {
    bad_request("prompt", "'prompt' must be a non-empty string or an array of token ids");
  }
  if (auto echo = boolean(body, "echo"); echo && *echo) unsupported("echo", "echo");
  if (auto bo = integer(body, "best_of"); bo && *bo != 1) unsupported("best_of", "best_of > 1");
  if (auto lp = integer(body, "logprobs"); lp && *lp > 0) unsupported("logprobs", "logprobs");
  if (const J* sf = field(body, "suffix"); sf && !(sf->is_string() && sf->get<std::string>().empty()))
    unsupported("suffix", "suffix");
  parse_common(body, r, n_ctx, "prompt");
  return r;
}

}  // namespace dsv4
