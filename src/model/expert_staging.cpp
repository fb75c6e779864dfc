// ExpertStaging (expert_staging.h): chunk plans, page-locking, the double-buffered upload / compute loop.
#include "model/expert_staging.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu_backend.h"
#include "core/error.h"
#include "core/log.h"
#include "model/split_moe.h"

namespace dsv4 {

namespace {
size_t up256(size_t b) { return (b + 255) & ~size_t(255); }
double gib(double b) { return b / double(uint64_t(1) << 30); }

size_t weight_bytes(const WeightView& v) { return size_t(v.rows * v.row_bytes()); }
size_t scale_bytes(const WeightView& v) {
  if (v.fmt == GemmFormat::fp8)
    return size_t(((v.rows + v.block_rows - 1) / v.block_rows) * ((v.cols + v.block_cols - 1) / v.block_cols)) *
           (v.scale_f32 ? 4 : 1);
  if (v.fmt == GemmFormat::fp4) return size_t(v.rows * ((v.cols + 31) / 32));
  return 0;
}

// The host memory of one expert: w and scale of w1, w3, w2 (in this order: piece i / 2 is matrix i / 2, odd pieces
// are scales).
struct Piece {
  const uint8_t* src = nullptr;
  size_t bytes = 0;
  int64_t expert = 0;
  int part = 0;  // 0..5: w1.w, w1.scale, w3.w, w3.scale, w2.w, w2.scale
};

WeightView* part_view(ExpertView& e, int part) {
  return part / 2 == 0 ? &e.w1 : part / 2 == 1 ? &e.w3 : &e.w2;
}

std::vector<Piece> pieces_of(const ExpertView& e, int64_t id) {
  std::vector<Piece> out;
  const WeightView* m[3] = {&e.w1, &e.w3, &e.w2};
  for (int i = 0; i < 3; ++i) {
    out.push_back({m[i]->w, weight_bytes(*m[i]), id, 2 * i});
    if (m[i]->scale && scale_bytes(*m[i]) > 0) out.push_back({m[i]->scale, scale_bytes(*m[i]), id, 2 * i + 1});
  }
  return out;
}

size_t footprint(const std::vector<Piece>& ps) {
  size_t b = 0;
  for (const Piece& p : ps) b += up256(p.bytes);
  return b;
}
}  // namespace

int64_t auto_stage_min_tokens(int64_t n_experts, int64_t top_k, double expert_bytes, double expert_macs,
                              double upload_bytes_per_s) {
  if (n_experts <= 0 || top_k <= 0 || expert_macs <= 0 || upload_bytes_per_s <= 0) return 1;
  const double n = double(n_experts) * expert_bytes * kCpuExpertMacsPerS /
                   (double(top_k) * expert_macs * upload_bytes_per_s);
  return std::max<int64_t>(1, int64_t(std::ceil(n)));
}

size_t ExpertStaging::device_bytes(size_t slot_bytes, uint64_t expert_bytes) {
  // one expert's pieces, each 256-byte aligned
  return size_t(kSlots) * std::max(slot_bytes, size_t(expert_bytes) + 6 * 256);
}

ExpertStaging::ExpertStaging(Backend& be, int64_t min_tokens, size_t slot_bytes)
    : be_(be), min_tokens_(min_tokens), slot_bytes_(slot_bytes), queue_(be.make_upload_queue(kSlots)) {}

ExpertStaging::~ExpertStaging() {
  try {
    queue_->synchronize();
    be_.synchronize();  // the ops reading the slots
  } catch (const std::exception& e) {
    log::warn("expert staging: {}", e.what());
  }
  for (const void* p : pins_) be_.unpin_host(p);
}

void ExpertStaging::set_upload_queue(std::unique_ptr<UploadQueue> q) {
  if (!q || q->slots() != kSlots) fail("internal: expert staging needs an upload queue of {} slots", kSlots);
  queue_->synchronize();
  queue_ = std::move(q);
  copy_s0_ = queue_->copy_seconds();
}

void ExpertStaging::attach(SplitMoeLayer& L) {
  L.stage.reset();
  if (L.n_host <= 0) return;
  const MoeWeights& H = L.host;
  const int64_t E = H.n_experts;
  if (int64_t(L.on_host.size()) != E || L.device.n_experts != E || !L.device.experts)
    fail("internal: expert staging: a split layer whose tables disagree ({} / {} / {} experts)", L.on_host.size(),
         L.device.n_experts, E);
  std::vector<std::vector<Piece>> per(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    if (!L.on_host[size_t(e)]) continue;
    const ExpertView& x = H.experts[e];
    if (!x.w1.w || !x.w2.w || !x.w3.w) fail("internal: expert staging: host expert {} is not bound", e);
    per[size_t(e)] = pieces_of(x, e);
    for (const Piece& p : per[size_t(e)]) ranges_.push_back({p.src, p.bytes});
    if (n_experts_ == 0) {
      n_experts_ = E;
      for (const Piece& p : per[size_t(e)]) expert_bytes_ += double(p.bytes);
      expert_macs_ = double(x.w1.rows * x.w1.cols + x.w3.rows * x.w3.cols + x.w2.rows * x.w2.cols);
    }
  }
  if (!slots_[0]) {  // the first layer sets the slot size: at least one expert
    size_t one = 0;
    for (const auto& ps : per) one = std::max(one, footprint(ps));
    slot_bytes_ = std::max(slot_bytes_, one);
    for (int s = 0; s < kSlots; ++s) slots_[size_t(s)] = Buffer(be_, slot_bytes_, "expert staging");
  }
  auto plan = std::make_shared<StagePlan>();
  plan->owner = this;
  // chunks: consecutive host experts (ascending id) while they fit a slot
  std::vector<std::vector<int64_t>> chunk_ids;
  size_t used = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (per[size_t(e)].empty()) continue;
    const size_t f = footprint(per[size_t(e)]);
    if (f > slot_bytes_)
      fail("internal: expert staging: an expert of {} bytes does not fit the {}-byte slots", f, slot_bytes_);
    if (chunk_ids.empty() || used + f > slot_bytes_) {
      chunk_ids.emplace_back();
      used = 0;
    }
    chunk_ids.back().push_back(e);
    used += f;
  }
  for (const auto& ids : chunk_ids) {
    StagePlan::Chunk ch;
    ch.n_experts = int64_t(ids.size());
    // the chunk's pieces in source address order (adjacent tensors of a mapped checkpoint coalesce into one copy).
    // Only across a boundary inside a page: pin_host() page-locks pieces that share a page as one range, but
    // separate ranges where they only touch, and one copy must not span two page-locked ranges (CUDA: invalid
    // argument).
    const uintptr_t page = uintptr_t(std::max<long>(sysconf(_SC_PAGESIZE), 4096));
    std::vector<Piece> ps;
    for (int64_t e : ids) ps.insert(ps.end(), per[size_t(e)].begin(), per[size_t(e)].end());
    std::sort(ps.begin(), ps.end(), [](const Piece& a, const Piece& b) { return a.src < b.src; });
    std::vector<size_t> off(ps.size());
    size_t at = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      at = up256(at);
      off[i] = at;
      StagePlan::Copy* last = ch.copies.empty() ? nullptr : &ch.copies.back();
      if (last && static_cast<const uint8_t*>(last->src) + last->bytes == ps[i].src &&
          last->offset + last->bytes == at && reinterpret_cast<uintptr_t>(ps[i].src) % page != 0)
        last->bytes += ps[i].bytes;
      else
        ch.copies.push_back({at, ps[i].src, ps[i].bytes});
      at += ps[i].bytes;
      ch.bytes += ps[i].bytes;
    }
    std::vector<uint8_t> mask(static_cast<size_t>(E), 0);
    for (int64_t e : ids) mask[size_t(e)] = 1;
    ch.mask = be_.upload_vector(mask, "staged expert mask");
    for (int s = 0; s < kSlots; ++s) {
      std::vector<ExpertView> v(L.device.experts, L.device.experts + E);
      for (int64_t e : ids) v[size_t(e)] = H.experts[e];
      for (int64_t e : ids)
        for (WeightView* w : {&v[size_t(e)].w1, &v[size_t(e)].w3, &v[size_t(e)].w2}) w->aux = nullptr;
      for (size_t i = 0; i < ps.size(); ++i) {
        WeightView* w = part_view(v[size_t(ps[i].expert)], ps[i].part);
        (ps[i].part % 2 == 0 ? w->w : w->scale) = slot(s) + off[i];
      }
      ch.tables[size_t(s)] = be_.upload_vector(v, "staged expert table");
      ch.views[size_t(s)] = std::move(v);
    }
    plan->bytes += ch.bytes;
    plan->chunks.push_back(std::move(ch));
  }
  L.stage = std::move(plan);
}

