// Binding of the checkpoint tensors (official HF names, spec §3) to their roles in the V4 forward pass, with dtype
// and shape checks against the ModelConfig. bind_weights() fails with one dsv4::Error line that lists the first few
// missing / unexpected / mis-typed tensors by name.
//
// Accepted storage per role (logical shape [rows = out, cols = in]; a 1-D tensor of n elements is rows = 1, cols = n):
//   FP8 linear     F8_E4M3 [rows, cols] + `.scale` F8_E8M0 or F32 [ceil(rows/br), ceil(cols/bc)]
//                  (br x bc = quantization_config.weight_block_size, 128x128)   -> WeightFormat::FP8_BLOCK128
//                  or BF16 / F32 [rows, cols] without scale (dequantized checkpoints, test models)
//   FP4 expert     I8 [rows, cols/2] (low nibble = even element) + `.scale` F8_E8M0 [rows, cols/32]
//                                                                               -> WeightFormat::FP4_BLOCK32
//                  or anything an FP8 linear accepts (Flash-Base FP8 experts, §10.2)
//   BF16 tensor    BF16 (norms, embed/head, router gate, compressor wkv/wgate, weights_proj) or F32
//   F32 tensor     F32 (hc_*, attn_sink, ape, gate.bias) or BF16
//   tid2eid        I64 or I32 [vocab, num_experts_per_tok]                       -> WeightFormat::I64 / I32
// The WeightRefs point into the SafetensorsSet, which must outlive the ModelWeights.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "loader/config.h"
#include "loader/safetensors.h"

namespace dsv4 {

enum class WeightFormat {
  BF16,          // w: BF16 [rows, cols]
  F32,           // w: F32 [rows, cols]
  FP8_BLOCK128,  // w: F8_E4M3 [rows, cols]; scale: F8_E8M0 or F32 [ceil(rows/block_rows), ceil(cols/block_cols)]
  FP4_BLOCK32,   // w: I8 [rows, cols/2] packed E2M1 pairs; scale: F8_E8M0 [rows, cols/32] (block_rows=1, block_cols=32)
  I64,           // w: I64 [rows, cols] (tid2eid)
  I32,           // w: I32 [rows, cols] (tid2eid)
};
const char* weight_format_name(WeightFormat f);  // "bf16", "f32", "fp8_block128", "fp4_block32", "i64", "i32"

// One bound weight. Dequantized value (spec §3.6):
//   FP8: W[r,c] = e4m3(w[r,c]) * scale[r/block_rows, c/block_cols]   (E8M0 scale decoded bitwise: 2^(e-127))
//   FP4: W[r,c] = e2m1(nibble(r,c)) * scale[r, c/32],  nibble(r, 2j) = w[r,j] & 0xF, nibble(r, 2j+1) = w[r,j] >> 4
struct WeightRef {
  const TensorInfo* w = nullptr;
  const TensorInfo* scale = nullptr;   // FP8 / FP4 only
  WeightFormat fmt = WeightFormat::BF16;
  int64_t rows = 0, cols = 0;          // logical [out, in]
  int64_t block_rows = 0, block_cols = 0;  // scale block (FP8: 128 x 128, FP4: 1 x 32), 0 otherwise
  DType scale_dtype = DType::F8_E8M0;  // F8_E8M0 or F32 (FP8 only may be F32)

