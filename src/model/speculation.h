// Speculative decoding with the checkpoint's drafter over a StatePool with the drafter's layers
// (StatePoolOptions::drafter): the model side of draft, verify and rollback. Two drafters: the MTP module (spec
// §5.9, below) and the DSpark block drafter of the 0731 checkpoints (docs/dspark.md, model/dspark.cpp: its stage
// rings hold the context rows of every position the forward steps compute, a draft runs one block pass and a
// sequential Markov head; nothing of a ring row depends on the next token, so no row is provisional). The decoding
// policy (how many drafts, acceptance, sampling) lives in src/engine/spec_decode.h.
//
// With the MTP module, one round of a sequence whose main state holds positions [0, P) and whose next token x_P is
// known:
//   draft    Model::draft({slot, pos = P - 1, token = x_P, k}): the MTP block at position P - 1 on the main model's
//            hidden streams of P - 1 (kept in the pool's hidden rows by every forward step) and embed[x_P] gives the
//            draft d_1 of x_{P+1}; chained drafts j >= 2 run the MTP at P + j - 2 on its own output streams and
//            d_{j-1} (as vLLM). The MTP ring rows the chained drafts overwrite are put back at the end, so only the
//            row of P - 1 (exact: real hidden, real token) stays.
//   verify   Model::forward with a BatchSeq{p0 = P, tokens = [x_P, d_1..d_k], logits all, spec = true}: the target's
//            k + 1 next-token distributions; the step also runs the MTP block on every position (next token =
//            the following draft) and saves the ring rows and frontier rows it overwrites plus its compressor
//            projections in the slot's speculation rows.
//   rollback Model::rollback({slot, p0 = P, n = k + 1, keep = a + 1}) after a accepted drafts: the rings (main and
//            drafter), compressor frontiers and indexer frontiers are exactly those of a straight run over the kept
//            positions. Compressed rows and indexer keys of windows that end past the kept positions were written
//            to the sequence's own pages but are invisible (visibility is by position) and are rewritten before
//            any position sees them; nothing on the host changes (the caller owns positions and pages).
// The MTP row of the last kept position used the rejected draft as its next token; the next draft() call (pos =
// that position) rewrites it with the accepted token. Everything runs on the backend's device through the op
// contract (backend/ops.h): index lists from the host, no host pointers into the state, any batch.
#pragma once
#include <cstdint>
#include <functional>
#include <span>

namespace dsv4 {

// A verify step (BatchSeq::spec) of n tokens at p0 in slot `slot` that keeps its first `keep` (1 <= keep <= n).
struct SpecRollback {
  int64_t slot = 0, p0 = 0, n = 0, keep = 0;
};

// Drafting for one sequence: its main state holds positions [0, pos + 1), `token` is x_{pos+1}; n_draft in
// [0, Model::max_draft()]. MTP: the MTP row of pos is provisional after the forward step that computed pos (its next
// token was not known there) until a draft() at pos, with any n_draft (0: only that row), rewrites it; decoding
// with speculation calls draft() after every step that produced a token. DSpark: n_draft 0 does nothing and the
// snapshot is not needed (its rings are exact).
struct DraftSeq {
  int64_t slot = 0, pos = 0;
  int32_t token = 0;
  int n_draft = 1;
  int64_t snapshot = -1;  // >= 0: a snapshot the last step took at pos + 1; its (provisional) MTP row of pos is
                          // rewritten too, so that restoring it gives exactly the state of a straight run (MTP)
};

// Receives the drafter's logits (fp32, n_vocab, host memory) of draft j of sequence `seq` — MTP: its head's; DSpark:
// the block row's base logits plus the Markov bias of the previous token — and returns the drafted token (the next
// MTP input / the next Markov step's previous token), or -1 to stop drafting for this sequence. finite == false:
// NaN/inf logits.
using DraftSink = std::function<int32_t(size_t seq, int j, std::span<const float> logits, bool finite)>;

}  // namespace dsv4
