#include "model/split_moe.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "backend/cpu_ops.h"
#include "model/expert_staging.h"

namespace dsv4 {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
size_t up256(size_t b) { return (b + 255) & ~size_t(255); }
}  // namespace

SplitMoe::SplitMoe(Backend& be, const SplitMoeOptions& o) : be_(be), opts_(o) {
  if (o.stage_min_tokens != 0) staging_ = std::make_unique<ExpertStaging>(be, o.stage_min_tokens, o.stage_slot_bytes);
}

SplitMoe::~SplitMoe() {
  staging_.reset();
  if (pin_) {
    try {
      be_.synchronize();
    } catch (const std::exception&) {  // a device failure was reported where it happened
    }
    be_.free_pinned(pin_);
  }
}

void SplitMoe::attach(SplitMoeLayer& L) {
  if (staging_) staging_->attach(L);
}

void SplitMoe::finish(int64_t top_k) {
  if (!staging_) return;
  const bool pinned = staging_->pin_host();
  if (opts_.stage_min_tokens < 0 && staging_->n_experts() > 0)
    staging_->set_min_tokens(auto_stage_min_tokens(staging_->n_experts(), top_k, staging_->expert_bytes(),
                                                   staging_->expert_macs(),
                                                   pinned ? kPinnedUploadBytesPerS : kPageableUploadBytesPerS));
}

int64_t SplitMoe::stage_min_tokens() const { return staging_ ? std::max<int64_t>(staging_->min_tokens(), 0) : 0; }
size_t SplitMoe::stage_slot_bytes() const { return staging_ ? staging_->slot_bytes() : 0; }
bool SplitMoe::host_experts_pinned() const { return staging_ && staging_->pinned(); }

size_t SplitMoe::staging_device_bytes(const SplitMoeOptions& o, uint64_t expert_bytes) {
  return o.stage_min_tokens == 0 ? 0 : ExpertStaging::device_bytes(o.stage_slot_bytes, expert_bytes);
}

SplitMoeStats SplitMoe::stats() const {
  SplitMoeStats s = stats_;
  if (staging_) {
    const StagingStats st = staging_->stats();
    s.staged_chunks = st.chunks;
    s.staged_bytes = st.bytes;
    s.staged_copy_s = st.copy_s;
  }
  return s;
}

void SplitMoe::reset_stats() {
  stats_ = {};
  if (staging_) staging_->reset_stats();
}

void SplitMoe::run_staged(const Ops& ops, const SplitMoeLayer& L, int64_t D, const float* x, int64_t n,
                          const int32_t* ids, const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q,
                          bool bf16, float* y) {
  Workspace& ws = be_.workspace();
  Workspace::Scope scope(ws);
  const int64_t P = n * k;
  float* o_pairs = ws.alloc<float>(P * D);
  float* o_shared = L.device.shared ? ws.alloc<float>(n * D) : nullptr;
  // the resident experts and the shared expert, then the host experts chunk by chunk from the staging slots: every
  // pair's row is written once (each expert is resident or in one chunk)
  ops.moe_resident(L.device, L.resident, x, n, ids, wts, k, swiglu_limit, q, bf16, o_pairs, o_shared);
  staging_->run(ops, L, x, n, ids, wts, k, swiglu_limit, q, bf16, o_pairs);
  ops.moe_combine(o_pairs, ids, n, k, D, o_shared, bf16, y);
  stats_.calls += 1;
  stats_.staged_calls += 1;
}

void SplitMoe::reserve(size_t bytes) {
  if (bytes <= pin_bytes_) return;
  if (pin_) {
    be_.synchronize();  // copies from the old staging may still be queued
    be_.free_pinned(pin_);
    pin_ = nullptr;
    pin_bytes_ = 0;
  }
  const size_t b = std::max(bytes, pin_bytes_ * 2);
  pin_ = be_.alloc_pinned(b, "MoE host staging");
  pin_bytes_ = b;
}

void SplitMoe::run(const Ops& ops, const SplitMoeLayer& L, int64_t D, const float* x, int64_t n, const int32_t* ids,
                   const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16, float* y) {
  if (n <= 0) return;
  if (staging_ && staging_->applies(L, n)) {
    run_staged(ops, L, D, x, n, ids, wts, k, swiglu_limit, q, bf16, y);
    return;
  }
  const int64_t P = n * k;
  // staging layout: x [n, D] | ids [P] | wts [P] | rows [P + n, D] (cpu_expert_rows' capacity) | pairs [P] | idx [2P]
  const size_t o_x = 0, o_ids = o_x + up256(size_t(n * D) * 4), o_wts = o_ids + up256(size_t(P) * 4),
               o_rows = o_wts + up256(size_t(P) * 4), o_prs = o_rows + up256(size_t((P + n) * D) * 4),
               o_idx = o_prs + up256(size_t(P) * 4), total = o_idx + up256(size_t(2 * P) * 4);
  reserve(total);
  char* base = static_cast<char*>(pin_);
  float* hx = reinterpret_cast<float*>(base + o_x);
  int32_t* hids = reinterpret_cast<int32_t*>(base + o_ids);
  float* hwts = reinterpret_cast<float*>(base + o_wts);
  float* hrows = reinterpret_cast<float*>(base + o_rows);
  int32_t* hpairs = reinterpret_cast<int32_t*>(base + o_prs);
  int32_t* hidx = reinterpret_cast<int32_t*>(base + o_idx);

  Workspace& ws = be_.workspace();
  Workspace::Scope scope(ws);
  // 1. input rows and routing to the host (queued; the device goes on)
  be_.copy_to_host_async(hx, x, size_t(n * D) * 4);
  be_.copy_to_host_async(hids, ids, size_t(P) * 4);
  be_.copy_to_host_async(hwts, wts, size_t(P) * 4);
  // 2. the device's experts and the shared expert
  float* o_pairs = ws.alloc<float>(P * D);
  float* o_shared = L.device.shared ? ws.alloc<float>(n * D) : nullptr;
  ops.moe_resident(L.device, L.resident, x, n, ids, wts, k, swiglu_limit, q, bf16, o_pairs, o_shared);
  // 3. the host's experts, as soon as the rows are there
  const auto t0 = Clock::now();
  be_.wait_copies_to_host();
  const auto t1 = Clock::now();
  const int64_t m = cpu_expert_rows(L.host, D, L.on_host.data(), hx, n, hids, hwts, k, swiglu_limit, q, bf16, false,
                                    hpairs, hrows);
  stats_.host_s += since(t1);
  stats_.wait_s += std::chrono::duration<double>(t1 - t0).count();
  // 4. their rows back, into the per-pair rows; the combine in the fixed order
  if (m > 0) {
    std::iota(hidx, hidx + m, 0);
    std::copy(hpairs, hpairs + m, hidx + m);
    float* drows = ws.alloc<float>(m * D);
    int32_t* didx = ws.alloc<int32_t>(2 * m);
    be_.copy_to_device(drows, hrows, size_t(m * D) * 4);
    be_.copy_to_device(didx, hidx, size_t(2 * m) * 4);
    ops.scatter_rows(drows, didx, o_pairs, didx + m, m, D);
  }
  ops.moe_combine(o_pairs, ids, n, k, D, o_shared, bf16, y);
  stats_.calls += 1;
  stats_.host_pairs += m;
  stats_.device_pairs += P - m;
  stats_.to_host_bytes += uint64_t(n * D + 2 * P) * 4;
  stats_.to_device_bytes += uint64_t(m * D + 2 * m) * 4;
}

}  // namespace dsv4
