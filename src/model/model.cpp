// Model loading: config, weight binding, resident copies on the backend, RoPE tables (spec §2, §3).
#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "backend/gemm.h"
#include "core/error.h"
#include "core/log.h"
#include "model/dummy_weights.h"
#include "model/sequence.h"

namespace dsv4 {

namespace {
double gib(size_t b) { return double(b) / double(size_t(1) << 30); }

void need_len(size_t have, size_t n, const char* what, int layer) {
  if (have != n) fail("layer {}: {} has {} elements, expected {}", layer, what, have, n);
}
uint64_t view_bytes(const WeightView& w) {
  if (w.rows == 0) return 0;  // (views of experts on the other side keep their shapes)
  uint64_t b = uint64_t(w.rows * w.row_bytes());
  if (w.fmt == GemmFormat::fp8)
    b += uint64_t((w.rows + w.block_rows - 1) / w.block_rows * ((w.cols + w.block_cols - 1) / w.block_cols)) *
         (w.scale_f32 ? 4 : 1);
  if (w.fmt == GemmFormat::fp4) b += uint64_t(w.rows * ((w.cols + 31) / 32));
  return b;
}
uint64_t expert_bytes(const ExpertView& e) { return view_bytes(e.w1) + view_bytes(e.w2) + view_bytes(e.w3); }
}  // namespace


RowFormat Model::state_rows() const {
  return bf16() && be_->compact_state_rows() && StateLayout::compact_fits(cfg_) ? RowFormat::compact : RowFormat::f32;
}

Model::~Model() {
  // Recordings and resident buffers go back to the backend before an owned backend is destroyed; the split's
  // page-locked host experts are released before their memory (dummy_, set_) goes away.
  graphs_.reset();
  split_.reset();
  params_.clear();
  dummy_.reset();
  if (be_) be_->synchronize();
}

const float* Model::upload_f32(const WeightRef& w, size_t expect, const char* what, int layer) {
  if (!w.bound()) return nullptr;
  const std::vector<float> v = dequant_all(w);
  if (expect) need_len(v.size(), expect, what, layer);
  params_.push_back(be_->upload_vector(v, what));
  return params_.back().as<float>();
}

void Model::bind_layer(const LayerWeights& lw, int l, LayerResident& p) {
  const ModelConfig& c = cfg_;
  const int64_t D = c.hidden_size, HC = c.hc_mult;
  auto res = [&](const WeightRef& r) -> WeightView {
    if (!r.bound()) return {};
    if (dummy_ && dummy_->on_device.count(r.w)) return be_->adopt(gemm_weight(r), params_);  // generated there
    const WeightView h = gemm_weight(r);
    resident_bytes_ += be_->resident_bytes(h);
    return be_->upload(h, params_);
  };
  p.ratio = c.compress_ratio(l);
  p.hash = c.is_hash_layer(l);
  const size_t mixw = size_t(c.hc_mix_dim() * HC * D);
  p.hc_attn_fn = upload_f32(lw.hc_attn_fn, mixw, "hc_attn_fn", l);
  p.hc_attn_base = upload_f32(lw.hc_attn_base, size_t(c.hc_mix_dim()), "hc_attn_base", l);
  p.hc_attn_scale = upload_f32(lw.hc_attn_scale, 3, "hc_attn_scale", l);
  p.hc_ffn_fn = upload_f32(lw.hc_ffn_fn, mixw, "hc_ffn_fn", l);
  p.hc_ffn_base = upload_f32(lw.hc_ffn_base, size_t(c.hc_mix_dim()), "hc_ffn_base", l);
  p.hc_ffn_scale = upload_f32(lw.hc_ffn_scale, 3, "hc_ffn_scale", l);
  p.attn_norm = upload_f32(lw.attn_norm, size_t(D), "attn_norm", l);
  p.ffn_norm = upload_f32(lw.ffn_norm, size_t(D), "ffn_norm", l);
  const AttentionWeights& aw = lw.attn;
  p.q_norm = upload_f32(aw.q_norm, size_t(c.q_lora_rank), "q_norm", l);
  p.kv_norm = upload_f32(aw.kv_norm, size_t(c.head_dim), "kv_norm", l);
  p.attn_sink = upload_f32(aw.attn_sink, size_t(c.num_attention_heads), "attn_sink", l);
  p.wq_a = res(aw.wq_a);
  p.wq_b = res(aw.wq_b);
  p.wkv = res(aw.wkv);
  p.wo_a = res(aw.wo_a);
  p.wo_b = res(aw.wo_b);
  if (p.ratio > 0) {
    const CompressorWeights& cw = aw.compressor;
    p.cmp.wkv = res(cw.wkv);
    p.cmp.wgate = res(cw.wgate);
    p.cmp.ape = upload_f32(cw.ape, size_t(p.ratio) * size_t(ModelConfig::compressor_coff(p.ratio) * c.head_dim),
                           "compressor.ape", l);
    p.cmp.norm = upload_f32(cw.norm, size_t(c.head_dim), "compressor.norm", l);
  }
  if (p.ratio == 4) {
    const IndexerWeights& iw = aw.indexer;
    p.idx_cmp.wkv = res(iw.compressor.wkv);
    p.idx_cmp.wgate = res(iw.compressor.wgate);
    p.idx_cmp.ape = upload_f32(iw.compressor.ape, size_t(4 * 2 * c.index_head_dim), "indexer.compressor.ape", l);
    p.idx_cmp.norm = upload_f32(iw.compressor.norm, size_t(c.index_head_dim), "indexer.compressor.norm", l);
    p.idx_wq_b = res(iw.wq_b);
    p.idx_weights_proj = res(iw.weights_proj);
  }
  const FfnWeights& fw = lw.ffn;
  p.gate = res(fw.gate);
  if (p.hash) {
    const WeightRef& t = fw.tid2eid;
    if (!t.bound()) fail("layer {}: hash layer without ffn.gate.tid2eid", l);
    std::vector<int32_t> tab(static_cast<size_t>(t.rows * t.cols));
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t k = 0; k < t.cols; ++k) {
        const int64_t e = read_int(t, r, k);
        if (e < 0 || e >= c.n_routed_experts)
          fail("layer {}: ffn.gate.tid2eid[{}][{}] = {} is not an expert id", l, r, k, e);
        tab[size_t(r * t.cols + k)] = int32_t(e);
      }
    if (t.rows != c.vocab_size || t.cols != c.num_experts_per_tok)
      fail("layer {}: ffn.gate.tid2eid is [{}, {}], expected [{}, {}]", l, t.rows, t.cols, c.vocab_size,
           c.num_experts_per_tok);
    params_.push_back(be_->upload_vector(tab, "tid2eid"));
    p.tid2eid = params_.back().as<int32_t>();
  } else {
    p.gate_bias = upload_f32(fw.gate_bias, size_t(c.n_routed_experts), "gate.bias", l);
  }
  // routed experts: on the device, or (placement) in host memory for the CPU — the device table then keeps their
  // shapes only, the host table the host experts' views
  const int64_t E = int64_t(fw.experts.size());
  auto shape_of = [](const WeightRef& r) {
    WeightView v = r.bound() ? gemm_weight(r) : WeightView{};
    v.w = nullptr;
    v.scale = nullptr;
    v.aux = nullptr;
    return v;
  };
  auto host_of = [&](const WeightRef& r) -> WeightView {
    if (!r.bound()) return {};
    const WeightView h = gemm_weight(r);
    host_expert_bytes_ += view_bytes(h);
    return h;
  };
  p.experts.resize(size_t(E));
  p.host_experts.assign(size_t(E), ExpertView{});
  p.split = SplitMoeLayer{};
  p.split.on_host.assign(size_t(E), 0);
  for (int64_t e = 0; e < E; ++e) {
    const ExpertWeights& xw = fw.experts[size_t(e)];
    if (placement_.on_host(l, e)) {
      p.experts[size_t(e)] = ExpertView{shape_of(xw.w1), shape_of(xw.w2), shape_of(xw.w3)};
      p.host_experts[size_t(e)] = ExpertView{host_of(xw.w1), host_of(xw.w2), host_of(xw.w3)};
      p.split.on_host[size_t(e)] = 1;
      ++p.split.n_host;
    } else {
      p.experts[size_t(e)] = ExpertView{res(xw.w1), res(xw.w2), res(xw.w3)};
      p.host_experts[size_t(e)] = ExpertView{shape_of(xw.w1), shape_of(xw.w2), shape_of(xw.w3)};
    }
  }
  if (fw.shared.w1.bound()) {
    p.shared = ExpertView{res(fw.shared.w1), res(fw.shared.w2), res(fw.shared.w3)};
    p.has_shared = true;
  }
  if (!p.experts.empty()) {
    const ExpertView& e0 = p.experts[0];
    for (const ExpertView& e : p.experts)
      if (e.w1.fmt != e0.w1.fmt || e.w1.rows != e0.w1.rows || e.w1.cols != e0.w1.cols || e.w2.fmt != e0.w2.fmt ||
          e.w3.fmt != e0.w3.fmt)
        fail("layer {}: routed experts must share one format and shape", l);
    params_.push_back(be_->upload_vector(p.experts, "expert table"));
  }
  p.moe.experts = p.experts.data();
  p.moe.n_experts = int64_t(p.experts.size());
  p.moe.device_table = p.experts.empty() ? nullptr : params_.back().data();
  p.moe.shared = p.has_shared ? &p.shared : nullptr;
  if (p.split.n_host > 0) {
    p.split.device = p.moe;
    p.split.host = MoeWeights{p.host_experts.data(), E, nullptr, nullptr};
    std::vector<uint8_t> resident(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) resident[size_t(e)] = p.split.on_host[size_t(e)] ? 0 : 1;
    params_.push_back(be_->upload_vector(resident, "expert placement"));
    p.split.resident = params_.back().as<uint8_t>();
    if (!split_) split_ = std::make_unique<SplitMoe>(*be_, split_options());
    split_->attach(p.split);  // the staged path's chunks (model/expert_staging.h)
  }

}

