// One request's text layer on the engine loop (loop_generation.h).
#include "engine/loop_generation.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "engine/text_output.h"

namespace dsv4 {

namespace {
using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

EngineRequest engine_request(const GenerationRequest& req) {
  EngineRequest er;
  er.prompt = req.prompt;
  er.sampling = req.sampling;
  er.max_tokens = req.max_tokens;
  er.ignore_eos = req.ignore_eos;
  er.constraint = req.constraint;
  er.top_logprobs = req.top_logprobs;
  return er;
}

// The finish reason and timings once the loop's stream has ended; `ours`: we ended it (stop string, cancel).
void end_result(GenerationResult& res, const RequestStream::Result& r, const std::optional<FinishReason>& ours,
                Clock::time_point t0, const std::optional<Clock::time_point>& t_first, Clock::time_point t_end) {
  auto& tm = res.timings;
  if (ours) {
    res.finish = *ours;
  } else {
    switch (r.end) {
      case StreamEnd::stop: res.finish = FinishReason::stop; break;
      case StreamEnd::length: res.finish = FinishReason::length; break;
      case StreamEnd::cancelled: res.finish = FinishReason::cancelled; break;
      case StreamEnd::error: fail("{}", r.error);
      case StreamEnd::running: fail("internal: the request's stream ended while running");
    }
  }
  tm.cached_tokens = r.cached_tokens;
  tm.drafted_tokens = r.drafted_tokens;
  tm.accepted_tokens = r.accepted_tokens;
  tm.prefill_tokens = tm.prompt_tokens - tm.cached_tokens;
  // The loop's own times of the first token and the end: a consumer that takes the tokens in bulk (per_token false)
  // or late (a streamed response's pump thread) sees them after the loop made them.
  const bool produced = r.first_token_at != Clock::time_point{};
  const Clock::time_point first = produced ? r.first_token_at : t_first.value_or(t_end);
  const Clock::time_point end = r.ended_at != Clock::time_point{} ? std::max(r.ended_at, first) : t_end;
  tm.prefill_ms = ms_between(t0, first);
  tm.decode_tokens = res.ids.empty() ? 0 : static_cast<int64_t>(res.ids.size()) - 1;
  tm.decode_ms = (produced || t_first) ? ms_between(first, end) : 0.0;
}
}  // namespace

GenerationResult generate_on_loop(EngineLoop& loop, const GenerationRequest& req, const Tokenizer* tok,
                                  const GenerationCallbacks& cb, std::chrono::milliseconds poll, bool per_token) {
  TextOutput text(tok, req.stop);
  auto cancelled = [&] { return cb.should_cancel && cb.should_cancel(); };

  const auto t0 = Clock::now();
  auto stream = loop.submit(engine_request(req));

  GenerationResult res;
  auto& tm = res.timings;
  tm.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  std::optional<FinishReason> ours;  // we ended it: a stop string, on_token said no, or should_cancel
  std::optional<Clock::time_point> t_first;
  std::vector<TokenLogprobs> lps;
  size_t have = 0;
  while (!ours) {
    if (cancelled()) {
      ours = FinishReason::cancelled;
      break;
    }
    const bool coalesce = !per_token && req.stop.empty();
    const bool fin = coalesce ? stream->wait_end_for(poll) : stream->finished();  // then every token is in already
    lps.clear();
    std::vector<int32_t> toks =
        stream->next_for(have, fin ? std::chrono::milliseconds(0) : poll, req.top_logprobs >= 0 ? &lps : nullptr);
    if (toks.empty()) {
      if (fin) break;
      continue;
    }
    if (!t_first) t_first = Clock::now();
    for (size_t i = 0; i < toks.size() && !ours; ++i) {
      const int32_t id = toks[i];
      ++have;
      ours = text.push(id, i < lps.size() ? &lps[i] : nullptr, res, cb);
    }
  }
  if (ours) loop.cancel(stream->id());
  const RequestStream::Result r = stream->wait();
  end_result(res, r, ours, t0, t_first, Clock::now());
  text.finish(res, cb);
  return res;
}

LoopGeneration::LoopGeneration(EngineLoop& loop, const GenerationRequest& req, const Tokenizer* tok,
                               GenerationCallbacks cb, std::function<void()> wake)
    : loop_(loop), req_(req), cb_(std::move(cb)), text_(std::make_unique<TextOutput>(tok, req.stop)) {
  t0_ = Clock::now();
  stream_ = loop.submit(engine_request(req_));
  stream_->set_listener(std::move(wake));
  res_.timings.prompt_tokens = static_cast<int64_t>(req_.prompt.size());
}

LoopGeneration::~LoopGeneration() {
  if (!stream_) return;
  stream_->set_listener(nullptr);
  if (!result_ && !stream_->finished()) loop_.cancel(stream_->id());
}

bool LoopGeneration::advance() {
  if (result_) return true;
  while (!ours_) {
    if (cb_.should_cancel && cb_.should_cancel()) {
      ours_ = FinishReason::cancelled;
      break;
    }
    const bool fin = stream_->finished();  // then every token is in already
    std::vector<TokenLogprobs> lps;
    std::vector<int32_t> toks =
        stream_->next_for(have_, std::chrono::milliseconds(0), req_.top_logprobs >= 0 ? &lps : nullptr);
    if (toks.empty()) {
      if (fin) break;
      return false;  // the listener calls again
    }
    if (!t_first_) t_first_ = Clock::now();
    for (size_t i = 0; i < toks.size() && !ours_; ++i) {
      ++have_;
      ours_ = text_->push(toks[i], i < lps.size() ? &lps[i] : nullptr, res_, cb_);
    }
  }
  if (ours_ && !cancel_sent_) {
    cancel_sent_ = true;
    loop_.cancel(stream_->id());
  }
  if (!stream_->finished()) return false;  // ours: cancelled in the loop, the end follows
  const RequestStream::Result r = stream_->wait();
  end_result(res_, r, ours_, t0_, t_first_, Clock::now());
  text_->finish(res_, cb_);
  result_ = std::move(res_);
  return true;
}

}  // namespace dsv4
