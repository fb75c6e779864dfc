// The engine loop (engine_loop.h): pool sizing, request intake, one scheduler step per iteration.
#include "engine/engine_loop.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "backend/parallel.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/cache_identity.h"
#include "engine/spec_decode.h"

namespace dsv4 {

const char* to_string(StreamEnd e) {
  switch (e) {
    case StreamEnd::running: return "running";
    case StreamEnd::stop: return "stop";
    case StreamEnd::length: return "length";
    case StreamEnd::cancelled: return "cancelled";
    case StreamEnd::error: return "error";
  }
  return "?";
}

// ---- RequestStream --------------------------------------------------------------------------------------------------

std::vector<int32_t> RequestStream::next(size_t have) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return r_.tokens.size() > have || r_.end != StreamEnd::running; });
  if (r_.tokens.size() <= have) return {};
  return std::vector<int32_t>(r_.tokens.begin() + int64_t(have), r_.tokens.end());
}

RequestStream::Result RequestStream::wait() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return r_.end != StreamEnd::running; });
  return r_;
}

bool RequestStream::wait_end_for(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return r_.end != StreamEnd::running; });
}

bool RequestStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return r_.end != StreamEnd::running;
}

std::vector<int32_t> RequestStream::next_for(size_t have, std::chrono::milliseconds timeout,
                                             std::vector<TokenLogprobs>* logprobs) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return r_.tokens.size() > have || r_.end != StreamEnd::running; });
  if (r_.tokens.size() <= have) return {};
  if (logprobs && r_.logprobs.size() == r_.tokens.size())
    logprobs->insert(logprobs->end(), r_.logprobs.begin() + int64_t(have), r_.logprobs.end());
  return std::vector<int32_t>(r_.tokens.begin() + int64_t(have), r_.tokens.end());
}

void RequestStream::push(int32_t token, TokenLogprobs* lp) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r_.tokens.empty()) r_.first_token_at = std::chrono::steady_clock::now();
    r_.tokens.push_back(token);
    if (lp) r_.logprobs.push_back(std::move(*lp));
    if (listener_) listener_();
  }
  cv_.notify_all();
}

void RequestStream::add_spec(int64_t drafted, int64_t accepted) {
  std::lock_guard<std::mutex> lock(mu_);
  r_.drafted_tokens += drafted;
  r_.accepted_tokens += accepted;
}

void RequestStream::finish(StreamEnd end, std::string error, int64_t prompt_tokens, int64_t cached_tokens,
                           int64_t preemptions) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r_.end != StreamEnd::running) return;
    r_.end = end;
    r_.ended_at = std::chrono::steady_clock::now();
    r_.error = std::move(error);
    r_.prompt_tokens = prompt_tokens;
    r_.cached_tokens = cached_tokens;
    r_.preemptions = preemptions;
    if (listener_) listener_();
  }
  cv_.notify_all();
}

void RequestStream::set_listener(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(fn);
}

// ---- EngineLoop -----------------------------------------------------------------------------------------------------