void Model::make_resident() {
  const ModelConfig& c = cfg_;
  const int64_t D = c.hidden_size, HC = c.hc_mult;
  // Fits? Weight bytes as the backend stores them, plus an allowance for small tensors, workspace and one sequence.
  if (drafter_ == StateLayout::Drafter::mtp && w_.mtp.empty())
    fail("{}: the checkpoint has no MTP module (mtp.* tensors); speculative decoding (--spec-draft) needs one",
         c.origin);
  if (drafter_ == StateLayout::Drafter::dspark && !w_.dspark.bound())
    fail("{}: the config describes a DSpark drafter (dspark_* keys) but the checkpoint has no mtp.* tensors; "
         "speculative decoding (--spec-draft) needs them", c.origin);
  size_t need = 0;
  ModelWeights main = w_;
  if (!has_drafter()) {  // the drafter is resident only for speculative decoding
    main.mtp.clear();
    main.dspark = DsparkWeights{};
  }
  for_each_weight(main, [&](const WeightRef& r) {
    if (r.fmt == WeightFormat::BF16 || r.fmt == WeightFormat::F32 || r.fmt == WeightFormat::FP8_BLOCK128 ||
        r.fmt == WeightFormat::FP4_BLOCK32)
      need += be_->resident_bytes(gemm_weight(r));
  });
  // the routed experts of the main layers: placed on the device or the CPU (the dummy checkpoint was made for the
  // placement load_dummy chose)
  size_t one_expert = 0;
  if (!w_.layers.empty() && !w_.layers[0].ffn.experts.empty()) {
    const ExpertWeights& x = w_.layers[0].ffn.experts[0];
    for (const WeightRef* r : {&x.w1, &x.w2, &x.w3})
      if (r->bound()) one_expert += be_->resident_bytes(gemm_weight(*r));
  }
  const size_t all_experts = one_expert * size_t(c.num_hidden_layers) * size_t(c.n_routed_experts);
  if (!dummy_) place_experts(need - std::min(need, all_experts), one_expert);
  need -= std::min(need, one_expert * size_t(placement_.n_host()));
  if (placement_.n_host() > 0 && !be_->device().is_cpu())  // the staged path's buffers (model/expert_staging.h)
    need += SplitMoe::staging_device_bytes(split_options(), one_expert);
  if (need > 0 && !dummy_) {
    const MemoryInfo mi = be_->memory();
    const size_t slack = size_t(1) << 30;  // workspace + state of a first sequence + small tensors
    if (need + slack > mi.free)
      fail("the model in {} needs {:.2f} GiB on {} ({} bytes of weights + ~1 GiB of workspace and state) but only "
           "{:.2f} GiB of {:.2f} GiB are free; keep routed experts on the CPU (--gpu-experts auto, --n-cpu-moe N, "
           "--cpu-moe), use --device cpu or a machine with more GPU memory",
           c.origin, gib(need + slack), be_->device().name(), need, gib(mi.free), gib(mi.total));
  }
  auto res = [&](const WeightRef& r) -> WeightView {
    if (!r.bound()) return {};
    if (dummy_ && dummy_->on_device.count(r.w)) return be_->adopt(gemm_weight(r), params_);  // generated there
    const WeightView h = gemm_weight(r);
    resident_bytes_ += be_->resident_bytes(h);
    return be_->upload(h, params_);
  };
  embed_ = res(w_.embed);
  if (embed_.fmt != GemmFormat::bf16 && embed_.fmt != GemmFormat::f32)
    fail("{}: embed.weight must be BF16 or F32", c.origin);
  head_ = res(w_.head);
  if (head_.bound()) head_ = be_->add_head_layout(head_, params_);
  norm_ = upload_f32(w_.norm, size_t(D), "norm", -1);
  hc_head_fn_ = upload_f32(w_.hc_head_fn, size_t(HC * HC * D), "hc_head_fn", -1);
  hc_head_base_ = upload_f32(w_.hc_head_base, size_t(HC), "hc_head_base", -1);
  hc_head_scale_ = upload_f32(w_.hc_head_scale, 1, "hc_head_scale", -1);

  // no reallocation: moe.shared points into elements
  lr_.reserve(static_cast<size_t>(c.num_hidden_layers + std::max(1, c.num_draft_layers())));
  lr_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l) bind_layer(w_.layers[size_t(l)], l, lr_[size_t(l)]);
  if (drafter_ != StateLayout::Drafter::none) draft_layer_ = c.num_hidden_layers;
  if (drafter_ == StateLayout::Drafter::dspark) {  // docs/dspark.md
    const DsparkWeights& S = w_.dspark;
    for (size_t k = 0; k < S.stages.size(); ++k) {
      lr_.emplace_back();
      bind_layer(S.stages[k], draft_layer_ + int(k), lr_.back());
    }
    const int last = draft_layer_ + int(S.stages.size()) - 1;
    dspark_.main_proj = res(S.main_proj);
    dspark_.markov_w1 = res(S.markov_w1);
    dspark_.markov_w2 = res(S.markov_w2);
    dspark_.main_norm = upload_f32(S.main_norm, size_t(D), "mtp.main_norm", draft_layer_);
    dspark_.norm = upload_f32(S.norm, size_t(D), "mtp.norm", last);
    dspark_.hc_head_fn = upload_f32(S.hc_head_fn, size_t(HC * HC * D), "mtp.hc_head_fn", last);
    dspark_.hc_head_base = upload_f32(S.hc_head_base, size_t(HC), "mtp.hc_head_base", last);
    dspark_.hc_head_scale = upload_f32(S.hc_head_scale, 1, "mtp.hc_head_scale", last);
    // the confidence projection [1, D + r] as two row vectors over its column ranges [0, D) and [D, D + r)
    const WeightView cv = gemm_weight(S.confidence);
    const int64_t esz = cv.row_bytes() / cv.cols;
    WeightView ch = cv, ce = cv;
    ch.cols = D;
    ce.cols = cv.cols - D;
    ce.w = cv.w + D * esz;
    const bool on_device = dummy_ && dummy_->on_device.count(S.confidence.w);
    if (!on_device) resident_bytes_ += be_->resident_bytes(ch) + be_->resident_bytes(ce);
    dspark_.conf_h = on_device ? be_->adopt(ch, params_) : be_->upload(ch, params_);
    dspark_.conf_e = on_device ? be_->adopt(ce, params_) : be_->upload(ce, params_);
  }
  if (drafter_ == StateLayout::Drafter::mtp) {
    const MtpWeights& mw = w_.mtp[0];
    const int ml = draft_layer_;
    lr_.emplace_back();
    bind_layer(mw.block, ml, lr_.back());
    mtp_.e_proj = res(mw.e_proj);
    mtp_.h_proj = res(mw.h_proj);
    mtp_.enorm = upload_f32(mw.enorm, size_t(D), "mtp.enorm", ml);
    mtp_.hnorm = upload_f32(mw.hnorm, size_t(D), "mtp.hnorm", ml);
    mtp_.norm = upload_f32(mw.norm, size_t(D), "mtp.norm", ml);
    mtp_.hc_head_fn = upload_f32(mw.hc_head_fn, size_t(HC * HC * D), "mtp.hc_head_fn", ml);
    mtp_.hc_head_base = upload_f32(mw.hc_head_base, size_t(HC), "mtp.hc_head_base", ml);
    mtp_.hc_head_scale = upload_f32(mw.hc_head_scale, 1, "mtp.hc_head_scale", ml);
  }
  // what the CPU lanes' rule reads (forward.cpp)
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerResident& p = lr_[size_t(l)];
    auto add = [&](const WeightView& w) {
      largest_layer_product_ = std::max(largest_layer_product_, w.rows * w.cols);
      layer_weight_bytes_ += view_bytes(w);
    };
    for (const WeightView* w : p.dense_linears()) add(*w);
    for (const ExpertView& e : p.experts) add(e.w1), add(e.w2), add(e.w3);
    if (p.has_shared) add(p.shared.w1), add(p.shared.w2), add(p.shared.w3);
  }
  if (split_) {
    split_->finish(c.num_experts_per_tok);  // page-locks the host experts, picks the staging threshold
    if (split_->stage_min_tokens() > 0)
      log::info("split layers: calls of >= {} tokens run their CPU experts on {} (2 x {} MiB staging, host experts "
                "{}page-locked)", split_->stage_min_tokens(), be_->device().name(),
                split_->stage_slot_bytes() >> 20, split_->host_experts_pinned() ? "" : "not ");
  }
  be_->synchronize();
}

