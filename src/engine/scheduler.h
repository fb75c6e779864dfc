// Scheduler: which tokens of which sequences run in the next forward step (continuous batching, vLLM v1 style), and
// the bookkeeping of their state slots, pages and snapshots through the PrefixCache (engine/prefix_cache.h). Host
// only: it never touches the model; the engine loop (engine/engine_loop.h) turns a Step into a Batch
// (model/batch.h), runs it, samples, and reports back.
//
// A sequence is its tokens (prompt + generated) and n_computed, the positions its state holds; each step tries to
// let n_computed catch up with the tokens (no prefill or decode phase: a decode is a sequence one token behind).
// Per step there is one token budget (batch_tokens):
//   1. running sequences in admission order, those one token behind (decode) first, then those in a prefill;
//   2. waiting sequences in arrival order (FCFS) while a slot, budget and pages are free: each reuses the longest
//      cached block prefix that ends in a snapshot (at least one token is always computed) and restores that
//      snapshot into its slot (Step::restores), then prefills the rest.
// Prefill chunks end on 128-token boundaries (align_chunks) unless they end the sequence's tokens, so that a
// resumed or cached prefill sees the same chunk grid as a cold one (results do not depend on it: the forward pass
// is chunk invariant; snapshots are taken inside steps). A chunk that reaches the end of the tokens wants logits.
// Pages: a sequence holds pages for every position it computes; a step allocates what its chunks need. When pages
// run out, a prefill chunk shrinks to what fits; a sequence that cannot make any progress preempts the most
// recently admitted running sequence (possibly itself): its pages go back to the cache (its full blocks stay cached
// and matchable), its slot is freed, and it waits at the head of the queue to be resumed by recomputation — which
// mostly hits the cache. A sequence that cannot fit even alone fails (Step::failed) instead of running out of
// memory. Nothing here can change a result: every path recomputes exactly the positions whose state is missing.
// Snapshots: at every snapshot_interval-th block boundary, at the prompt end floored to 128 and at each sequence's
// latest boundary (kept while it is the latest, so a finished or preempted sequence can be resumed), unless the block
// already has one; they are taken inside the step (BatchSeq::snapshots) and attached to their blocks at commit().
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <vector>

#include "engine/prefix_cache.h"
#include "model/batch.h"

namespace dsv4 {

struct SchedulerOptions {
  int64_t max_running = 8;        // sequences in flight (state slots of the pool)
  int64_t batch_tokens = 512;     // tokens per step
  bool align_chunks = true;       // prefill chunks end on 128-token boundaries (but the last)
  int64_t snapshot_interval = 1;  // blocks between kept snapshots (1: every block boundary)
};

class Scheduler {
 public:
  enum class Status { waiting, running };
  struct Sequence {
    uint64_t id = 0;
    std::vector<int32_t> tokens;     // prompt + generated
    int64_t n_prompt = 0;
    int64_t n_computed = 0;          // positions whose state the slot and pages hold
    int64_t slot = -1;
    std::vector<int32_t> pages;      // page of block k = pages[k]
    std::vector<BlockHash> hashes;   // chain hashes of its full blocks, as far as computed
    int64_t n_registered = 0;        // blocks offered to the cache
    int64_t n_cached = -1;           // prompt tokens reused from the cache at the first admission (-1: not yet)
    int64_t n_preempted = 0;
    int64_t latest_snapshot = -1;    // the snapshot of its latest boundary, while not a kept one
    int64_t latest_block = -1;
    Status status = Status::waiting;
    uint64_t admitted = 0;           // admission order
  };
  struct Item {
    uint64_t id = 0;
    int64_t slot = 0, p0 = 0, n = 0;
    bool logits = false;             // the chunk ends the tokens: its last logits give the next token
    std::vector<BatchSeq::Snapshot> snapshots;
  };
  struct Restore {
    int64_t slot = 0;
    int64_t snapshot = -1;           // -1: reset the slot (a fresh sequence)
  };
  struct Step {
    std::vector<Restore> restores;   // device work to queue before the step, in order
    std::vector<Item> items;
    std::vector<uint64_t> preempted; // sequences preempted while scheduling (now waiting)
    std::vector<uint64_t> failed;    // sequences that cannot fit in the pool even alone (removed)
    int64_t n_tokens() const {
      int64_t n = 0;
      for (const auto& i : items) n += i.n;
      return n;
    }
  };

  // Throws dsv4::Error for max_running < 1, batch_tokens < 1 or snapshot_interval < 1.
  Scheduler(const SchedulerOptions& opts, PrefixCache& cache);

  // A new sequence (waiting, FCFS). Throws dsv4::Error for an empty prompt or an id in use.
  void add(uint64_t id, std::vector<int32_t> prompt);
  // Finished or cancelled: pages released (full blocks stay cached), slot freed, snapshots kept. Unknown ids: no-op.
  void remove(uint64_t id);
  Step schedule();
  // The step ran: n_computed advances, full blocks are registered in the cache, snapshots attached.
  void commit(const Step& step);
  // A sampled token of a sequence whose item wanted logits.
  void append(uint64_t id, int32_t token);
  // Speculative decoding (engine/spec_decode.h): pages for n_positions positions of a running sequence (a verify
  // step runs past its scheduled token); false when the pool has no free page for them.
  bool reserve_pages(uint64_t id, int64_t n_positions);

  const Sequence* find(uint64_t id) const;
  size_t n_waiting() const { return waiting_.size(); }
  size_t n_running() const { return running_.size(); }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  const SchedulerOptions& options() const { return opts_; }
  PrefixCache& cache() { return cache_; }
  int64_t preemptions() const { return n_preemptions_; }

 private:
  int64_t chunk(const Sequence& s, int64_t p0, int64_t limit, bool progress_needed) const;
  bool ensure_pages(Sequence& s, int64_t n_positions);
  void hash_blocks(Sequence& s, int64_t n_blocks);
  void preempt(Sequence& s, Step& step, int64_t& budget);
  void release(Sequence& s);
  std::vector<BatchSeq::Snapshot> plan_snapshots(Sequence& s, int64_t p0, int64_t n);
  bool keeps(const Sequence& s, int64_t block) const;
  Sequence* newest_running(uint64_t except);

  SchedulerOptions opts_;
  PrefixCache& cache_;
  std::map<uint64_t, Sequence> seqs_;
  std::deque<uint64_t> waiting_;
  std::vector<uint64_t> running_;    // admission order
  std::vector<int64_t> free_slots_;
  uint64_t next_admit_ = 1;
  int64_t n_preemptions_ = 0;
};

}  // namespace dsv4