  bool bound() const { return w != nullptr; }
  // Row stride of `w` in bytes (cols * elem size; cols/2 for FP4).
  uint64_t row_bytes() const;
  // Number of logical elements / parameters (rows * cols).
  int64_t numel() const { return rows * cols; }
};

struct CompressorWeights {     // attn.compressor (c = head_dim) or attn.indexer.compressor (c = index_head_dim)
  WeightRef ape;               // F32 [ratio, coff*c]
  WeightRef wkv;               // BF16 [coff*c, D]
  WeightRef wgate;             // BF16 [coff*c, D]
  WeightRef norm;              // BF16 [c]
};

struct IndexerWeights {        // ratio-4 layers only (spec §3.3, §5.6)
  WeightRef wq_b;              // FP8 [IH*IDh, q_lora_rank]
  WeightRef weights_proj;      // BF16 [IH, D]
  CompressorWeights compressor;  // c = IDh, ratio 4 (overlapping)
};

struct AttentionWeights {      // spec §3.2 / §5.4
  WeightRef wq_a;              // FP8 [q_lora_rank, D]
  WeightRef q_norm;            // BF16 [q_lora_rank]
  WeightRef wq_b;              // FP8 [H*Dh, q_lora_rank], out index = h*Dh + d
  WeightRef wkv;               // FP8 [Dh, D]
  WeightRef kv_norm;           // BF16 [Dh]
  WeightRef wo_a;              // FP8 [G*o_lora_rank, (H/G)*Dh], viewed [G, o_lora_rank, (H/G)*Dh]
  WeightRef wo_b;              // FP8 [D, G*o_lora_rank]
  WeightRef attn_sink;         // F32 [H]
  bool has_compressor = false; // compress_ratio > 0
  CompressorWeights compressor;
  bool has_indexer = false;    // compress_ratio == 4
  IndexerWeights indexer;
};

struct ExpertWeights {         // SwiGLU expert: w2( silu(w1 x) * (w3 x) )
  WeightRef w1;                // [inter, D]  gate proj
  WeightRef w2;                // [D, inter]  down proj
  WeightRef w3;                // [inter, D]  up proj
};

struct FfnWeights {            // spec §3.2 / §5.7
  WeightRef gate;              // BF16 [E, D] router logits (hash layers use it for the weights too)
  WeightRef gate_bias;         // F32 [E], non-hash layers only
  WeightRef tid2eid;           // I64/I32 [vocab, top-k], hash layers only
  ExpertWeights shared;        // [n_shared*inter, D] / [D, n_shared*inter], FP8
  std::vector<ExpertWeights> experts;  // E routed experts, FP4 (or FP8)
};

struct LayerWeights {          // `layers.L.` or `mtp.K.` (the MTP block part, a DSpark stage)
  int layer = 0;               // index into ModelConfig::compress_ratios
  int compress_ratio = 0;
  bool hash = false;
  WeightRef hc_attn_fn, hc_attn_base, hc_attn_scale;  // F32 [(2+HC)*HC, HC*D] / [(2+HC)*HC] / [3]
  WeightRef hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  WeightRef attn_norm, ffn_norm;                      // BF16 [D]
  AttentionWeights attn;
  FfnWeights ffn;
};

struct MtpWeights {            // `mtp.K.` (spec §3.5); shares embed / head with the main model
  LayerWeights block;          // ratio compress_ratios[num_hidden_layers + K] (0), never hash-routed
  WeightRef e_proj, h_proj;    // FP8 [D, D]
  WeightRef enorm, hnorm, norm;  // BF16 [D]
  WeightRef hc_head_fn, hc_head_base, hc_head_scale;  // F32 [HC, HC*D] / [HC] / [1]
};

struct DsparkWeights {         // the DSpark drafter: `mtp.K.` stages + stage 0 / last-stage extras (docs/dspark.md)
  std::vector<LayerWeights> stages;  // n_stages window-only (ratio 0), never hash-routed blocks
  WeightRef main_proj;         // mtp.0: FP8 [D, T*D] (T = target layers), or BF16 / F32
  WeightRef main_norm;         // mtp.0: BF16 [D]
  WeightRef norm;              // last stage: BF16 [D]
  WeightRef hc_head_fn, hc_head_base, hc_head_scale;  // last stage: F32 [HC, HC*D] / [HC] / [1]
  WeightRef markov_w1;         // last stage: BF16 or F32 [vocab, r] (embedding of the previous token)
  WeightRef markov_w2;         // last stage: BF16 or F32 [vocab, r] (rank r -> vocab bias)
  WeightRef confidence;        // last stage: BF16 or F32 [1, D + r] (confidence_head.proj, no bias)
  bool bound() const { return !stages.empty(); }
};

struct ModelWeights {
  WeightRef embed;             // BF16 [vocab, D]
  WeightRef head;              // BF16 [vocab, D]
  WeightRef norm;              // BF16 [D]
  WeightRef hc_head_fn, hc_head_base, hc_head_scale;  // F32 [HC, HC*D] / [HC] / [1]
  std::vector<LayerWeights> layers;  // num_hidden_layers
  std::vector<MtpWeights> mtp;       // num_mtp_layers(), or empty when the checkpoint has no mtp.* tensors at all
  DsparkWeights dspark;              // config.dspark.present and the checkpoint has mtp.* tensors, else unbound
};

// Bind and check every tensor of the checkpoint (also: every tid2eid entry is a valid expert id).
// Throws one dsv4::Error line listing (up to 5 of each) missing tensors, dtype/shape mismatches and unexpected
// tensors, e.g. "DIR: checkpoint does not match DIR/config.json: 1 missing tensor(s): layers.3.attn.wkv.weight;
// 1 wrong dtype/shape: layers.0.attn.wq_a.scale (model-00002-of-00046.safetensors) is F8_E8M0 [8, 31], expected
// F8_E8M0|F32 [8, 32]; 1 unexpected tensor(s): layers.0.attn.bogus (model-00002-of-00046.safetensors)".
ModelWeights bind_weights(const SafetensorsSet& set, const ModelConfig& cfg);

// Visit every bound WeightRef (global, layers, MTP, DSpark drafter) once. Scales are reached through WeightRef::scale.
void for_each_weight(const ModelWeights& w, const std::function<void(const WeightRef&)>& fn);

// ---- slow reference accessors (tests, oracles, one-off conversions; the fast kernels live in src/backend) ------
// Dequantized element W[r, c] as float (exact for every format; I64/I32 return the integer as float).
float dequant(const WeightRef& w, int64_t r, int64_t c);
// Dequantize row r into out (size cols); a tight per-format loop (fine for embedding rows, not for GEMMs).
void dequant_row(const WeightRef& w, int64_t r, std::span<float> out);
// Whole tensor as float [rows * cols] (small tensors: norms, biases, hc, ape ...).
std::vector<float> dequant_all(const WeightRef& w);
// Integer element of an I64/I32 weight (tid2eid). Throws dsv4::Error for other formats.
int64_t read_int(const WeightRef& w, int64_t r, int64_t c);

}  // namespace dsv4
