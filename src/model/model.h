// dsv4::Model: a DeepSeek V4 checkpoint (any V4-family config: tiny test models, Flash, Pro) loaded for inference on
// one backend (backend/backend.h: the CPU or a CUDA GPU), implementing the engine contract (language_model.h).
//
// Forward pass: spec §5 (embedding, 4-stream hyper-connections, attention with window + compressed KV + indexer, MoE,
// head), written once against the op interface (backend/ops.h). Each step is planned on the host from positions
// (model/step_plan.h) and then runs entirely on the backend's device; only the wanted logits come back. One step
// runs a ragged batch of sequences (model/batch.h) whose state lives in one StatePool (model/state_pool.h); the
// single-sequence API (SequenceState, ModelSequence) is a batch of one over a private pool.
// Numerics (ONE switch, backend/numerics.h): `reference` reproduces every quantization point of the official
// implementation (§8), `dense` is fp32 with exactly dequantized weights (what HF transformers computes).
// Results are independent of how a sequence is split into append() calls (any chunking, decode), of what else shares
// its steps and, on the CPU, of the thread count: every op is per-row/per-token with fixed reduction orders and
// visibility is position based.
//
// Memory: resident weights (CPU: the mapped checkpoint; CUDA: a device copy) + small fp32 copies of norms / hc / ape /
// sinks / biases + per-sequence state (sequence_state.h) + a workspace bounded by the ubatch size.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "backend/numerics.h"
#include "backend/ops.h"
#include "backend/step_graphs.h"
#include "core/device.h"
#include "loader/config.h"
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "model/batch.h"
#include "model/expert_placement.h"
#include "model/language_model.h"
#include "model/rope_cache.h"
#include "model/sequence_state.h"
#include "model/speculation.h"
#include "model/split_moe.h"
#include "model/state_pool.h"
#include "model/step_plan.h"

namespace dsv4 {

struct ModelOptions {
  Numerics numerics = Numerics::reference;
  int64_t ubatch = 256;            // max tokens per forward step (a batch is split into ubatches; bounds scratch)
  Device device{};                 // where to run (ignored when `backend` is given)
  Backend* backend = nullptr;      // run on this backend (not owned; must outlive the model), e.g. a test double
  int n_threads = 0;               // CPU backend: OpenMP threads (> 0: set at load, process-wide; 0: keep)
  bool drafter = false;            // make the checkpoint's drafter resident and run it (speculative decoding): the
                                   // MTP module, or the DSpark drafter when the config has dspark_* keys; throws
                                   // when the checkpoint has none
  int spec_draft = 0;              // draft tokens per step for the engines built on this model (--spec-draft,
                                   // 0 = off, 1 .. max_draft(): MTP 4, DSpark its block size); > 0 implies drafter
  bool cuda_graphs = true;         // CUDA: record each forward step shape once as a CUDA graph and replay it
                                   // (backend/step_graphs.h; `dsv4 bench model --no-cuda-graph` turns it off)
  PlacementOptions placement;      // routed experts on the device or the CPU (--cpu-moe, --n-cpu-moe, --gpu-experts,
                                   // --hot-experts; model/expert_placement.h); default: all on the device
};

// The MTP module outside its block (spec §3.5, §5.9), resident on the backend's device.
struct MtpResident {
  WeightView e_proj, h_proj;          // FP8 [D, D]
  const float *enorm = nullptr, *hnorm = nullptr, *norm = nullptr;  // [D]
  const float *hc_head_fn = nullptr, *hc_head_base = nullptr, *hc_head_scale = nullptr;
};

// The DSpark drafter outside its stages (docs/dspark.md), resident on the backend's device.
struct DsparkResident {
  WeightView main_proj;                // FP8 [D, T*D]
  WeightView markov_w1;                // BF16 [vocab, r] (an embedding table)
  WeightView markov_w2;                // BF16 [vocab, r]
  WeightView conf_h, conf_e;           // the confidence projection [1, D + r] split into its [1, D] and [1, r] columns
  const float *main_norm = nullptr, *norm = nullptr;  // [D]
  const float *hc_head_fn = nullptr, *hc_head_base = nullptr, *hc_head_scale = nullptr;
};

// The weights of one compressor, resident on the backend's device.
struct CompressorResident {
  WeightView wkv, wgate;           // BF16 [coff*c, D]
  const float* ape = nullptr;      // [ratio, coff*c]
  const float* norm = nullptr;     // [c]
};

// Everything one layer reads, resident on the backend's device (pointers into Model-owned Buffers).
struct LayerResident {
  int ratio = 0;
  bool hash = false;
  const float *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
  const float *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  const float *attn_norm = nullptr, *ffn_norm = nullptr, *q_norm = nullptr, *kv_norm = nullptr;
  const float* attn_sink = nullptr;
  WeightView wq_a, wq_b, wkv, wo_a, wo_b;
  CompressorResident cmp, idx_cmp;
  WeightView idx_wq_b, idx_weights_proj;
  WeightView gate;
  const float* gate_bias = nullptr;   // [E] (non-hash layers with a bias)
  const int32_t* tid2eid = nullptr;   // [vocab, top-k] (hash layers)
  std::vector<ExpertView> experts;    // device views (experts on the host: shapes only, unbound)
  ExpertView shared;
  bool has_shared = false;
  MoeWeights moe;                     // views of `experts` / `shared` + their device table
  std::vector<ExpertView> host_experts;  // host views of the experts the CPU runs (the others unbound)

