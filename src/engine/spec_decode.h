// Speculative decoding with the checkpoint's drafter (the MTP module or the DSpark drafter) inside the EngineLoop
// (issue 13; model side: model/speculation.h, docs/dspark.md).
//
// Per running request with --spec-draft k (EngineLoopOptions::spec_draft), after every step that gave it a token
// x_P: draft() proposes up to k tokens d_1..d_k with the drafter (fewer near max_tokens / n_ctx; sequences of one
// step may have different counts). Its next decode item becomes a verify step [x_P, d_1..d_k] (prepare()); the
// target's k + 1 distributions decide (resolve()):
//   greedy (temperature 0): d_{j+1} is accepted while it equals the target's argmax at P + j (penalties applied),
//     then the target's token at the first mismatch (or after the last draft) is emitted: exactly the tokens of
//     decoding without speculation;
//   sampled: standard rejection sampling — d_{j+1} ~ q_j (the draft logits under the same sampling transforms as the
//     target: penalties with the tentative history, temperature, min-p, top-k, top-p) is accepted with probability
//     min(1, p_j(d) / q_j(d)); the first rejection emits a token of the normalized residual max(0, p_j - q_j); if all
//     are accepted, a token of p_k. The output distribution equals sampling without speculation; the request's seed
//     makes it reproducible (its draws: one per draft, one per checked draft, one per emitted correction).
// Requests with a TokenConstraint or log-probabilities speculate too (VerifyHooks): each verified row is masked by
// the constraint in the state after the accepted drafts before it (a forbidden draft is never accepted), and each
// emitted token's log-probabilities come from its own row's raw logits: the tokens, constraint states and
// log-probabilities of decoding without speculation. The drafts follow a copy of the constraint (clone()).
// Rejected positions are rolled back exactly (Model::rollback); the scheduler commits only the kept positions, so
// prefix-cache blocks and snapshots never see a rejected token. Drafted / accepted counts go to the request's
// stream and the loop's stats. A verify step takes its pages when it is built (fewer drafts when the pool has no
// free page) and is counted as one token of the scheduler's step budget. The drafts of a request depend only on
// the request (its tokens, parameters and limits), so its output does not depend on what shares its steps.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "model/model.h"
#include "sampling/logprobs.h"
#include "sampling/sampler.h"
#include "sampling/token_constraint.h"

namespace dsv4 {

// One drafted position of a sampled request: the draft d (drawn from q) is accepted with probability
// min(1, p(d) / q(d)); otherwise the result is a token of the normalized residual max(0, p - q). p, q: normalized
// distributions [n_vocab] under the request's sampling transforms (Sampler::distribution); the uniforms come from
// `smp` (one for the test, one for a residual token). Returns the token (d when accepted).
int32_t verify_draft(std::span<const float> p, std::span<const float> q, int32_t d, Sampler& smp, bool& accepted);
// A token of the (unnormalised, non-negative) weights w by one uniform u in [0, 1), walking ids in ascending order.
int32_t draw_token(std::span<const float> w, double u);

// The per-request pieces shared by the EngineLoop (SpecDecoder) and the single-request Engine (engine.h):
struct DraftTokens {
  std::vector<int32_t> tokens;           // d_1, d_2, ...
  std::vector<std::vector<float>> q;     // their draft distributions (sampled requests)
  std::vector<int32_t> tentative;        // tokens the sampler holds tentatively (penalties of later drafts)
  // A copy of the request's TokenConstraint (TokenConstraint::clone), advanced by each draft: masks the draft logits
  // so that the drafts follow the constraint too (more of them accepted). Null: unmasked (the verify still masks).
  std::unique_ptr<TokenConstraint> constraint;
};
// The next draft from draft logits (masked by d.constraint): greedy requests the argmax after penalties, sampled ones
// a draw from q (the draft distribution under the request's sampling transforms, kept in d.q). The sampler accepts it
// tentatively until finish_drafts(). Throws dsv4::Error when d.constraint refuses it (nothing recorded then).
int32_t next_draft(Sampler& smp, std::span<const float> logits, DraftTokens& d);
void finish_drafts(Sampler& smp, DraftTokens& d);
// Per-request work of a verify besides the sampler's (both optional), what a plain decode step does per token:
//   constraint: masks row j before the decision (its state: after x_P and the accepted d_1..d_j) and is told each
//     accepted draft, so that it ends in the state after the accepted prefix; the emitted token is the caller's to
//     tell it (as after a plain step). A draft it forbids has p(d) = 0 / is never the argmax: rejected.
//   top_logprobs >= 0: the log-probabilities of every emitted token from its row's raw logits (sampling/logprobs.h).
struct VerifyHooks {
  TokenConstraint* constraint = nullptr;
  int top_logprobs = -1;
};
struct VerifyOutcome {
  std::vector<int32_t> accepted;         // the accepted prefix of the drafts
  int32_t emit = -1;                     // the target's token after it (-1 with bad)
  bool bad = false;                      // non-finite target logits
  std::vector<TokenLogprobs> logprobs;   // VerifyHooks::top_logprobs >= 0: accepted..., emit (one per token)
};
// The target's decision over drafts d_1..d_k given its k + 1 logits rows (modified in place) of the verify step.
VerifyOutcome verify_drafts(Sampler& smp, std::span<const int32_t> drafts, const std::vector<std::vector<float>>& q,
                            std::vector<std::vector<float>>& rows, const std::vector<char>& finite,
                            const VerifyHooks& hooks = {});

// What the SpecDecoder needs of one request (loop thread).
struct SpecRequest {
  Sampler& sampler;
  TokenConstraint* constraint = nullptr;  // VerifyHooks::constraint; a clone() of it masks the drafts
  int top_logprobs = -1;                  // VerifyHooks::top_logprobs
  bool ignore_eos = false;                // drafts go on past EOS
};
using SpecRequestOf = std::function<SpecRequest(uint64_t)>;

class SpecDecoder {
 public:
  // Throws dsv4::Error when k is outside [1, model.max_draft()] or the model was loaded without its drafter.
  SpecDecoder(const Model& model, StatePool& pool, int k);
  int k() const { return k_; }

