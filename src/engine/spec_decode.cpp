// Speculative decoding in the engine loop (spec_decode.h).
#include "engine/spec_decode.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

namespace {

// argmax with ties -> lowest id (what Sampler::sample gives for temperature 0 without penalties).
int32_t argmax_of(std::span<const float> lg) {
  float mx = lg[0];
  for (float v : lg) mx = v > mx ? v : mx;
  for (size_t j = 0; j < lg.size(); ++j)
    if (lg[j] == mx) return int32_t(j);
  return 0;
}

bool plain_greedy(const SamplingParams& sp) {
  return sp.greedy() && sp.repetition_penalty == 1.0f && sp.presence_penalty == 0.0f && sp.frequency_penalty == 0.0f;
}

}  // namespace

int32_t draw_token(std::span<const float> w, double u) {
  double total = 0.0;
  for (float x : w) total += x;
  const double target = u * total;
  double cum = 0.0;
  int32_t last = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0.0f) continue;
    cum += w[i];
    last = int32_t(i);
    if (target < cum) return int32_t(i);
  }
  return last;  // rounding: u landed on the total
}

int32_t verify_draft(std::span<const float> p, std::span<const float> q, int32_t d, Sampler& smp, bool& accepted) {
  const double u = smp.uniform();
  accepted = u * double(q[size_t(d)]) < double(p[size_t(d)]);
  if (accepted) return d;
  std::vector<float> resid(p.size());
  double mass = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    resid[i] = std::max(0.0f, p[i] - q[i]);
    mass += resid[i];
  }
  return draw_token(mass > 0.0 ? std::span<const float>(resid) : p, smp.uniform());
}

int32_t next_draft(Sampler& smp, std::span<const float> logits, DraftTokens& d) {
  const SamplingParams& sp = smp.params();
  std::vector<float> scratch;
  if (d.constraint || !plain_greedy(sp)) {
    scratch.assign(logits.begin(), logits.end());
    if (d.constraint) d.constraint->apply(scratch);
  }
  int32_t t;
  std::vector<float> q;
  if (plain_greedy(sp)) {
    t = argmax_of(d.constraint ? std::span<const float>(scratch) : logits);
  } else if (sp.greedy()) {
    t = smp.sample(scratch);
  } else {
    smp.distribution(scratch, q);
    t = draw_token(q, smp.uniform());
  }
  if (d.constraint) d.constraint->accept(t);  // throws for a token it forbids: nothing recorded
  if (!plain_greedy(sp)) {
    if (!sp.greedy()) d.q.push_back(std::move(q));
    smp.accept(t);
    d.tentative.push_back(t);
  }
  d.tokens.push_back(t);
  return t;
}

void finish_drafts(Sampler& smp, DraftTokens& d) {
  for (auto t = d.tentative.rbegin(); t != d.tentative.rend(); ++t) smp.unaccept(*t);
  d.tentative.clear();
}