  // Every linear a token of this layer passes besides the experts (attention, compressors, indexer, router gate);
  // unbound ones (a layer without a compressor) have no rows.
  std::array<const WeightView*, 12> dense_linears() const {
    return {&wq_a, &wq_b, &wkv, &wo_a, &wo_b, &cmp.wkv, &cmp.wgate, &idx_cmp.wkv, &idx_cmp.wgate, &idx_wq_b,
            &idx_weights_proj, &gate};
  }
  SplitMoeLayer split;                // the layer's split (split.n_host > 0: some experts on the host)
};

class Model final : public LanguageModel {
 public:
  // Open `dir` (config.json + safetensors), bind and check every tensor, make the weights resident on the backend.
  // Throws dsv4::Error (also when the model does not fit the device: the bytes needed and free are named).
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, const ModelOptions& opts = {});
  // A model of `cfg`'s exact shapes and formats with pseudo-random weights made on the backend's device, no files
  // read (`--load-format dummy`, model/dummy_weights.h). For benchmarks.
  static std::unique_ptr<Model> load_dummy(const ModelConfig& cfg, const ModelOptions& opts = {}, uint64_t seed = 1);
  ~Model() override;

  const ModelConfig& config() const { return cfg_; }
  Numerics numerics() const { return opts_.numerics; }
  const ModelOptions& options() const { return opts_; }
  Backend& backend() const { return *be_; }
  // The resident lm head (with the backend's own layout for decode, Backend::add_head_layout).
  const WeightView& head_weight() const { return head_; }

  // LanguageModel
  int32_t n_vocab() const override { return int32_t(cfg_.vocab_size); }
  int32_t bos_id() const override { return int32_t(cfg_.bos_token_id); }
  int32_t eos_id() const override { return int32_t(cfg_.eos_token_id); }
  int64_t max_context() const override { return cfg_.max_position_embeddings; }
  std::unique_ptr<LmSequence> new_sequence() const override;

  // How this model's state pools store rows (model/state_layout.h): compact in reference numerics on a backend that
  // reads compact rows (Backend::compact_state_rows()) when the config's dims fit the formats, else f32 (dense
  // numerics: rows are not quantization-simulated, so compact storage would be lossy).
  RowFormat state_rows() const;
  // The state layout of this model's pools.
  StateLayout state_layout(bool with_drafter = false) const {
    return StateLayout::of(cfg_, with_drafter, state_rows());
  }
  // A fresh sequence state on this model's backend (rows as state_rows()).
  SequenceState fresh_state() const { return SequenceState::fresh(cfg_, *be_, state_rows()); }
  // A state pool for many sequences on this model's backend (model/state_pool.h), rows as state_rows() (o.rows is
  // replaced).
  StatePool make_pool(const StatePoolOptions& o) const {
    StatePoolOptions p = o;
    p.rows = state_rows();
    return StatePool(cfg_, *be_, p);
  }

