// A streamed request's choices on the stream pump (streamed_choices.h).
#include "server/streamed_choices.h"

namespace dsv4 {

StreamedChoices::StreamedChoices(StreamPump& pump, Setup s) : pump_(pump), s_(std::move(s)) {
  const size_t n = s_.reqs.size();
  results_.resize(n);
  errors_.resize(n);
  ended_.assign(n, false);
  gens_.resize(n);
}

StreamedChoices::~StreamedChoices() { gens_.clear(); }

void StreamedChoices::begin(int i) {
  GenerationCallbacks g = s_.callbacks(i);
  if (i == 0 && s_.reqs.size() > 1) {
    auto inner = g.on_token;
    g.on_token = [this, inner](int32_t id, std::string_view text) {
      prefilled_ = true;
      return inner ? inner(id, text) : true;
    };
  }
  auto outer_cancel = g.should_cancel;
  g.should_cancel = [this, outer_cancel] { return failed_ || (outer_cancel && outer_cancel()); };
  try {
    gens_[size_t(i)] = std::make_unique<LoopGeneration>(*s_.loop, s_.reqs[size_t(i)], s_.tok, std::move(g),
                                                        [this] { pump_.notify(this); });
  } catch (...) {
    errors_[size_t(i)] = std::current_exception();
    failed_ = true;
    ended_[size_t(i)] = true;
  }
}

bool StreamedChoices::step(int i) {
  if (ended_[size_t(i)]) return true;
  LoopGeneration& g = *gens_[size_t(i)];
  try {
    if (!g.advance()) return false;
    GenerationResult& r = g.result();
    if (i == 0 && r.finish == FinishReason::cancelled) first_cancelled_ = true;
    if (s_.done) s_.done(i, r);
    results_[size_t(i)] = std::move(r);
  } catch (...) {
    errors_[size_t(i)] = std::current_exception();
    failed_ = true;
  }
  ended_[size_t(i)] = true;
  return true;
}

bool StreamedChoices::run() {
  if (finished_) return true;
  const int n = int(s_.reqs.size());
  if (!gens_[0] && !ended_[0]) begin(0);
  // until nothing moves: a failure cancels the others (their should_cancel), which then end in a later round
  for (bool again = true; again;) {
    again = false;
    bool all = true;
    for (int i = 0; i < n; ++i) {
      if (i > 0 && !others_started_) {
        all = false;
        continue;
      }
      const bool was = ended_[size_t(i)];
      if (!step(i)) all = false;
      if (!was && ended_[size_t(i)] && failed_) again = true;
    }
    if (n > 1 && !others_started_ && (prefilled_ || ended_[0])) {
      others_started_ = true;
      for (int i = 1; i < n; ++i) {
        if (failed_ || first_cancelled_) {
          results_[size_t(i)].finish = FinishReason::cancelled;
          ended_[size_t(i)] = true;
        } else {
          begin(i);
        }
      }
      again = true;
      continue;
    }
    if (all) {
      std::exception_ptr first;
      for (auto& e : errors_)
        if (e && !first) first = e;
      finished_ = true;
      gens_.clear();
      if (s_.finished) s_.finished(results_, first);
      return true;
    }
  }
  return false;
}

}  // namespace dsv4
