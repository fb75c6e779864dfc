// Batch: the input of one batched forward step (Model::forward(const Batch&, StatePool&, ...)) — a ragged batch of
// sequences, each contributing a contiguous run of tokens at its own positions (a prefill chunk, one decode token,
// or anything between), all of whose state lives in one StatePool (model/state_pool.h).
//
// Per sequence: its state slot, the position of its first token (= the positions its slot already holds), the
// tokens, its page table (page k holds the compressed rows of positions [128k, 128k+128); it must cover every
// position up to the last token), which logits are wanted, and which boundary snapshots to take inside the step.
// A slot appears at most once per batch. Pages may be shared between sequences only where no sequence of the step
// writes them (full pages of a common prefix; a sequence only writes the pages of its own positions >= p0).
//
// The result for a sequence is bitwise independent of the other sequences of the batch, of its position in the
// batch, of the ubatch split and of where its chunks start (CPU; CUDA per the batch-invariance contract of ops.h).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace dsv4 {

struct BatchSeq {
  int64_t slot = 0;                  // state slot in the pool
  int64_t p0 = 0;                    // position of tokens[0]
  std::span<const int32_t> tokens;   // >= 1 tokens (caller-owned, valid during the forward call)
  std::span<const int32_t> pages;    // page table (caller-owned); >= ceil((p0 + n) / 128) entries
  enum class Logits { none, last, all, mask } logits = Logits::last;
  std::vector<char> mask;            // Logits::mask: mask[i] != 0 -> logits of tokens[i]
  // Snapshot of the state at position `at` (a multiple of 128, p0 < at <= p0 + n) into snapshot `id` of the pool.
  struct Snapshot {
    int64_t at = 0;
    int64_t id = 0;
  };
  std::vector<Snapshot> snapshots;
  // Speculative decoding (pools with a drafter's layers, model/speculation.h):
  int32_t next_token = -1;           // the token after tokens.back() if known (MTP input of the last position)
  bool spec = false;                 // a verify step (<= layout().spec_rows tokens, snapshots only at p0 + 1):
                                     // keep what Model::rollback needs to drop a suffix of its tokens again

  int64_t n() const { return int64_t(tokens.size()); }
  bool wants(int64_t i) const {
    switch (logits) {
      case Logits::none: return false;
      case Logits::last: return i + 1 == n();
      case Logits::all: return true;
      case Logits::mask: return i < int64_t(mask.size()) && mask[size_t(i)] != 0;
    }
    return false;
  }
};

struct Batch {
  std::vector<BatchSeq> seqs;
  int64_t n_tokens() const {
    int64_t n = 0;
    for (const auto& s : seqs) n += s.n();
    return n;
  }
};

// Receives the next-token logits (fp32, n_vocab, host memory) of position `pos` of batch sequence `seq`; `finite` is
// false when a logit is NaN or infinite (the step went on for the other sequences).
using BatchLogitsSink = std::function<void(size_t seq, int64_t pos, std::span<const float> logits, bool finite)>;

}  // namespace dsv4