SplitMoeOptions Model::split_options() const {
  SplitMoeOptions o;
  const PlacementOptions& p = opts_.placement;
  if (p.stage_bytes < 1) fail("the expert staging buffers need a size (got {} bytes)", p.stage_bytes);
  o.stage_slot_bytes = size_t(p.stage_bytes);
  // auto: the cost model on a device with its own memory; the CPU backend's "device" memory is the host's
  o.stage_min_tokens = p.stage_tokens >= 0 ? p.stage_tokens : be_->device().is_cpu() ? 0 : -1;
  return o;
}

void Model::place_experts(uint64_t non_expert, uint64_t expert) {
  const MemoryInfo mi = be_->memory();
  const int64_t budget =
      int64_t(mi.free) - int64_t(non_expert) - int64_t(placement_reserve_bytes(cfg_, opts_.ubatch));
  placement_ = resolve_placement(cfg_, opts_.placement, expert, budget);
  // experts on the CPU: the staging buffers of the staged path need device memory too (auto: fewer experts)
  const int64_t stage = int64_t(SplitMoe::staging_device_bytes(split_options(), expert));
  if (placement_.n_host() > 0 && stage > 0)
    placement_ = resolve_placement(cfg_, opts_.placement, expert, budget - stage);
  // (a split layer waits on the host's experts inside the step, which a CUDA graph cannot record: forward_ubatch runs
  // it eagerly between the recorded segments of the other layers; the staged path's copy stream and events too)
  if (opts_.placement.any()) log::info("{}", placement_.summary());
}

