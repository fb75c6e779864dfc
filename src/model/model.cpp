// Model loading: config, weight binding, fp32 copies of the small tensors, RoPE tables (spec §2, §3).
#include "model/model.h"

#include <omp.h>

#include "core/error.h"
#include "core/log.h"
#include "model/sequence.h"

namespace dsv4 {

namespace {
std::vector<float> f32(const WeightRef& w) { return w.bound() ? dequant_all(w) : std::vector<float>{}; }

void need_len(const std::vector<float>& v, size_t n, const char* what, int layer) {
  if (v.size() != n) fail("layer {}: {} has {} elements, expected {}", layer, what, v.size(), n);
}
}  // namespace

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const ModelOptions& opts) {
  std::unique_ptr<Model> m(new Model());
  m->opts_ = opts;
  if (m->opts_.ubatch < 1) fail("ubatch must be >= 1 (got {})", m->opts_.ubatch);
  m->ops_ = opts.ops ? opts.ops : &cpu_ops();
  if (opts.n_threads < 0) fail("n_threads must be >= 0 (got {})", opts.n_threads);
  if (opts.n_threads > 0) omp_set_num_threads(opts.n_threads);
  m->cfg_ = load_config(dir / "config.json");
  const ModelConfig& c = m->cfg_;
  if (c.scoring_func != "sqrtsoftplus") fail("{}: scoring_func '{}' is not supported (sqrtsoftplus)", c.origin, c.scoring_func);
  if (c.num_key_value_heads != 1) fail("{}: num_key_value_heads must be 1", c.origin);
  if (c.hidden_act != "silu") fail("{}: hidden_act '{}' is not supported (silu)", c.origin, c.hidden_act);
  for (int l = 0; l < c.num_hidden_layers; ++l)
    if (c.compress_ratio(l) == 4 && (c.index_head_dim & (c.index_head_dim - 1)) != 0)
      fail("{}: index_head_dim {} must be a power of two (Hadamard)", c.origin, c.index_head_dim);
  m->set_ = std::make_unique<SafetensorsSet>(SafetensorsSet::open(dir));
  m->w_ = bind_weights(*m->set_, c);
  const int64_t D = c.hidden_size, HC = c.hc_mult;
  m->lp_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& lw = m->w_.layers[size_t(l)];
    LayerParams& p = m->lp_[size_t(l)];
    p.ratio = c.compress_ratio(l);
    p.hash = c.is_hash_layer(l);
    p.hc_attn_fn = f32(lw.hc_attn_fn);
    p.hc_attn_base = f32(lw.hc_attn_base);
    p.hc_attn_scale = f32(lw.hc_attn_scale);
    p.hc_ffn_fn = f32(lw.hc_ffn_fn);
    p.hc_ffn_base = f32(lw.hc_ffn_base);
    p.hc_ffn_scale = f32(lw.hc_ffn_scale);
    need_len(p.hc_attn_fn, size_t(c.hc_mix_dim() * HC * D), "hc_attn_fn", l);
    need_len(p.hc_ffn_fn, size_t(c.hc_mix_dim() * HC * D), "hc_ffn_fn", l);
    need_len(p.hc_attn_scale, 3, "hc_attn_scale", l);
    need_len(p.hc_ffn_scale, 3, "hc_ffn_scale", l);
    p.attn_norm = f32(lw.attn_norm);
    p.ffn_norm = f32(lw.ffn_norm);
    p.q_norm = f32(lw.attn.q_norm);
    p.kv_norm = f32(lw.attn.kv_norm);
    p.attn_sink = f32(lw.attn.attn_sink);
    need_len(p.attn_sink, size_t(c.num_attention_heads), "attn_sink", l);
    if (p.ratio > 0) {
      p.cmp.ape = f32(lw.attn.compressor.ape);
      p.cmp.norm = f32(lw.attn.compressor.norm);
      need_len(p.cmp.ape, size_t(p.ratio) * size_t(ModelConfig::compressor_coff(p.ratio) * c.head_dim),
               "compressor.ape", l);
    }
    if (p.ratio == 4) {
      p.idx_cmp.ape = f32(lw.attn.indexer.compressor.ape);
      p.idx_cmp.norm = f32(lw.attn.indexer.compressor.norm);
      need_len(p.idx_cmp.ape, size_t(4 * 2 * c.index_head_dim), "indexer.compressor.ape", l);
    }
    if (p.hash) {
      const WeightRef& t = lw.ffn.tid2eid;
      if (!t.bound()) fail("layer {}: hash layer without ffn.gate.tid2eid", l);
      p.tid2eid.resize(static_cast<size_t>(t.rows * t.cols));
      for (int64_t r = 0; r < t.rows; ++r)
        for (int64_t k = 0; k < t.cols; ++k) {
          const int64_t e = read_int(t, r, k);
          if (e < 0 || e >= c.n_routed_experts)
            fail("layer {}: ffn.gate.tid2eid[{}][{}] = {} is not an expert id", l, r, k, e);
          p.tid2eid[size_t(r * t.cols + k)] = int32_t(e);
        }
    } else {
      p.gate_bias = f32(lw.ffn.gate_bias);
    }
  }
  m->norm_ = f32(m->w_.norm);
  m->hc_head_fn_ = f32(m->w_.hc_head_fn);
  m->hc_head_base_ = f32(m->w_.hc_head_base);
  m->hc_head_scale_ = f32(m->w_.hc_head_scale);
  m->rope_plain_ = RopeTable::for_ratio(c, 0);
  m->rope_yarn_ = RopeTable::for_ratio(c, 4);
  log::info("loaded {}: {} layers, hidden {}, vocab {}, numerics {}", dir.string(), c.num_hidden_layers, D,
            c.vocab_size, numerics_name(opts.numerics));
  return m;
}

std::unique_ptr<LmSequence> Model::new_sequence() const { return std::make_unique<ModelSequence>(*this); }

}  // namespace dsv4
