// Continuous-batching scheduler (scheduler.h).
#include "engine/scheduler.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace dsv4 {

namespace {
constexpr int64_t kBlock = PrefixCache::kBlockTokens;
}

Scheduler::Scheduler(const SchedulerOptions& o, PrefixCache& cache) : opts_(o), cache_(cache) {
  if (o.max_running < 1) fail("scheduler: max_running must be >= 1 (got {})", o.max_running);
  if (o.batch_tokens < 1) fail("scheduler: batch_tokens must be >= 1 (got {})", o.batch_tokens);
  if (o.snapshot_interval < 1) fail("scheduler: snapshot_interval must be >= 1 (got {})", o.snapshot_interval);
  for (int64_t s = o.max_running - 1; s >= 0; --s) free_slots_.push_back(s);
}

void Scheduler::add(uint64_t id, std::vector<int32_t> prompt) {
  if (prompt.empty()) fail("scheduler: empty prompt");
  if (seqs_.count(id)) fail("scheduler: sequence id {} is in use", id);
  Sequence s;
  s.id = id;
  s.n_prompt = int64_t(prompt.size());
  s.tokens = std::move(prompt);
  seqs_.emplace(id, std::move(s));
  waiting_.push_back(id);
}

const Scheduler::Sequence* Scheduler::find(uint64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

void Scheduler::append(uint64_t id, int32_t token) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) fail("internal: append to unknown sequence {}", id);
  it->second.tokens.push_back(token);
}

bool Scheduler::reserve_pages(uint64_t id, int64_t n_positions) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second.status != Status::running) return false;
  return ensure_pages(it->second, n_positions);
}

void Scheduler::release(Sequence& s) {
  cache_.release_pages(s.pages);
  s.pages.clear();
  if (s.slot >= 0) free_slots_.push_back(s.slot);
  s.slot = -1;
  s.n_computed = 0;
  s.n_registered = 0;
  running_.erase(std::remove(running_.begin(), running_.end(), s.id), running_.end());
}

void Scheduler::remove(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  Sequence& s = it->second;
  if (s.status == Status::running) release(s);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  seqs_.erase(it);
}

void Scheduler::hash_blocks(Sequence& s, int64_t n_blocks) {
  n_blocks = std::min<int64_t>(n_blocks, int64_t(s.tokens.size()) / kBlock);
  while (int64_t(s.hashes.size()) < n_blocks) {
    const int64_t k = int64_t(s.hashes.size());
    const BlockHash parent = k == 0 ? cache_.root() : s.hashes[size_t(k - 1)];
    s.hashes.push_back(block_hash(parent, std::span<const int32_t>(s.tokens.data() + k * kBlock, size_t(kBlock))));
  }
}

int64_t Scheduler::chunk(const Sequence& s, int64_t p0, int64_t limit, bool progress_needed) const {
  const int64_t len = int64_t(s.tokens.size());
  int64_t n = std::min(len - p0, limit);
  if (n <= 0) return 0;
  if (opts_.align_chunks && p0 + n < len) {
    const int64_t end = (p0 + n) / kBlock * kBlock;
    if (end > p0) n = end - p0;
    else if (!progress_needed) return 0;  // the next boundary is out of reach this step
  }
  return n;
}

bool Scheduler::ensure_pages(Sequence& s, int64_t n_positions) {
  const int64_t need = (n_positions + kBlock - 1) / kBlock;
  while (int64_t(s.pages.size()) < need) {
    const auto p = cache_.alloc_page();
    if (!p) return false;
    s.pages.push_back(*p);
  }
  return true;
}

bool Scheduler::keeps(const Sequence& s, int64_t block) const {
  const int64_t at = (block + 1) * kBlock;
  return (block + 1) % opts_.snapshot_interval == 0 || at == s.n_prompt / kBlock * kBlock;
}