  // A decode item of a sequence with drafts for its position becomes a verify step (bs.tokens then point into the
  // decoder; logits of every token). Returns true if so.
  bool prepare(const Scheduler::Item& item, const Scheduler::Sequence& s, BatchSeq& bs, Scheduler& sched);
  // Logits of a verify step's token (called from the forward sink); false: not a verify step (the caller samples).
  bool collect(uint64_t id, int64_t pos, std::span<const float> logits, bool finite);

  struct Outcome {
    std::vector<int32_t> tokens;   // emitted: accepted drafts, then the target's token
    std::vector<TokenLogprobs> logprobs;  // top_logprobs >= 0: one per token
    int64_t n_draft = 0, n_accepted = 0;
    bool bad = false;              // non-finite logits
    std::string error;             // the constraint failed (nothing emitted)
  };
  // After the forward step: the outcome of every verify step, its rejected positions rolled back in the pool, the
  // items' token counts cut to the kept positions and the accepted drafts appended to the scheduler (call before
  // Scheduler::commit; the emitted target token is appended by the caller as a sampled token). The requests'
  // constraints were told the accepted drafts (VerifyHooks), not the emitted token.
  std::map<uint64_t, Outcome> resolve(Scheduler::Step& step, Scheduler& sched, const SpecRequestOf& request_of);

  struct Want {
    uint64_t id = 0;
    int n_draft = 0;               // 0: only the MTP row of the last position (no drafts; DSpark: nothing)
    int64_t snapshot = -1;         // a snapshot the step took after the last computed position (DraftSeq)
  };
  // Drafts for sequences that just got a token (their last token not computed yet), in one batched draft() call.
  void draft(std::span<const Want> wants, Scheduler& sched, const SpecRequestOf& request_of, int32_t eos_id);
  // Forget the drafts of sequences not in `live` (ended, cancelled).
  void retain(const std::function<bool(uint64_t)>& live);

 private:
  struct Drafts {
    int64_t p0 = -1;                       // position of x_P (the verify step's first token)
    std::vector<int32_t> tokens;           // x_P, d_1 .. d_k (the verify step's tokens)
    std::vector<std::vector<float>> q;     // draft distributions (sampled requests)
    std::vector<std::vector<float>> p;     // the verify step's logits [k + 1][n_vocab]
    std::vector<char> finite;
    bool verifying = false;
  };
  const Model& model_;
  StatePool& pool_;
  int k_ = 0;
  std::map<uint64_t, Drafts> drafts_;
};

}  // namespace dsv4