EngineLoop::EngineLoop(std::shared_ptr<const BatchModel> model, const EngineLoopOptions& o)
    : model_(std::move(model)), opts_(o) {
  if (!model_) fail("engine loop: no model");
  const int64_t max_ctx = model_->max_context();
  if (o.n_ctx < 0) fail("engine loop: n_ctx must be >= 0 (got {})", o.n_ctx);
  n_ctx_ = o.n_ctx == 0 ? max_ctx : std::min(o.n_ctx, max_ctx);
  if (o.max_running < 1) fail("engine loop: max_running must be >= 1 (got {})", o.max_running);
  if (o.spec_draft < 0 || o.spec_draft > StateLayout::kMaxDraftLimit)
    fail("--spec-draft must be in [0, {}] (got {})", StateLayout::kMaxDraftLimit, o.spec_draft);
  const Model* v4 = model_->deepseek_model();
  if (o.spec_draft > 0 && (!v4 || !v4->has_drafter()))
    fail("--spec-draft needs the model's drafter, the MTP module or the DSpark drafter (loaded with "
         "ModelOptions::drafter)");
  if (o.spec_draft > 0 && o.spec_draft > v4->max_draft())
    fail("--spec-draft {}: the model's {} drafts at most {} tokens per step", o.spec_draft,
         v4->drafter() == StateLayout::Drafter::dspark ? "DSpark drafter" : "MTP module", v4->max_draft());
  const StateLayout L = model_->state_layout(o.spec_draft > 0);
  int64_t n_pages = o.n_pages, n_snaps = o.n_snapshots;
  if (n_pages <= 0) {
    const uint64_t slots = uint64_t(o.max_running) * L.slot_bytes;
    if (o.state_bytes <= slots + L.page_bytes)
      fail("state memory of {} bytes cannot hold {} sequence slots of {} bytes and a page of {} bytes", o.state_bytes,
           o.max_running, L.slot_bytes, L.page_bytes);
    uint64_t rest = o.state_bytes - slots;
    if (n_snaps < 0) n_snaps = L.snapshot_bytes ? int64_t(rest / 4 / L.snapshot_bytes) : 0;
    rest -= std::min<uint64_t>(rest, uint64_t(n_snaps) * L.snapshot_bytes);
    // no compressed layers: pages hold no rows; enough ids for every slot's context
    n_pages = L.page_bytes ? int64_t(rest / L.page_bytes)
                           : o.max_running * StateLayout::pages_for(n_ctx_);
    n_pages = std::min<int64_t>(n_pages, (int64_t(1) << 31) / StateLayout::kPageTokens - 1);
    if (n_pages < 1) fail("state memory of {} bytes leaves no page for the compressed rows", o.state_bytes);
  }
  if (n_snaps < 0) n_snaps = 0;
  pool_ = model_->make_state({o.max_running, n_pages, n_snaps, o.spec_draft > 0});
  if (o.spec_draft > 0) {
    if (!pool_->pool()) fail("--spec-draft needs a state pool of the model");
    spec_ = std::make_unique<SpecDecoder>(*v4, *pool_->pool(), o.spec_draft);
  }
  PrefixCache::Options co;
  co.n_pages = n_pages;
  co.n_snapshots = n_snaps;
  // snapshots with the drafter's rows differ from those without: never share blocks across them
  co.salt = model_->state_salt() ^ (o.spec_draft > 0 ? uint64_t(1) << 40 : 0);
  cache_ = std::make_unique<PrefixCache>(co);
  if (!o.cache_dir.empty()) {
    if (StatePool* pool = pool_->pool()) {
      DiskCacheOptions dco;
      dco.dir = o.cache_dir;
      dco.max_bytes = o.cache_size;
      disk_ = std::make_unique<DiskCache>(dco, *pool, co.salt);
      if (disk_->enabled()) cache_->set_tier(disk_.get());
    } else {
      log::warn("disk cache: this model's state has no pool to store; --cache-dir ignored");
    }
  }
  SchedulerOptions so;
  so.max_running = o.max_running;
  so.batch_tokens = o.batch_tokens;
  so.align_chunks = o.align_chunks;
  so.snapshot_interval = o.snapshot_interval;
  sched_ = std::make_unique<Scheduler>(so, *cache_);
  stats_.pool_slots = o.max_running;
  stats_.pool_pages = n_pages;
  stats_.pool_snapshots = n_snaps;
  stats_.pool_bytes = pool_->bytes();
  log::debug("engine loop: {} slots, {} pages of 128 tokens ({} B each), {} snapshots ({} B each), {} tokens per step, "
            "{:.1f} MiB of state",
            o.max_running, n_pages, L.page_bytes, n_snaps, L.snapshot_bytes, o.batch_tokens,
            double(pool_->bytes()) / double(1 << 20));
  if (o.start_thread) thread_ = std::thread([this] { loop(); });
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (disk_ && disk_->enabled()) {
    try {
      cache_->flush_to_tier();
      disk_->drain();
    } catch (const std::exception& e) {
      log::warn("disk cache: writing the cached blocks at shutdown failed: {}", e.what());
    }
  }
  for (auto& [id, lv] : inbox_) lv.stream->finish(StreamEnd::cancelled, {}, int64_t(lv.req.prompt.size()), 0, 0);
  for (auto& [id, lv] : live_) lv.stream->finish(StreamEnd::cancelled, {}, int64_t(lv.req.prompt.size()), 0, 0);
}