std::vector<BatchSeq::Snapshot> Scheduler::plan_snapshots(Sequence& s, int64_t p0, int64_t n) {
  std::vector<BatchSeq::Snapshot> out;
  hash_blocks(s, (p0 + n) / kBlock);
  for (int64_t at = (p0 / kBlock + 1) * kBlock; at <= p0 + n; at += kBlock) {
    const int64_t k = at / kBlock - 1;
    if (cache_.has_snapshot(s.hashes[size_t(k)])) continue;
    const bool latest = at + kBlock > p0 + n;
    if (!latest && !keeps(s, k)) continue;
    const auto id = cache_.alloc_snapshot();
    if (!id) break;
    out.push_back({at, *id});
  }
  return out;
}

Scheduler::Sequence* Scheduler::newest_running(uint64_t except) {
  Sequence* best = nullptr;
  for (uint64_t id : running_) {
    if (id == except) continue;
    Sequence& s = seqs_.at(id);
    if (!best || s.admitted > best->admitted) best = &s;
  }
  return best;
}

void Scheduler::preempt(Sequence& s, Step& step, int64_t& budget) {
  for (size_t i = 0; i < step.items.size(); ++i)
    if (step.items[i].id == s.id) {
      budget += step.items[i].n;
      for (const auto& sn : step.items[i].snapshots) cache_.free_snapshot(sn.id);
      step.items.erase(step.items.begin() + int64_t(i));
      break;
    }
  release(s);
  s.status = Status::waiting;
  ++s.n_preempted;
  ++n_preemptions_;
  waiting_.push_front(s.id);
  step.preempted.push_back(s.id);
}

Scheduler::Step Scheduler::schedule() {
  Step step;
  int64_t budget = opts_.batch_tokens;
  std::set<uint64_t> done;  // scheduled, preempted or failed in this step
  bool any_preempted = false;

  // 1. running sequences: decodes first, then prefills; admission order
  for (int pass = 0; pass < 2; ++pass) {
    const std::vector<uint64_t> order = running_;
    for (uint64_t id : order) {
      if (budget <= 0) break;
      auto it = seqs_.find(id);
      if (it == seqs_.end() || it->second.status != Status::running || done.count(id)) continue;
      Sequence& s = it->second;
      const int64_t p0 = s.n_computed, want = int64_t(s.tokens.size()) - p0;
      if ((pass == 0) != (want == 1)) continue;
      int64_t n = chunk(s, p0, std::min(want, budget), step.items.empty());
      if (n <= 0) continue;
      bool runs = false;
      for (;;) {
        const int64_t fit = (int64_t(s.pages.size()) + cache_.pages_available()) * kBlock - p0;
        if (n > fit) n = fit > 0 ? chunk(s, p0, fit, step.items.empty()) : 0;
        if (n > 0) {
          if (!ensure_pages(s, p0 + n)) fail("internal: page allocation failed after the fit check");
          runs = true;
          break;
        }
        // no progress possible: make room by preempting the most recently admitted sequence (maybe this one)
        Sequence* v = newest_running(s.id);
        if (v == nullptr) {  // alone and still too large for the pool
          release(s);
          step.failed.push_back(s.id);
          done.insert(s.id);
          seqs_.erase(s.id);
          break;
        }
        if (v->admitted > s.admitted) {
          done.insert(v->id);
          preempt(*v, step, budget);
          any_preempted = true;
          n = chunk(s, p0, std::min(want, budget), step.items.empty());
          if (n <= 0) break;
          continue;
        }
        done.insert(s.id);
        preempt(s, step, budget);
        any_preempted = true;
        break;
      }
      if (!runs) continue;
      done.insert(s.id);
      Item item;
      item.id = s.id;
      item.slot = s.slot;
      item.p0 = p0;
      item.n = n;
      item.logits = p0 + n == int64_t(s.tokens.size());
      item.snapshots = plan_snapshots(s, p0, n);
      step.items.push_back(std::move(item));
      budget -= n;
    }
  }

  // 2. waiting sequences, FCFS, with prefix-cache hits (no admission in a step that had to preempt)
  while (!any_preempted && budget > 0 && !free_slots_.empty() && !waiting_.empty()) {
    Sequence& s = seqs_.at(waiting_.front());
    const int64_t len = int64_t(s.tokens.size());
    cache_.fill(s.tokens, len - 1);  // blocks only the lower tier (disk) holds: into pages first
    const PrefixCache::Match m = cache_.match(s.tokens, len - 1);
    const int64_t hit = m.n_blocks * kBlock;
    int64_t n = chunk(s, hit, std::min(len - hit, budget), step.items.empty());
    if (n <= 0) break;
    const int64_t avail = cache_.pages_available() - cache_.idle_pages_in(m);
    const int64_t fit = (m.n_blocks + avail) * kBlock - hit;
    if (n > fit) n = fit > 0 ? chunk(s, hit, fit, step.items.empty()) : 0;
    if (n <= 0) {
      if (running_.empty() && step.items.empty()) {  // nothing will ever free more pages: too large for the pool
        step.failed.push_back(s.id);
        waiting_.pop_front();
        seqs_.erase(s.id);
        continue;
      }
      break;
    }
    cache_.acquire(m);
    s.pages = m.pages;
    if (s.hashes.size() < m.hashes.size()) s.hashes = m.hashes;
    if (!ensure_pages(s, hit + n)) fail("internal: page allocation failed after the fit check");
    s.slot = free_slots_.back();
    free_slots_.pop_back();
    step.restores.push_back({s.slot, m.snapshot});
    s.n_computed = hit;
    s.n_registered = m.n_blocks;
    if (s.n_cached < 0) s.n_cached = hit;
    s.status = Status::running;
    s.admitted = next_admit_++;
    waiting_.pop_front();
    running_.push_back(s.id);
    Item item;
    item.id = s.id;
    item.slot = s.slot;
    item.p0 = hit;
    item.n = n;
    item.logits = hit + n == len;
    item.snapshots = plan_snapshots(s, hit, n);
    step.items.push_back(std::move(item));
    budget -= n;
  }
  return step;
}