  // Receives the next-token logits (fp32, n_vocab, host memory) after position `pos`.
  using LogitsSink = std::function<void(int64_t pos, std::span<const float> logits)>;
  // Run `tokens` at positions st.n_past ... (split into ubatches of <= options().ubatch tokens), advancing `st`.
  // want_logits(pos) (may be empty: none) selects the positions whose logits are computed and passed to `sink`.
  // The result is independent of how a sequence is split into forward() calls. Forward steps of one model are
  // serialized (the backend's workspace is shared). Throws dsv4::Error on out-of-range ids, context overflow, or
  // non-finite logits.
  void forward(SequenceState& st, std::span<const int32_t> tokens, const std::function<bool(int64_t)>& want_logits,
               const LogitsSink& sink) const;

  // One batched step (model/batch.h): every sequence of `batch` advances by its tokens in `pool` (split into ubatches
  // of <= options().ubatch tokens); the wanted logits go to `sink`, and the requested snapshots are taken. Sequence
  // positions are not tracked here: the caller owns which slot holds how many positions. Throws dsv4::Error on an
  // invalid batch (out-of-range ids, slots, pages or snapshots, a slot twice, context overflow); non-finite logits
  // are reported to the sink, not thrown.
  void forward(const Batch& batch, StatePool& pool, const BatchLogitsSink& sink) const;

  // ---- speculative decoding (model/speculation.h) --------------------------------------------------------------
  // The drafter made resident (ModelOptions::drafter): none, the MTP module or the DSpark drafter.
  StateLayout::Drafter drafter() const { return drafter_; }
  bool has_drafter() const { return drafter_ != StateLayout::Drafter::none; }
  // Draft tokens per verify step at most with the resident drafter (MTP: 4; DSpark: its block size; none: 0).
  int max_draft() const;
  // Whether a checkpoint of config `cfg` can draft k tokens per step (k = 0: whether it has a drafter at all):
  // throws dsv4::UsageError (one line naming `flag` as the option the user typed: "--spec-draft", bench spec's
  // "--draft") when it has no drafter or its drafter makes fewer. init checks ModelOptions::spec_draft with it, before
  // anything is read; the CLI before it loads the model.
  static void check_draft(const ModelConfig& cfg, int k, std::string_view flag = "--spec-draft");
  // Drop the last n - keep positions of verify steps (BatchSeq::spec) again: exactly the state of a run that never
  // had them (rings, compressor frontiers, drafter rings). Throws dsv4::Error on invalid arguments.
  void rollback(std::span<const SpecRollback> seqs, StatePool& pool) const;
  // Draft tokens with the resident drafter (model/speculation.h). confidence (optional; DSpark only, left empty with
  // the MTP module): per sequence the confidence head's estimate of each draft (docs/dspark.md step 8).
  void draft(std::span<const DraftSeq> seqs, StatePool& pool, const DraftSink& sink,
             std::vector<std::vector<float>>* confidence = nullptr) const;

  // Convenience: fresh-state prefill returning the logits of every position ([n, n_vocab]).
  std::vector<float> logits_all(std::span<const int32_t> tokens) const;