SplitMoeStats Model::split_stats() const { return split_ ? split_->stats() : SplitMoeStats{}; }

void Model::reset_split_stats() const {
  if (split_) split_->reset_stats();
}

uint64_t Model::host_decode_weight_bytes(int64_t batch) const {
  uint64_t b = 0;
  const double k = double(cfg_.num_experts_per_tok);
  for (const LayerResident& p : lr_) {
    if (p.split.n_host == 0 || p.experts.empty()) continue;
    const double E = double(p.experts.size());
    const double used = batch <= 1 ? k : E * (1.0 - std::pow(1.0 - std::min(k / E, 1.0), double(batch)));
    b += uint64_t(used * double(p.split.n_host) / E * double(expert_bytes(p.experts[0])) + 0.5);
  }
  return b;
}

int Model::max_draft() const {
  switch (drafter_) {
    case StateLayout::Drafter::mtp: return int(StateLayout::kMaxMtpDraft);
    case StateLayout::Drafter::dspark: return cfg_.dspark.block_size;
    case StateLayout::Drafter::none: break;
  }
  return 0;
}

void Model::check_draft(const ModelConfig& c, int k, std::string_view flag) {
  if (k < 0 || k > StateLayout::kMaxDraftLimit)
    usage_fail("{} must be in [0, {}] (got {})", flag, StateLayout::kMaxDraftLimit, k);
  if (c.dspark.present) {
    if (k > c.dspark.block_size)
      usage_fail("{}: {} {}: the checkpoint's drafter is a DSpark drafter (dspark_* config keys), which drafts at "
                 "most its block size {} tokens per step",
                 c.origin, flag, k, c.dspark.block_size);
  } else if (c.num_mtp_layers() < 1) {
    usage_fail("{}: speculative decoding ({}) needs a drafter, but the checkpoint has none (no MTP module: "
               "num_nextn_predict_layers = {}; no DSpark drafter: no dspark_* config keys)",
               c.origin, flag, c.num_nextn_predict_layers);
  } else if (k > StateLayout::kMaxMtpDraft) {
    usage_fail("{}: {} {}: the checkpoint's drafter is its MTP module, which drafts at most {} tokens per step",
               c.origin, flag, k, StateLayout::kMaxMtpDraft);
  }
}