std::shared_ptr<RequestStream> EngineLoop::submit(EngineRequest req) {
  const int64_t n = int64_t(req.prompt.size());
  if (n == 0) fail("empty prompt");
  for (int32_t t : req.prompt)
    if (t < 0 || t >= model_->n_vocab()) fail("token id {} outside the vocabulary [0, {})", t, model_->n_vocab());
  if (n >= n_ctx_) fail("the prompt has {} tokens; the context holds {} (prompt + at least one generated token)", n, n_ctx_);
  if (StateLayout::pages_for(n) > pool_->n_pages())
    fail("the prompt needs {} pages of state; the pool has {} (raise the state memory)", StateLayout::pages_for(n),
         pool_->n_pages());
  if (req.max_tokens == 0 || req.max_tokens < -1) fail("max_tokens must be >= 1 or -1 (got {})", req.max_tokens);
  if (req.top_logprobs < -1) fail("top_logprobs must be >= 0 or -1 (got {})", req.top_logprobs);
  Live lv;
  lv.sampler = std::make_unique<Sampler>(req.sampling, model_->n_vocab());  // validates the parameters
  lv.sampler->set_prompt(req.prompt);
  lv.req = std::move(req);
  std::shared_ptr<RequestStream> stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = next_id_++;
    ++stats_.requests_submitted;
    stream = std::make_shared<RequestStream>(id);
    lv.stream = stream;
    inbox_.emplace_back(id, std::move(lv));
  }
  cv_.notify_all();
  return stream;
}

void EngineLoop::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

void EngineLoop::end(uint64_t id, StreamEnd e, std::string error) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  const Scheduler::Sequence* s = sched_->find(id);
  const int64_t cached = s && s->n_cached > 0 ? s->n_cached : 0;
  const int64_t preempted = s ? s->n_preempted : 0;
  const int64_t n_prompt = int64_t(it->second.req.prompt.size());
  std::shared_ptr<RequestStream> stream = it->second.stream;
  sched_->remove(id);
  live_.erase(it);
  {  // counted before the stream ends, so that whoever waits on it sees the counters include it
    std::lock_guard<std::mutex> lock(mu_);
    stats_.prompt_tokens += n_prompt;
    stats_.cached_tokens += cached;
    if (cached > 0) ++stats_.cache_hits;
    ++stats_.requests_finished;
    stats_.running = int64_t(sched_->n_running());
    stats_.waiting = int64_t(sched_->n_waiting());
  }
  stream->finish(e, std::move(error), n_prompt, cached, preempted);
}

void EngineLoop::drain_inbox() {
  std::deque<std::pair<uint64_t, Live>> in;
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (auto& [id, lv] : in) {
    sched_->add(id, lv.req.prompt);
    live_.emplace(id, std::move(lv));
  }
  for (uint64_t id : cancels) end(id, StreamEnd::cancelled);
}