  // Bytes of device memory the resident weights take on the model's backend (0 on the CPU: mapped).
  size_t resident_bytes() const { return resident_bytes_; }
  // Weight bytes one decode step of one sequence reads (every dense / shared weight, top-k routed experts per MoE
  // layer, the embedding row and the head), as stored: the bandwidth figure's numerator (`dsv4 bench model`).
  // `outside_layers` (if given) receives the part outside the layers (head, embedding row, final mHC and norm).
  // batch > 1: a decode step of `batch` sequences, whose routed experts count as the expected number of distinct
  // experts of batch * k uniform picks, E (1 - (1 - k/E)^batch) per layer (every other weight is read once).
  uint64_t decode_weight_bytes(uint64_t* outside_layers = nullptr, int64_t batch = 1) const;
  // Multiply-add work of one prefill token through the layers' matrix products, as 2 x the weight elements it
  // passes (every linear of every layer, the mHC mix projections, the shared expert and num_experts_per_tok routed
  // experts per MoE layer): the numerator of `dsv4 bench model`'s prefill TFLOP/s. Attention scores and the head
  // (one row per prompt) are not counted. `outside_layers` receives the part outside the layers (hc_head).
  double matmul_flops_per_token(double* outside_layers = nullptr) const;
  // Ubatches run as lanes (forward.cpp: several sequences of small products, each group on a thread of its own) since
  // the model was loaded.
  int64_t lane_steps() const { return lane_steps_; }
  // Benchmarks: route every op through `ops` (a decorator of backend().ops(), e.g. ProfiledOps); nullptr: direct.
  void set_op_hook(const Ops* ops) { hook_ = ops; }
  // The recorded forward steps (CUDA graphs), or nullptr (CPU backend, ModelOptions::cuda_graphs off).
  const StepGraphs* step_graphs() const { return graphs_.get(); }

  // ---- routed experts split between the device and the CPU (model/expert_placement.h, model/split_moe.h) -------
  const ExpertPlacement& placement() const { return placement_; }
  // Of decode_weight_bytes(nullptr, batch): the routed-expert bytes the CPU reads (experts in host memory).
  uint64_t host_decode_weight_bytes(int64_t batch = 1) const;
  // Host bytes of the routed experts placed on the CPU.
  uint64_t host_expert_bytes() const { return host_expert_bytes_; }
  // Totals of the split layers since the last reset (PCIe bytes, host compute time); all zero without a split.
  SplitMoeStats split_stats() const;
  void reset_split_stats() const;
  // The split layers' runner (null without experts on the CPU): its staging threshold and buffers.
  const SplitMoe* split_moe() const { return split_.get(); }
  // Profiling (`dsv4 profile-experts`): called after the router of every main layer with the host copy of its
  // expert ids [n, k]; empty: none. Not thread-safe with forward steps running.
  using RouteObserver = std::function<void(int layer, const int32_t* ids, int64_t n, int64_t k)>;
  void set_route_observer(RouteObserver f) { route_observer_ = std::move(f); }