VerifyOutcome verify_drafts(Sampler& smp, std::span<const int32_t> drafts, const std::vector<std::vector<float>>& q,
                            std::vector<std::vector<float>>& rows, const std::vector<char>& finite,
                            const VerifyHooks& hooks) {
  const SamplingParams& sp = smp.params();
  const bool fast = plain_greedy(sp);
  const int64_t k = int64_t(drafts.size());
  if (int64_t(rows.size()) != k + 1 || int64_t(finite.size()) != k + 1 || (!sp.greedy() && int64_t(q.size()) < k))
    fail("internal: verify of {} drafts with {} target rows and {} draft distributions", k, rows.size(), q.size());
  VerifyOutcome v;
  std::vector<float> dist, raw;
  for (int64_t j = 0; j <= k; ++j) {
    if (!finite[size_t(j)]) {
      v.bad = true;
      break;
    }
    std::vector<float>& lg = rows[size_t(j)];
    if (hooks.top_logprobs >= 0) raw = lg;                 // the row before the mask and the penalties
    if (hooks.constraint) hooks.constraint->apply(lg);     // as a plain step: mask, then the sampler
    auto note = [&](int32_t t) {
      if (hooks.top_logprobs >= 0) v.logprobs.push_back(token_logprobs(raw, t, hooks.top_logprobs));
    };
    const bool last = j == k;
    const int32_t dj = last ? -1 : drafts[size_t(j)];
    if (sp.greedy()) {
      const int32_t t = fast ? argmax_of(lg) : smp.sample(lg);  // greedy sample(): penalties + argmax, no draw
      if (last || t != dj) {
        v.emit = t;
        note(t);
        break;
      }
    } else {
      smp.distribution(lg, dist);
      if (last) {
        v.emit = draw_token(dist, smp.uniform());
        note(v.emit);
        break;
      }
      bool ok = false;
      const int32_t t = verify_draft(dist, q[size_t(j)], dj, smp, ok);
      if (!ok) {
        v.emit = t;
        note(t);
        break;
      }
    }
    v.accepted.push_back(dj);
    note(dj);
    if (!fast) smp.accept(dj);
    if (hooks.constraint) hooks.constraint->accept(dj);  // the state of row j + 1
  }
  if (!fast)
    for (auto t = v.accepted.rbegin(); t != v.accepted.rend(); ++t) smp.unaccept(*t);
  if (v.bad) {
    v.accepted.clear();
    v.emit = -1;
    v.logprobs.clear();
  }
  return v;
}

SpecDecoder::SpecDecoder(const Model& model, StatePool& pool, int k) : model_(model), pool_(pool), k_(k) {
  if (!model.has_drafter())
    fail("speculative decoding needs the model's drafter (load it with ModelOptions::drafter)");
  if (k < 1 || k > model.max_draft()) fail("--spec-draft must be in [0, {}] (got {})", model.max_draft(), k);
  if (pool.layout().drafter != model.drafter())
    fail("internal: speculative decoding needs a state pool with the drafter's layers");
  if (model.options().ubatch < k + 1)
    fail("speculative decoding with {} drafts needs a ubatch of at least {} tokens (got {})", k, k + 1,
         model.options().ubatch);
}

bool SpecDecoder::prepare(const Scheduler::Item& item, const Scheduler::Sequence& s, BatchSeq& bs, Scheduler& sched) {
  auto it = drafts_.find(item.id);
  if (it == drafts_.end()) return false;
  Drafts& d = it->second;
  const bool valid = item.n == 1 && item.logits && item.p0 == d.p0 && d.tokens.size() >= 2 &&
                     int64_t(s.tokens.size()) == item.p0 + 1 && s.tokens[size_t(item.p0)] == d.tokens[0];
  int64_t k = valid ? int64_t(d.tokens.size()) - 1 : 0;
  while (k > 0 && !sched.reserve_pages(item.id, item.p0 + k + 1)) --k;  // positions p0 .. p0 + k need pages
  if (k == 0) {
    drafts_.erase(it);
    return false;
  }
  d.tokens.resize(size_t(k + 1));
  if (d.q.size() > size_t(k)) d.q.resize(size_t(k));
  d.p.assign(size_t(k + 1), {});
  d.finite.assign(size_t(k + 1), 0);
  d.verifying = true;
  bs.tokens = d.tokens;
  bs.pages = s.pages;  // reserve_pages may have grown (and moved) the page table
  bs.logits = BatchSeq::Logits::all;
  bs.spec = true;
  bs.next_token = -1;
  return true;
}

bool SpecDecoder::collect(uint64_t id, int64_t pos, std::span<const float> logits, bool finite) {
  auto it = drafts_.find(id);
  if (it == drafts_.end() || !it->second.verifying) return false;
  Drafts& d = it->second;
  const int64_t j = pos - d.p0;
  if (j < 0 || j >= int64_t(d.p.size())) fail("internal: verify logits of position {} outside the step", pos);
  d.p[size_t(j)].assign(logits.begin(), logits.end());
  d.finite[size_t(j)] = finite;
  return true;
}