void EngineLoop::run_step() {
  Scheduler::Step st = sched_->schedule();
  for (uint64_t id : st.failed)
    end(id, StreamEnd::error,
        fmt::format("the request needs more state memory than the pool holds ({} pages of 128 tokens)",
                    pool_->n_pages()));
  if (st.items.empty()) return;
  for (const auto& r : st.restores) {
    if (r.snapshot >= 0) pool_->restore_snapshot(r.snapshot, r.slot);
    else pool_->reset_slot(r.slot);
  }
  Batch b;
  std::vector<uint64_t> ids;
  for (const auto& it : st.items) {
    const Scheduler::Sequence* s = sched_->find(it.id);
    BatchSeq bs;
    bs.slot = it.slot;
    bs.p0 = it.p0;
    bs.tokens = std::span<const int32_t>(s->tokens.data() + it.p0, size_t(it.n));
    bs.pages = s->pages;
    bs.logits = it.logits ? BatchSeq::Logits::last : BatchSeq::Logits::none;
    bs.snapshots = it.snapshots;
    if (spec_) {
      if (it.p0 + it.n < int64_t(s->tokens.size())) bs.next_token = s->tokens[size_t(it.p0 + it.n)];  // MTP input
      spec_->prepare(it, *s, bs, *sched_);  // a decode with drafts becomes a verify step
    }
    b.seqs.push_back(std::move(bs));
    ids.push_back(it.id);
  }
  // sampled tokens (or a failure) of the sequences whose chunk reached their last token
  struct Out {
    uint64_t id = 0;
    int32_t token = -1;
    bool bad = false;
    std::string error;  // the request's sampling or constraint failed (the others go on)
    std::optional<TokenLogprobs> lp;
    bool scheduled = false;  // an accepted draft: already in the scheduler's tokens
  };
  std::vector<Out> outs;
  std::vector<float> scratch;
  const auto t0 = std::chrono::steady_clock::now();
  std::string failure;
  try {
    model_->forward(b, *pool_, [&](size_t si, int64_t pos, std::span<const float> lg, bool finite) {
      if (spec_ && spec_->collect(ids[si], pos, lg, finite)) return;  // a verify step: resolved below
      Out o;
      o.id = ids[si];
      if (!finite) o.bad = true;
      else try {
        Live& lv = live_.at(ids[si]);
        Sampler& smp = *lv.sampler;
        const SamplingParams& sp = smp.params();
        if (!lv.req.constraint && sp.greedy() && sp.repetition_penalty == 1.0f && sp.presence_penalty == 0.0f &&
            sp.frequency_penalty == 0.0f) {
          o.token = argmax(lg);  // what sample() computes for these parameters, without copying the logits
        } else {
          scratch.assign(lg.begin(), lg.end());
          if (lv.req.constraint) lv.req.constraint->apply(scratch);  // the request's own mask (batch invariant)
          o.token = smp.sample(scratch);
        }
        if (lv.req.top_logprobs >= 0 && (o.token != model_->eos_id() || lv.req.ignore_eos))
          o.lp = token_logprobs(lg, o.token, lv.req.top_logprobs);  // of the raw logits
      } catch (const Error& e) {
        o.error = e.what();
      }
      outs.push_back(o);
    });
  } catch (const Error& e) {
    failure = e.what();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!failure.empty()) {  // the step's state is unknown: end its requests (their blocks may be incomplete)
    log::warn("forward step failed: {}", failure);
    for (const auto& it : st.items)
      for (const auto& sn : it.snapshots) cache_->free_snapshot(sn.id);
    for (uint64_t id : ids) end(id, StreamEnd::error, "forward step failed: " + failure);
    if (spec_) spec_->retain([&](uint64_t id) { return live_.count(id) > 0; });
    publish_stats();
    return;
  }
  int64_t drafted = 0, accepted = 0;
  if (spec_)
    for (auto& [id, so] : spec_->resolve(st, *sched_, [&](uint64_t id) { return spec_request(id); })) {
      live_.at(id).stream->add_spec(so.n_draft, so.n_accepted);
      drafted += so.n_draft;
      accepted += so.n_accepted;
      if (so.bad || !so.error.empty()) {
        Out o;
        o.id = id;
        o.bad = so.bad;
        o.error = so.error;
        outs.push_back(o);
      }
      for (size_t j = 0; j < so.tokens.size(); ++j) {  // accepted drafts (in the scheduler already), then the target's
        Out o;
        o.id = id;
        o.token = so.tokens[j];
        o.scheduled = j + 1 < so.tokens.size();
        if (j < so.logprobs.size() && (o.token != model_->eos_id() || live_.at(id).req.ignore_eos))
          o.lp = std::move(so.logprobs[j]);
        outs.push_back(o);
      }
    }
  std::map<uint64_t, int64_t> last_snapshots;  // snapshots at a sequence's last computed position (MTP row patch)
  if (spec_)
    for (const auto& it : st.items)
      for (const auto& sn : it.snapshots)
        if (sn.at == it.p0 + it.n) last_snapshots[it.id] = sn.id;
  sched_->commit(st);
  if (drafted > 0) {  // before any token of this step is visible (a client that has its answer sees its drafts)
    std::lock_guard<std::mutex> lock(mu_);
    stats_.drafted_tokens += drafted;
    stats_.accepted_tokens += accepted;
  }
  std::vector<uint64_t> got_token;
  for (Out& o : outs) {
    auto it = live_.find(o.id);
    if (it == live_.end()) continue;
    Live& lv = it->second;
    if (o.bad) {
      end(o.id, StreamEnd::error, "non-finite logits");
      continue;
    }
    if (!o.error.empty()) {
      end(o.id, StreamEnd::error, o.error);
      continue;
    }
    if (lv.req.constraint && !o.scheduled) {  // an accepted draft: the verify told the constraint (spec_decode.h)
      try {
        lv.req.constraint->accept(o.token);
      } catch (const Error& e) {
        end(o.id, StreamEnd::error, e.what());
        continue;
      }
    }
    if (o.token == model_->eos_id() && !lv.req.ignore_eos) {
      end(o.id, StreamEnd::stop);
      continue;
    }
    lv.sampler->accept(o.token);
    if (!o.scheduled) sched_->append(o.id, o.token);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.generated_tokens;  // before the token is visible (see end())
    }
    lv.stream->push(o.token, o.lp ? &*o.lp : nullptr);
    ++lv.generated;
    if (got_token.empty() || got_token.back() != o.id) got_token.push_back(o.id);
    const Scheduler::Sequence* s = sched_->find(o.id);
    if ((lv.req.max_tokens > 0 && lv.generated >= lv.req.max_tokens) || int64_t(s->tokens.size()) >= n_ctx_)
      end(o.id, StreamEnd::length);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    stats_.step_tokens += st.n_tokens();
    stats_.forward_seconds += secs;
    size_t b = 0;
    while (b < kStepBuckets.size() && secs > kStepBuckets[b]) ++b;
    ++stats_.step_buckets[b];
  }
  if (spec_) draft_next(got_token, last_snapshots);
  publish_stats();
}