 private:
  Model() = default;
  static std::unique_ptr<Model> init(const ModelOptions& opts, ModelConfig cfg);
  void make_resident();
  const float* upload_f32(const WeightRef& w, size_t expect, const char* what, int layer);
  // The state one compressor reads and writes in the pool.
  struct CompressorPools {
    int ratio = 0, coff = 1;
    int64_t c = 0;                               // pooled row width
    float *k = nullptr, *s = nullptr;            // frontiers [n_slots * coff*ratio, coff*c]
    float* rows = nullptr;                       // compressed rows / indexer keys [n_pages * rpp, stored.words()]
    RowCodec stored;                             // how `rows` are stored (f32 [c] or compact)
    float *snap_k = nullptr, *snap_s = nullptr;  // snapshot frontier rows [n_snapshots * ratio, coff*c] (ratio 4)
    float *spec_k = nullptr, *spec_s = nullptr;  // speculation rows (pools with the MTP layer)
  };
  void validate(const Batch& batch, const StatePool& pool) const;
  void forward_ubatch(const StepPlan& plan, StatePool& pool, const BatchLogitsSink& sink) const;
  // The CPU's lanes for the pieces of one ubatch (forward.cpp): how many (1: none), and the step run as lanes.
  int lane_count(const std::vector<PlanPiece>& pieces, const StatePool& pool) const;
  void forward_lanes(std::vector<PlanPiece> pieces, int n_lanes, StatePool& pool, const BatchLogitsSink& sink) const;
  // §5.8 the head for rows rows[0, nl) of X [n, hc, D] (device indices), nl = seq.size(); sink(seq[i], pos[i], ...).
  void head_rows(const float* X, int64_t n, const int32_t* rows, std::span<const size_t> seq,
                 std::span<const int64_t> pos, const BatchLogitsSink& sink) const;
  void block(int layer, StatePool& pool, const StepPlan& plan, const DevicePlan& dp, float* X) const;
  void attention(int layer, StatePool& pool, const StepPlan& plan, const DevicePlan& dp, const float* x,
                 float* out) const;
  // Pieces of attention (attention.cpp), shared with the DSpark stages (dspark.cpp). cs: [n, rd] RoPE of the rows.
  // The two projections of x [n, D] (one Ops::linear_pair): the query's latent qr = wq_a x [n, q_lora] and the
  // window rows' kv = wkv x [n, Dh], as attn_query and window_rows take them.
  void attn_project(const LayerResident& lp, const float* x, int64_t n, float* qr, float* kv) const;
  // The query q [n, H, Dh] of qr = wq_a x (normalized in place: the latent the indexer reads).
  void attn_query(const LayerResident& lp, float* qr, int64_t n, const float* cs, float* q) const;
  // Window rows from kv = wkv x (in place): kv [n, Dh] (fp32, FP8-simulated in reference numerics) and, with compact
  // state rows, their stored form kv_st [n, KW] (else kv_st == kv). ring (fp32 rows only): also the ring update
  // (rows ring_src of kv -> ring rows ring_dst, n_ring of them) in the same op.
  void window_rows(const LayerResident& lp, float* kv, int64_t n, const float* cs, const RowCodec& kc, float* kv_st,
                   float* ring = nullptr, const int32_t* ring_src = nullptr, const int32_t* ring_dst = nullptr,
                   int64_t n_ring = 0) const;
  // The step's snapshots of layer l's ring, the verify steps' backups and the ring update with the rows kv_st (unless
  // ring_done: window_rows made it).
  void store_window(int layer, StatePool& pool, const StepPlan& plan, const DevicePlan& dp, const float* kv_st,
                    bool ring_done = false) const;
  // Inverse RoPE on the attention output o [n, H, Dh] (in place; unless rope_done: sparse_attention_rope did it),
  // grouped wo_a, wo_b -> out [n, D].
  void attn_output(const LayerResident& lp, float* o, int64_t n, const float* cs, const int32_t* group_fwd,
                   const int32_t* group_back, float* out, bool rope_done = false) const;
  // Runs one compressor over x [n, D]: the emitted rows go to their pool rows, snapshots take their frontier rows,
  // and the frontiers of the step's slots advance.
  void compressor(const CompressorResident& w, const CompressorPools& cp, const StepPlan& plan, const DevicePlan& dp,
                  const float* x, bool indexer) const;
  void indexer(int layer, StatePool& pool, const StepPlan& plan, const DevicePlan& dp, const float* x,
               const float* qr, int32_t* sel) const;
  void moe(int layer, const DevicePlan& dp, int64_t n, const float* x, float* out) const;
  // The route observer (set_route_observer) of layer l's ids [n, k] (device), when one is set.
  void observe_route(int layer, const int32_t* ids, int64_t n, int64_t k) const;
  // §5.8 logits [n, vocab] of the streams X [n, hc, D]; bad[t] = 1 where row t holds a NaN or inf, else 0.
  void head(const float* X, int64_t n, float* logits, int32_t* bad) const;
  // MTP (mtp.cpp): the block input e_proj(enorm(embed[next])) + h_proj(hnorm(H)) of H [n, hc, D] into Xm, and the
  // MTP head's logits of its block output X [n, hc, D].
  void mtp_input(const float* H, const int32_t* next, const int32_t* hc_rows, int64_t n, float* Xm) const;
  void mtp_head(const float* X, int64_t n, float* logits) const;
  void mtp_draft(std::span<const DraftSeq> seqs, StatePool& pool, const DraftSink& sink) const;
  // DSpark (dspark.cpp, docs/dspark.md): the mean of the streams X [n, HC, D] of target layer i into its columns of
  // the concatenated target hiddens MH [n, T*D]; the context rows of every stage ring from MH (forward steps); the
  // block draft.
  void dspark_capture(const StepPlan& plan, const DevicePlan& dp, const float* X, int i, float* MH) const;
  void dspark_context(StatePool& pool, const StepPlan& plan, const DevicePlan& dp, const float* MH) const;
  void dspark_draft(std::span<const DraftSeq> seqs, StatePool& pool, const DraftSink& sink,
                    std::vector<std::vector<float>>* confidence) const;
  void bind_layer(const LayerWeights& lw, int l, LayerResident& p);
  // Sets placement_ from opts_.placement: non_expert = device bytes of every weight but the main layers' routed
  // experts, expert = device bytes of one routed expert.
  void place_experts(uint64_t non_expert, uint64_t expert);
  // The split layers' options from opts_.placement (staging threshold and slots).
  SplitMoeOptions split_options() const;