bool pin_host_fits(double pinned_bytes, double host_bytes) {
  if (host_bytes <= 0) return true;
  constexpr double kKeepPageable = 16.0 * 1024 * 1024 * 1024;
  return pinned_bytes <= host_bytes * 0.75 && host_bytes - pinned_bytes >= kKeepPageable;
}

bool ExpertStaging::pin_host() {
  if (pin_tried_) return pinned_;
  pin_tried_ = true;
  if (ranges_.empty() || be_.device().is_cpu()) return false;
  // whole pages; ranges that share a page merged (pinning a page twice is an error). Ranges that only touch stay
  // apart: each merged range then lies in one mapping (separate allocations may be adjacent mappings).
  const size_t page = size_t(std::max<long>(sysconf(_SC_PAGESIZE), 4096));
  std::vector<std::pair<uintptr_t, uintptr_t>> r;  // [begin, end)
  for (const auto& [p, n] : ranges_) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(p) / page * page;
    const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n + page - 1) / page * page;
    r.push_back({b, e});
  }
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uintptr_t, uintptr_t>> merged;
  for (const auto& x : r) {
    if (!merged.empty() && x.first < merged.back().second) merged.back().second = std::max(merged.back().second, x.second);
    else merged.push_back(x);
  }
  double total = 0;
  for (const auto& x : merged) total += double(x.second - x.first);
  const double host = double(cpu_backend().memory().total);
  if (!pin_host_fits(total, host)) {
    log::info("expert staging: the {:.2f} GiB of host experts are not page-locked (more than 3/4 of the host's "
              "{:.2f} GiB, or less than 16 GiB would stay pageable); staged copies run at pageable speed",
              gib(total), gib(host));
    return false;
  }
  for (const auto& x : merged) {
    std::string why;
    const void* p = reinterpret_cast<const void*>(x.first);
    if (!be_.pin_host(p, size_t(x.second - x.first), &why)) {
      log::warn("expert staging: could not page-lock {:.2f} GiB of host experts ({}); staged copies run at pageable "
                "speed", gib(total), why);
      for (const void* q : pins_) be_.unpin_host(q);
      pins_.clear();
      return false;
    }
    pins_.push_back(p);
  }
  pinned_ = true;
  log::info("expert staging: {:.2f} GiB of host experts page-locked in {} ranges", gib(total), merged.size());
  return true;
}