std::map<uint64_t, SpecDecoder::Outcome> SpecDecoder::resolve(Scheduler::Step& step, Scheduler& sched,
                                                             const SpecRequestOf& request_of) {
  std::map<uint64_t, Outcome> out;
  std::vector<SpecRollback> rb;
  for (Scheduler::Item& item : step.items) {
    auto it = drafts_.find(item.id);
    if (it == drafts_.end() || !it->second.verifying) continue;
    Drafts& d = it->second;
    const SpecRequest r = request_of(item.id);
    const int64_t k = int64_t(d.tokens.size()) - 1;
    Outcome o;
    o.n_draft = k;
    VerifyOutcome v;
    try {
      v = verify_drafts(r.sampler, std::span<const int32_t>(d.tokens).subspan(1), d.q, d.p, d.finite,
                        {r.constraint, r.top_logprobs});
    } catch (const Error& e) {  // the request's sampling or constraint failed: nothing kept past x_P
      o.error = e.what();
      v = VerifyOutcome{};
    }
    o.bad = v.bad;
    const std::vector<int32_t>& accepted = v.accepted;
    const int32_t emit = v.emit;
    o.n_accepted = int64_t(accepted.size());
    o.tokens = accepted;
    if (emit >= 0) o.tokens.push_back(emit);
    o.logprobs = std::move(v.logprobs);
    const int64_t keep = int64_t(accepted.size()) + 1;
    if (keep < k + 1) rb.push_back({item.slot, item.p0, k + 1, keep});
    for (int32_t t : accepted) sched.append(item.id, t);  // positions p0 + 1 .. p0 + a, committed with the item
    item.n = keep;
    drafts_.erase(it);
    out.emplace(item.id, std::move(o));
  }
  model_.rollback(rb, pool_);
  return out;
}

void SpecDecoder::draft(std::span<const Want> wants, Scheduler& sched, const SpecRequestOf& request_of,
                        int32_t eos_id) {
  std::vector<DraftSeq> ds;
  std::vector<uint64_t> ids;
  for (const Want& w : wants) {
    const Scheduler::Sequence* s = sched.find(w.id);
    if (!s || s->status != Scheduler::Status::running || s->slot < 0 || s->n_computed < 1 ||
        int64_t(s->tokens.size()) != s->n_computed + 1)
      continue;
    ds.push_back({s->slot, s->n_computed - 1, s->tokens.back(), std::clamp(w.n_draft, 0, k_), w.snapshot});
    ids.push_back(w.id);
    Drafts& d = drafts_[w.id];
    d = Drafts{};
    d.p0 = s->n_computed;
    d.tokens = {s->tokens.back()};
  }
  if (ds.empty()) return;
  std::vector<DraftTokens> dt(ds.size());
  for (size_t i = 0; i < ds.size(); ++i)
    if (TokenConstraint* c = request_of(ids[i]).constraint) dt[i].constraint = c->clone();
  model_.draft(ds, pool_, [&](size_t i, int, std::span<const float> lg, bool finite) -> int32_t {
    if (!finite) return -1;
    const SpecRequest r = request_of(ids[i]);
    int32_t t;
    try {
      t = next_draft(r.sampler, lg, dt[i]);
    } catch (const Error&) {  // the constraint's copy refused the draft: no more drafts for this one
      return -1;
    }
    if (t == eos_id && !r.ignore_eos) return -1;  // nothing to draft past the end
    return t;
  });
  for (size_t i = 0; i < ds.size(); ++i) {
    finish_drafts(request_of(ids[i]).sampler, dt[i]);
    Drafts& d = drafts_.at(ids[i]);
    d.tokens.insert(d.tokens.end(), dt[i].tokens.begin(), dt[i].tokens.end());
    d.q = std::move(dt[i].q);
    if (d.tokens.size() < 2) drafts_.erase(ids[i]);
  }
}

void SpecDecoder::retain(const std::function<bool(uint64_t)>& live) {
  for (auto it = drafts_.begin(); it != drafts_.end();)
    it = live(it->first) ? std::next(it) : drafts_.erase(it);
}

}  // namespace dsv4