void EngineLoop::draft_next(const std::vector<uint64_t>& ids, const std::map<uint64_t, int64_t>& snapshots) {
  std::vector<SpecDecoder::Want> wants;
  for (uint64_t id : ids) {
    auto it = live_.find(id);
    const Scheduler::Sequence* s = sched_->find(id);
    if (it == live_.end() || !s) continue;  // ended with its last token
    // a verify step emits up to k + 1 tokens: no drafts past max_tokens or the context
    int64_t k = spec_->k();
    if (it->second.req.max_tokens > 0) k = std::min(k, it->second.req.max_tokens - it->second.generated - 1);
    k = std::min(k, n_ctx_ - int64_t(s->tokens.size()) - 1);
    const auto sn = snapshots.find(id);
    wants.push_back({id, int(std::max<int64_t>(k, 0)), sn == snapshots.end() ? -1 : sn->second});
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    spec_->draft(wants, *sched_, [&](uint64_t id) { return spec_request(id); }, model_->eos_id());
  } catch (const Error& e) {  // the drafter state of these sequences is unknown: end them
    log::warn("draft step failed: {}", e.what());
    for (const auto& w : wants) end(w.id, StreamEnd::error, std::string("draft step failed: ") + e.what());
  }
  spec_->retain([&](uint64_t id) { return live_.count(id) > 0; });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.forward_seconds += secs;
  stats_.draft_seconds += secs;
}

SpecRequest EngineLoop::spec_request(uint64_t id) {
  Live& lv = live_.at(id);
  return {*lv.sampler, lv.req.constraint.get(), lv.req.top_logprobs, lv.req.ignore_eos};
}

void EngineLoop::publish_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.preemptions = sched_->preemptions();
  stats_.running = int64_t(sched_->n_running());
  stats_.waiting = int64_t(sched_->n_waiting());
  stats_.compute_threads = max_threads();  // called on the thread that runs the steps
  stats_.cache = cache_->stats();
  if (disk_) stats_.disk = disk_->stats();
}

bool EngineLoop::step() {
  drain_inbox();
  publish_stats();
  if (sched_->idle()) return false;
  run_step();
  return true;
}

void EngineLoop::run_until_idle() {
  while (step()) {
  }
}

void EngineLoop::loop() {
  if (opts_.n_threads > 0) set_num_threads(opts_.n_threads);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || !cancels_.empty() || !sched_->idle(); });
      if (stop_) return;
    }
    drain_inbox();
    publish_stats();
    if (!sched_->idle()) run_step();
  }
}

EngineLoop::Stats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace dsv4