bool ExpertStaging::applies(const SplitMoeLayer& L, int64_t n_tok) const {
  return min_tokens_ > 0 && n_tok >= min_tokens_ && L.stage && L.stage->owner == this && !L.stage->chunks.empty();
}

void ExpertStaging::run(const Ops& ops, const SplitMoeLayer& L, const float* x, int64_t n, const int32_t* ids,
                        const float* wts, int64_t k, float swiglu_limit, const LinearOpts& q, bool bf16,
                        float* o_pairs) {
  if (!L.stage || L.stage->owner != this) fail("internal: expert staging: a layer attached elsewhere");
  const StagePlan& P = *L.stage;
  const int n_ch = int(P.chunks.size());
  const int s0 = next_;
  auto upload = [&](int c) {
    const int s = (s0 + c) % kSlots;
    for (const StagePlan::Copy& cp : P.chunks[size_t(c)].copies) queue_->copy(s, slot(s) + cp.offset, cp.src, cp.bytes);
  };
  // chunk c + 1 is queued for upload before chunk c is computed: the copy queue fills one slot while the device
  // reads the other (the upload into a slot waits for the chunk computed from it before: consumed())
  try {
    upload(0);
    for (int c = 0; c < n_ch; ++c) {
      const int s = (s0 + c) % kSlots;
      if (c + 1 < n_ch) upload(c + 1);
      queue_->filled(s);
      const StagePlan::Chunk& ch = P.chunks[size_t(c)];
      const MoeWeights w{ch.views[size_t(s)].data(), int64_t(ch.views[size_t(s)].size()),
                         ch.tables[size_t(s)].data(), nullptr};
      ops.moe_resident(w, ch.mask.as<uint8_t>(), x, n, ids, wts, k, swiglu_limit, q, bf16, o_pairs, nullptr);
      queue_->consumed(s);
    }
  } catch (...) {  // an op failed: leave both slots free for the next call (its copies wait for what was queued)
    for (int s = 0; s < kSlots; ++s) queue_->consumed(s);
    throw;
  }
  next_ = (s0 + n_ch) % kSlots;
  stats_.calls += 1;
  stats_.chunks += n_ch;
  stats_.bytes += P.bytes;
}

StagingStats ExpertStaging::stats() {
  StagingStats s = stats_;
  s.copy_s = queue_->copy_seconds() - copy_s0_;
  return s;
}

void ExpertStaging::reset_stats() {
  stats_ = {};
  copy_s0_ = queue_->copy_seconds();
}

}  // namespace dsv4
