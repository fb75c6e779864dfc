// Engine::generate with speculative decoding (engine.h, engine/spec_decode.h): one sequence in a private state
// pool with the drafter's layers; prefill in chunks of the engine's grid, then rounds of draft (MTP or DSpark, up to
// k tokens), verify (one step of 1 + k tokens, logits of all) and rollback of the rejected positions. Per emitted
// token the same bookkeeping as the plain path: log-probabilities of the raw logits, EOS, stop strings, callbacks,
// limits.
#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/spec_decode.h"
#include "engine/text_output.h"
#include "model/model.h"
#include "sampling/logprobs.h"
#include "sampling/sampler.h"

namespace dsv4 {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
}  // namespace

GenerationResult Engine::generate_spec(const GenerationRequest& req, TextOutput& text,
                                       const GenerationCallbacks& cb) {
  const Model& m = *spec_model_;
  const auto& prompt = req.prompt;
  const int32_t n_vocab = m.n_vocab();
  seq_.reset();  // the plain path's cached sequence is not kept in step with this one
  Sampler sampler(req.sampling, n_vocab);
  sampler.set_prompt(prompt);
  auto cancelled = [&] { return cb.should_cancel && cb.should_cancel(); };

  GenerationResult res;
  auto& tm = res.timings;
  const int64_t n_prompt = int64_t(prompt.size());
  tm.prompt_tokens = n_prompt;
  tm.prefill_tokens = n_prompt;
  StatePool pool = m.make_pool({1, 1, 0, true});
  std::vector<int32_t> pages{0};
  auto ensure = [&](int64_t n_positions) {
    const int64_t need = StateLayout::pages_for(n_positions);
    if (need > pool.n_pages()) pool.grow_pages(std::max(need, 2 * pool.n_pages()));
    while (int64_t(pages.size()) < pool.n_pages()) pages.push_back(int32_t(pages.size()));
  };
  std::vector<float> logits;
  auto step = [&](BatchSeq bs, std::vector<std::vector<float>>* rows, std::vector<char>* finite) {
    ensure(bs.p0 + bs.n());
    bs.pages = pages;
    Batch b;
    b.seqs.push_back(std::move(bs));
    m.forward(b, pool, [&](size_t, int64_t p, std::span<const float> lg, bool ok) {
      if (rows) {
        const size_t j = size_t(p - b.seqs[0].p0);
        (*rows)[j].assign(lg.begin(), lg.end());
        (*finite)[j] = ok;
        return;
      }
      if (!ok) fail("non-finite logits at position {}", p);
      logits.assign(lg.begin(), lg.end());
    });
  };

  auto t0 = Clock::now();
  for (int64_t pos = 0; pos < n_prompt;) {
    if (cancelled()) {
      res.finish = FinishReason::cancelled;
      tm.prefill_ms = ms_since(t0);
      return res;
    }
    const int64_t end = std::min(n_prompt, (pos / prefill_chunk_ + 1) * prefill_chunk_);
    BatchSeq bs;
    bs.p0 = pos;
    bs.tokens = std::span<const int32_t>(prompt.data() + pos, size_t(end - pos));
    bs.logits = end == n_prompt ? BatchSeq::Logits::last : BatchSeq::Logits::none;
    bs.next_token = end < n_prompt ? prompt[size_t(end)] : -1;
    step(std::move(bs), nullptr, nullptr);
    pos = end;
  }
  tm.prefill_ms = ms_since(t0);

  t0 = Clock::now();
  const int64_t max_tokens = req.max_tokens < 0 ? n_ctx_ : req.max_tokens;
  res.finish = FinishReason::length;
  // One generated token through the plain path's bookkeeping (lp: its log-probabilities when asked; told: the
  // verify told the constraint already, an accepted draft); false: generation is over (res.finish set).
  auto emit = [&](int32_t id, const TokenLogprobs* lp, bool told) -> bool {
    sampler.accept(id);
    if (req.constraint && !told) req.constraint->accept(id);
    if (id == m.eos_id() && !req.ignore_eos) {
      res.finish = FinishReason::stop;
      return false;
    }
    if (const auto end = text.push(id, lp, res, cb)) {
      res.finish = *end;
      return false;
    }
    if (int64_t(res.ids.size()) >= max_tokens) return false;
    return n_prompt + int64_t(res.ids.size()) < n_ctx_;  // context full: length
  };

  std::vector<float> raw;
  if (req.top_logprobs >= 0) raw = logits;
  if (req.constraint) req.constraint->apply(logits);
  int32_t x = sampler.sample(logits);  // the first token: from the prefill's logits, as without speculation
  bool go = true;
  if (cancelled()) {
    res.finish = FinishReason::cancelled;
    go = false;
  } else {
    std::optional<TokenLogprobs> lp;
    if (req.top_logprobs >= 0) lp = token_logprobs(raw, x, req.top_logprobs);
    go = emit(x, lp ? &*lp : nullptr, false);
  }
  int64_t P = n_prompt;  // positions computed; x is at P
  while (go) {
    if (cancelled()) {
      res.finish = FinishReason::cancelled;
      break;
    }
    // drafts: a round emits up to k + 1 tokens; none past max_tokens or the context
    int64_t k = spec_k_;
    k = std::min<int64_t>(k, max_tokens - int64_t(res.ids.size()) - 1);
    k = std::min<int64_t>(k, n_ctx_ - (P + 1) - 1);
    k = std::max<int64_t>(k, 0);
    DraftTokens dt;
    if (req.constraint && k > 0) dt.constraint = req.constraint->clone();  // drafts follow the constraint too
    const DraftSeq ds{0, P - 1, x, int(k)};
    m.draft(std::span<const DraftSeq>(&ds, 1), pool, [&](size_t, int, std::span<const float> lg, bool ok) -> int32_t {
      if (!ok) return -1;
      int32_t t;
      try {
        t = next_draft(sampler, lg, dt);
      } catch (const Error&) {  // the constraint's copy refused it: no more drafts
        return -1;
      }
      return t == m.eos_id() && !req.ignore_eos ? -1 : t;
    });
    finish_drafts(sampler, dt);
    // verify
    std::vector<int32_t> toks{x};
    toks.insert(toks.end(), dt.tokens.begin(), dt.tokens.end());
    const int64_t n = int64_t(toks.size());
    std::vector<std::vector<float>> rows(static_cast<size_t>(n));
    std::vector<char> finite(size_t(n), 0);
    BatchSeq bs;
    bs.p0 = P;
    bs.tokens = toks;
    bs.logits = BatchSeq::Logits::all;
    bs.spec = true;
    step(std::move(bs), &rows, &finite);
    const VerifyOutcome v = verify_drafts(sampler, std::span<const int32_t>(dt.tokens), dt.q, rows, finite,
                                          {req.constraint.get(), req.top_logprobs});
    if (v.bad) fail("non-finite logits at position {}", P);
    const int64_t keep = int64_t(v.accepted.size()) + 1;
    if (keep < n) {
      const SpecRollback rb{0, P, n, keep};
      m.rollback(std::span<const SpecRollback>(&rb, 1), pool);
    }
    tm.decode_tokens += keep;  // positions the step decoded for good (a plain step decodes one)
    tm.drafted_tokens += n - 1;
    tm.accepted_tokens += keep - 1;
    P += keep;
    for (int64_t j = 0; j < keep && go; ++j) {
      const int32_t t = j + 1 < keep ? v.accepted[size_t(j)] : v.emit;
      go = emit(t, j < int64_t(v.logprobs.size()) ? &v.logprobs[size_t(j)] : nullptr, j + 1 < keep);
      x = t;
    }
  }
  text.finish(res, cb);
  tm.decode_ms = ms_since(t0);
  log::debug("decode: {} tokens, {:.1f} ms; {} of {} drafts accepted, finish {}", res.ids.size(), tm.decode_ms,
             tm.accepted_tokens, tm.drafted_tokens, to_string(res.finish));
  return res;
}

}  // namespace dsv4