std::unique_ptr<Model> Model::init(const ModelOptions& opts, ModelConfig cfg) {
  std::unique_ptr<Model> m(new Model());
  m->opts_ = opts;
  if (opts.spec_draft < 0) fail("--spec-draft must be >= 0 (got {})", opts.spec_draft);
  if (opts.spec_draft > 0) m->opts_.drafter = true;
  if (m->opts_.drafter) {  // before any weight is read: a clear message which drafter the checkpoint has
    check_draft(cfg, opts.spec_draft);
    if (!cfg.dspark.present && cfg.compress_ratio(cfg.num_hidden_layers) != 0)
      fail("{}: the MTP layer has compress ratio {}; only a window-only MTP block is supported", cfg.origin,
           cfg.compress_ratio(cfg.num_hidden_layers));
    m->drafter_ = cfg.dspark.present ? StateLayout::Drafter::dspark : StateLayout::Drafter::mtp;
  }
  if (m->opts_.ubatch < 1) fail("ubatch must be >= 1 (got {})", m->opts_.ubatch);
  if (opts.n_threads < 0) fail("n_threads must be >= 0 (got {})", opts.n_threads);
  m->cfg_ = std::move(cfg);
  const ModelConfig& c = m->cfg_;
  if (c.scoring_func != "sqrtsoftplus") fail("{}: scoring_func '{}' is not supported (sqrtsoftplus)", c.origin, c.scoring_func);
  if (c.num_key_value_heads != 1) fail("{}: num_key_value_heads must be 1", c.origin);
  if (c.hidden_act != "silu") fail("{}: hidden_act '{}' is not supported (silu)", c.origin, c.hidden_act);
  for (int l = 0; l < c.num_hidden_layers; ++l)
    if (c.compress_ratio(l) == 4 && (c.index_head_dim & (c.index_head_dim - 1)) != 0)
      fail("{}: index_head_dim {} must be a power of two (Hadamard)", c.origin, c.index_head_dim);
  if (c.num_attention_heads % c.o_groups != 0)
    fail("{}: num_attention_heads {} is not a multiple of o_groups {}", c.origin, c.num_attention_heads, c.o_groups);
  if (opts.backend) {
    m->be_ = opts.backend;
  } else {
    BackendOptions bo;
    bo.n_threads = opts.n_threads;
    m->owned_be_ = make_backend(opts.device, bo);
    m->be_ = m->owned_be_.get();
  }
  if (opts.cuda_graphs) m->graphs_ = make_step_graphs(*m->be_);
  m->rope_plain_ = RopeCache(RopeTable::for_ratio(c, 0), c.max_position_embeddings);
  m->rope_yarn_ = RopeCache(RopeTable::for_ratio(c, 4), c.max_position_embeddings);
  return m;
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const ModelOptions& opts) {
  std::unique_ptr<Model> m = init(opts, load_config(dir / "config.json"));
  m->set_ = std::make_unique<SafetensorsSet>(SafetensorsSet::open(dir));
  m->w_ = bind_weights(*m->set_, m->cfg_);
  m->make_resident();
  log::info("loaded {}: {} layers, hidden {}, vocab {}, numerics {}, on {}", dir.string(), m->cfg_.num_hidden_layers,
            m->cfg_.hidden_size, m->cfg_.vocab_size, numerics_name(opts.numerics), m->be_->description());
  return m;
}