void Scheduler::commit(const Step& step) {
  for (const Item& item : step.items) {
    auto it = seqs_.find(item.id);
    if (it == seqs_.end()) {  // removed since (cannot happen inside the engine loop); give the snapshots back
      for (const auto& sn : item.snapshots) cache_.free_snapshot(sn.id);
      continue;
    }
    Sequence& s = it->second;
    if (s.n_computed != item.p0) fail("internal: commit of sequence {} at {} but it holds {}", s.id, item.p0, s.n_computed);
    s.n_computed += item.n;
    const int64_t n_full = s.n_computed / kBlock;
    hash_blocks(s, n_full);
    for (int64_t k = s.n_registered; k < n_full; ++k)
      cache_.insert_block(s.hashes[size_t(k)], k == 0 ? cache_.root() : s.hashes[size_t(k - 1)],
                          std::span<const int32_t>(s.tokens.data() + k * kBlock, size_t(kBlock)), s.pages[size_t(k)]);
    s.n_registered = std::max(s.n_registered, n_full);
    for (const auto& sn : item.snapshots) {
      const int64_t k = sn.at / kBlock - 1;
      if (!cache_.attach_snapshot(s.hashes[size_t(k)], sn.id)) continue;
      // the sequence's latest boundary: keep only while latest unless the policy keeps it
      if (k > s.latest_block) {
        if (s.latest_snapshot >= 0 && s.latest_block >= 0 &&
            cache_.snapshot_of(s.hashes[size_t(s.latest_block)]) == s.latest_snapshot)
          cache_.free_snapshot(s.latest_snapshot);
        s.latest_snapshot = keeps(s, k) ? -1 : sn.id;
        s.latest_block = k;
      }
    }
  }
}

}  // namespace dsv4