  bool bf16() const { return opts_.numerics == Numerics::reference; }
  LinearOpts qopts() const { return quantized_linear_opts(opts_.numerics); }
  // The fp32 products of a BF16 weight with this numerics' activations (the head, the router gate, the compressors'
  // wkv / wgate): in reference numerics those activations are bf16 values (LinearOpts::x_bf16).
  LinearOpts bf16_weight_opts() const {
    LinearOpts o;
    o.x_bf16 = bf16();
    return o;
  }
  const Ops& ops() const { return hook_ ? *hook_ : be_->ops(); }

  ModelConfig cfg_;
  ModelOptions opts_;
  std::unique_ptr<Backend> owned_be_;
  Backend* be_ = nullptr;
  std::unique_ptr<SafetensorsSet> set_;
  std::unique_ptr<struct DummyCheckpoint> dummy_;  // dummy weights (load_dummy), else null
  ModelWeights w_;                     // host binding (the mapped checkpoint)
  std::vector<Buffer> params_;         // device copies of the small tensors and tables
  std::vector<LayerResident> lr_;
  WeightView embed_, head_;
  const float *norm_ = nullptr, *hc_head_fn_ = nullptr, *hc_head_base_ = nullptr, *hc_head_scale_ = nullptr;
  MtpResident mtp_;
  DsparkResident dspark_;
  StateLayout::Drafter drafter_ = StateLayout::Drafter::none;
  int draft_layer_ = -1;               // index of the drafter's first block in lr_ (= num_hidden_layers) when resident
  RopeCache rope_plain_, rope_yarn_;  // RoPE rows of ratio-0 and of compressed layers, kept per position
  size_t resident_bytes_ = 0;
  const Ops* hook_ = nullptr;
  ExpertPlacement placement_;
  uint64_t host_expert_bytes_ = 0;
  std::unique_ptr<SplitMoe> split_;    // staging of the split layers (when any)
  RouteObserver route_observer_;
  mutable std::vector<int32_t> route_host_;
  mutable std::mutex mu_;              // one forward step at a time (shared workspace)
  mutable std::unique_ptr<StepGraphs> graphs_;  // recorded steps (null: eager); destroyed before owned_be_
  mutable std::vector<float> logits_host_;
  mutable std::vector<int32_t> bad_host_;
  mutable std::vector<uint8_t> plan_staging_;  // forward_ubatch's packed step plan (DevicePlan::upload), kept
  mutable StepPlan plan_;  // forward()'s step plan, rebuilt in place for each ubatch (its arrays' capacity kept)
  mutable std::atomic<int64_t> lane_steps_{0};
  int64_t largest_layer_product_ = 0;  // elements of the largest matrix of a main layer (lanes' rule)
  uint64_t layer_weight_bytes_ = 0;    // bytes of every main layer's weights, all experts (lanes' rule)
};

}  // namespace dsv4
