// dsv4::Model: a DeepSeek V4 checkpoint (any V4-family config: tiny test models, Flash, Pro) loaded for inference on
// the op interface of src/backend/ops.h, implementing the engine contract (language_model.h).
//
// Forward pass: spec §5 (embedding, 4-stream hyper-connections, attention with window + compressed KV + indexer, MoE,
// head). Numerics (ONE switch, backend/numerics.h): `reference` reproduces every quantization point of the official
// implementation (§8), `dense` is fp32 with exactly dequantized weights (what HF transformers computes).
// Results are independent of how a sequence is split into append() calls (any chunking, decode) and of the thread
// count: every op is per-row/per-token with fixed reduction orders and visibility is position based (§5.4-4, §5.10).
//
// Memory: mapped weights + small fp32 copies of norms / hc / ape / sinks / biases + per-sequence state
// (sequence_state.h) + scratch bounded by the ubatch size (long prefills are split into ubatches).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/numerics.h"
#include "backend/ops.h"
#include "loader/config.h"
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "model/language_model.h"
#include "model/rope.h"
#include "model/sequence_state.h"

namespace dsv4 {

struct ModelOptions {
  Numerics numerics = Numerics::reference;
  int64_t ubatch = 256;            // max tokens per forward step inside one append (bounds scratch memory)
  const Ops* ops = nullptr;        // nullptr: cpu_ops()
  int n_threads = 0;               // > 0: omp_set_num_threads(n_threads) at load (process-wide); 0: OpenMP default
};

// fp32 copies of the small per-layer tensors (read many times, tiny next to the GEMM weights).
struct CompressorParams {
  std::vector<float> ape;          // [ratio, coff*c]
  std::vector<float> norm;         // [c]
};
struct LayerParams {
  int ratio = 0;
  bool hash = false;
  std::vector<float> hc_attn_fn, hc_attn_base, hc_attn_scale;
  std::vector<float> hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  std::vector<float> attn_norm, ffn_norm, q_norm, kv_norm, attn_sink;
  CompressorParams cmp, idx_cmp;
  std::vector<float> gate_bias;    // [E] (non-hash layers)
  std::vector<int32_t> tid2eid;    // [vocab, top-k] (hash layers)
};

class Model final : public LanguageModel {
 public:
  // Open `dir` (config.json + safetensors), bind and check every tensor. Throws dsv4::Error.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, const ModelOptions& opts = {});
  ~Model() override;

  const ModelConfig& config() const { return cfg_; }
  Numerics numerics() const { return opts_.numerics; }
  const ModelOptions& options() const { return opts_; }

  // LanguageModel
  int32_t n_vocab() const override { return int32_t(cfg_.vocab_size); }
  int32_t bos_id() const override { return int32_t(cfg_.bos_token_id); }
  int32_t eos_id() const override { return int32_t(cfg_.eos_token_id); }
  int64_t max_context() const override { return cfg_.max_position_embeddings; }
  std::unique_ptr<LmSequence> new_sequence() const override;

  // Receives the next-token logits (fp32, n_vocab) after position `pos`.
  using LogitsSink = std::function<void(int64_t pos, std::span<const float> logits)>;
  // Run `tokens` at positions st.n_past ... (split into ubatches of <= options().ubatch tokens), advancing `st`.
  // want_logits(pos) (may be empty: none) selects the positions whose logits are computed and passed to `sink`.
  // The result is independent of how a sequence is split into forward() calls.
  // Throws dsv4::Error on out-of-range ids, context overflow, or non-finite logits.
  void forward(SequenceState& st, std::span<const int32_t> tokens, const std::function<bool(int64_t)>& want_logits,
               const LogitsSink& sink) const;

  // Convenience: fresh-state prefill returning the logits of every position ([n, n_vocab]).
  std::vector<float> logits_all(std::span<const int32_t> tokens) const;

 private:
  Model() = default;
  void forward_ubatch(SequenceState& st, std::span<const int32_t> tokens, const std::vector<char>& want,
                      const LogitsSink& sink) const;
  void block(int layer, SequenceState& st, std::span<const int32_t> tokens, std::span<const int64_t> pos,
             std::vector<float>& X) const;
  void attention(int layer, LayerState& ls, std::span<const int64_t> pos, const float* x, float* out) const;
  // Runs one compressor over x [n, D] at positions pos, appending pooled rows to `rows` (width c).
  void compressor(const CompressorWeights& w, const CompressorParams& p, CompressorState& cs,
                  std::span<const int64_t> pos, const float* x, bool indexer, const RopeTable& rope,
                  std::vector<float>& rows) const;
  void indexer(int layer, LayerState& ls, std::span<const int64_t> pos, const float* x, const float* qr,
               std::vector<int32_t>& sel) const;
  void moe(int layer, std::span<const int32_t> tokens, const float* x, float* out) const;
  void head(const float* X, int64_t n, float* logits_row_major) const;

  bool bf16() const { return opts_.numerics == Numerics::reference; }
  LinearOpts qopts() const { return quantized_linear_opts(opts_.numerics); }

  ModelConfig cfg_;
  ModelOptions opts_;
  const Ops* ops_ = nullptr;
  std::unique_ptr<SafetensorsSet> set_;
  ModelWeights w_;
  std::vector<LayerParams> lp_;
  std::vector<float> norm_, hc_head_fn_, hc_head_base_, hc_head_scale_;
  RopeTable rope_plain_, rope_yarn_;
};

}  // namespace dsv4
