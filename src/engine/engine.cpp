#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "engine/text_output.h"
#include "model/model.h"
#include "sampling/sampler.h"

namespace dsv4 {

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::cancelled:
      return "cancelled";
  }
  return "?";
}

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
}  // namespace

Engine::Engine(std::shared_ptr<const LanguageModel> model, int64_t n_ctx, int64_t prefill_chunk)
    : model_(std::move(model)), n_ctx_(n_ctx), prefill_chunk_(prefill_chunk) {
  if (!model_) fail("engine: no model");
  if (n_ctx_ == 0) n_ctx_ = model_->max_context();
  if (n_ctx_ < 1 || n_ctx_ > model_->max_context())
    fail("context size {} out of range [1, {}] (the model's max_position_embeddings)", n_ctx_, model_->max_context());
  if (prefill_chunk_ < 1) fail("prefill chunk must be positive, got {}", prefill_chunk_);
  if (const auto* m = dynamic_cast<const Model*>(model_.get()); m && m->options().spec_draft > 0 && m->has_drafter()) {
    spec_model_ = m;
    spec_k_ = m->options().spec_draft;
  }
}

void Engine::reset() { seq_.reset(); }

std::vector<int32_t> Engine::cached_tokens() const { return seq_ ? seq_->tokens() : std::vector<int32_t>{}; }

GenerationResult Engine::generate(const GenerationRequest& req, const Tokenizer* tok, const GenerationCallbacks& cb) {
  const auto& prompt = req.prompt;
  const int32_t n_vocab = model_->n_vocab();
  if (prompt.empty()) fail("the prompt is empty");
  for (int32_t t : prompt)
    if (t < 0 || t >= n_vocab) fail("prompt token {} outside the vocabulary [0, {})", t, n_vocab);
  if (static_cast<int64_t>(prompt.size()) >= n_ctx_)
    fail("the prompt has {} tokens: the context size {} leaves no room to generate", prompt.size(), n_ctx_);
  TextOutput text(tok, req.stop);
  if (spec_k_ > 0) return generate_spec(req, text, cb);
  Sampler sampler(req.sampling, n_vocab);
  sampler.set_prompt(prompt);
  auto cancelled = [&] { return cb.should_cancel && cb.should_cancel(); };

  GenerationResult res;
  auto& tm = res.timings;
  tm.prompt_tokens = static_cast<int64_t>(prompt.size());
  std::vector<float> logits(n_vocab);
  std::vector<float> raw;  // the logits before masking and sampling, when log-probabilities are wanted

  // Prefix reuse: longest common prefix with what the sequence holds, keeping >= 1 token to compute.
  if (!seq_) seq_ = model_->new_sequence();
  const auto& held = seq_->tokens();
  int64_t common = std::mismatch(held.begin(), held.end(), prompt.begin(), prompt.end()).first - held.begin();
  common = std::min<int64_t>(common, static_cast<int64_t>(prompt.size()) - 1);
  tm.cached_tokens = common;
  tm.prefill_tokens = tm.prompt_tokens - common;

  auto t0 = Clock::now();
  try {
    if (seq_->n_past() != common) seq_->rewind(common);
    for (int64_t pos = common; pos < tm.prompt_tokens;) {
      if (cancelled()) {
        res.finish = FinishReason::cancelled;
        tm.prefill_ms = ms_since(t0);
        return res;
      }
      int64_t end = std::min(tm.prompt_tokens, (pos / prefill_chunk_ + 1) * prefill_chunk_);
      seq_->append(std::span<const int32_t>(prompt.data() + pos, end - pos), logits);
      pos = end;
    }
  } catch (...) {
    seq_.reset();
    throw;
  }
  tm.prefill_ms = ms_since(t0);
  log::debug("prefill: {} tokens ({} cached) in {:.1f} ms ({:.1f} tok/s)", tm.prefill_tokens, tm.cached_tokens,
             tm.prefill_ms, tm.prefill_tokens_per_s());

  t0 = Clock::now();
  const int64_t max_tokens = req.max_tokens < 0 ? n_ctx_ : req.max_tokens;
  res.finish = FinishReason::length;
  try {
    while (static_cast<int64_t>(res.ids.size()) < max_tokens) {
      if (cancelled()) {
        res.finish = FinishReason::cancelled;
        break;
      }
      if (req.top_logprobs >= 0) raw.assign(logits.begin(), logits.end());
      if (req.constraint) req.constraint->apply(logits);
      int32_t id = sampler.sample(logits);
      sampler.accept(id);
      if (req.constraint) req.constraint->accept(id);
      if (id == model_->eos_id() && !req.ignore_eos) {
        res.finish = FinishReason::stop;
        break;
      }
      std::optional<TokenLogprobs> lp;
      if (req.top_logprobs >= 0 && cb.on_logprobs) lp = token_logprobs(raw, id, req.top_logprobs);
      if (const auto end = text.push(id, lp ? &*lp : nullptr, res, cb)) {
        res.finish = *end;
        break;
      }
      if (static_cast<int64_t>(res.ids.size()) >= max_tokens) break;
      if (tm.prompt_tokens + static_cast<int64_t>(res.ids.size()) >= n_ctx_) break;  // context full: length
      seq_->append(std::span<const int32_t>(&id, 1), logits);
      ++tm.decode_tokens;
    }
  } catch (...) {
    seq_.reset();
    throw;
  }
  text.finish(res, cb);
  tm.decode_ms = ms_since(t0);
  log::debug("decode: {} tokens in {:.1f} ms ({:.2f} tok/s), finish {}", res.ids.size(), tm.decode_ms,
             tm.decode_tokens_per_s(), to_string(res.finish));
  return res;
}

}  // namespace dsv4