std::unique_ptr<Model> Model::load_dummy(const ModelConfig& cfg, const ModelOptions& opts, uint64_t seed) {
  std::unique_ptr<Model> m = init(opts, cfg);
  const DummyDeviceBytes db = dummy_device_bytes(m->cfg_, m->opts_.drafter);
  m->place_experts(db.non_expert, m->be_->device().is_cpu() ? 0 : db.one_expert);
  m->dummy_ = std::make_unique<DummyCheckpoint>(
      make_dummy_checkpoint(m->cfg_, *m->be_, seed, m->opts_.drafter, &m->placement_));
  m->w_ = bind_weights(*m->dummy_->set, m->cfg_);
  m->make_resident();
  log::info("dummy {}: {} layers, {:.2f} GiB made on {}", cfg.origin, m->cfg_.num_hidden_layers,
            double(m->dummy_->device_bytes) / double(1ull << 30), m->be_->description());
  return m;
}


uint64_t Model::decode_weight_bytes(uint64_t* outside_layers, int64_t batch) const {
  const ModelConfig& c = cfg_;
  const uint64_t f32 = 4;
  uint64_t b = view_bytes(head_) + uint64_t(embed_.row_bytes());
  b += uint64_t(c.hc_mult * c.hc_dim() + c.hidden_size) * f32;  // hc_head_fn + norm
  if (outside_layers) *outside_layers = b;
  for (const LayerResident& p : lr_) {
    b += 2 * uint64_t(c.hc_mix_dim() * c.hc_dim()) * f32;          // hc_attn_fn, hc_ffn_fn
    for (const WeightView* w : p.dense_linears()) b += view_bytes(*w);
    if (p.has_shared) b += expert_bytes(p.shared);
    if (!p.experts.empty()) {
      const double E = double(p.experts.size()), k = double(c.num_experts_per_tok);
      const double used = batch <= 1 ? k : E * (1.0 - std::pow(1.0 - std::min(k / E, 1.0), double(batch)));
      b += uint64_t(used * double(expert_bytes(p.experts[0])) + 0.5);
    }
  }
  return b;
}

double Model::matmul_flops_per_token(double* outside_layers) const {
  const ModelConfig& c = cfg_;
  auto el = [](const WeightView& w) { return double(w.rows) * double(w.cols); };
  auto ex = [&](const ExpertView& e) { return el(e.w1) + el(e.w2) + el(e.w3); };
  double f = 2.0 * double(c.hc_mult * c.hc_dim());  // hc_head's mix projection (hc_mult rows)
  if (outside_layers) *outside_layers = f;
  for (const LayerResident& p : lr_) {
    f += 2.0 * 2.0 * double(c.hc_mix_dim()) * double(c.hc_dim());  // hc_attn_fn, hc_ffn_fn
    for (const WeightView* w : p.dense_linears()) f += 2.0 * el(*w);
    if (p.has_shared) f += 2.0 * ex(p.shared);
    if (!p.experts.empty()) f += 2.0 * double(c.num_experts_per_tok) * ex(p.experts[0]);
  }
  return f;
}

std::unique_ptr<LmSequence> Model::new_sequence() const { return std::make_unique<ModelSequence>(*this); }

}  // namespace dsv4
