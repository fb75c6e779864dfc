#include "loader/weights.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "format/numeric.h"

namespace dsv4 {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::F32: return "f32";
    case WeightFormat::FP8_BLOCK128: return "fp8_block128";
    case WeightFormat::FP4_BLOCK32: return "fp4_block32";
    case WeightFormat::I64: return "i64";
    case WeightFormat::I32: return "i32";
  }
  return "?";
}

uint64_t WeightRef::row_bytes() const {
  switch (fmt) {
    case WeightFormat::FP4_BLOCK32: return uint64_t(cols) / 2;
    case WeightFormat::FP8_BLOCK128: return uint64_t(cols);
    case WeightFormat::BF16: return uint64_t(cols) * 2;
    case WeightFormat::F32:
    case WeightFormat::I32: return uint64_t(cols) * 4;
    case WeightFormat::I64: return uint64_t(cols) * 8;
  }
  return 0;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Collects every problem, then reports them together in one line.
class Binder {
 public:
  Binder(const SafetensorsSet& set, const ModelConfig& cfg) : set_(set), cfg_(cfg), used_(set.tensors().size(), false) {}

  // Expected logical shape: {n} for a vector (rows = 1, cols = n) or {rows, cols}.
  WeightRef plain(const std::string& name, std::vector<int64_t> shape, std::initializer_list<DType> ok) {
    WeightRef r;
    const TensorInfo* t = take(name);
    set_logical(r, shape);
    if (!t) return r;
    bool dt_ok = false;
    for (DType d : ok) dt_ok |= t->dtype == d;
    if (!dt_ok) return wrong(name, *t, ok, shape), r;
    if (t->shape != shape) return wrong(name, *t, ok, shape), r;
    r.w = t;
    r.fmt = t->dtype == DType::BF16 ? WeightFormat::BF16 : t->dtype == DType::F32 ? WeightFormat::F32
            : t->dtype == DType::I64 ? WeightFormat::I64 : WeightFormat::I32;
    return r;
  }
  WeightRef bf16(const std::string& name, std::vector<int64_t> shape) {
    return plain(name, std::move(shape), {DType::BF16, DType::F32});
  }
  WeightRef f32(const std::string& name, std::vector<int64_t> shape) {
    return plain(name, std::move(shape), {DType::F32, DType::BF16});
  }

  // `prefix`.weight (+ `prefix`.scale): FP8 block-128 linear, or BF16/F32 dequantized.
  WeightRef fp8(const std::string& prefix, int64_t rows, int64_t cols) {
    const std::string wn = prefix + ".weight";
    WeightRef r;
    r.rows = rows;
    r.cols = cols;
    const TensorInfo* t = take(wn);
    if (!t) return r;
    const std::vector<int64_t> shape{rows, cols};
    if (t->dtype == DType::BF16 || t->dtype == DType::F32) {
      if (t->shape != shape) return wrong(wn, *t, {DType::F8_E4M3, DType::BF16, DType::F32}, shape), r;
      r.w = t;
      r.fmt = t->dtype == DType::BF16 ? WeightFormat::BF16 : WeightFormat::F32;
      return r;
    }
    if (t->dtype != DType::F8_E4M3 || t->shape != shape)
      return wrong(wn, *t, {DType::F8_E4M3, DType::BF16, DType::F32}, shape), r;
    const int64_t br = cfg_.quantization.weight_block_rows, bc = cfg_.quantization.weight_block_cols;
    const std::vector<int64_t> sshape{ceil_div(rows, br), ceil_div(cols, bc)};
    const std::string sn = prefix + ".scale";
    const TensorInfo* s = take(sn);
    if (!s) return r;
    if ((s->dtype != DType::F8_E8M0 && s->dtype != DType::F32) || s->shape != sshape)
      return wrong(sn, *s, {DType::F8_E8M0, DType::F32}, sshape), r;
    r.w = t;
    r.scale = s;
    r.fmt = WeightFormat::FP8_BLOCK128;
    r.block_rows = br;
    r.block_cols = bc;
    r.scale_dtype = s->dtype;
    return r;
  }

  // Routed expert projection: FP4 (I8 packed + E8M0 per 32), or whatever fp8() accepts.
  WeightRef fp4(const std::string& prefix, int64_t rows, int64_t cols) {
    const std::string wn = prefix + ".weight";
    const TensorInfo* t = set_.find(wn);
    if (!t || t->dtype != DType::I8) return fp8(prefix, rows, cols);
    take(wn);
    WeightRef r;
    r.rows = rows;
    r.cols = cols;
    const std::vector<int64_t> shape{rows, cols / 2};
    if (cols % 32 != 0 || t->shape != shape) return wrong(wn, *t, {DType::I8}, shape), r;
    const std::vector<int64_t> sshape{rows, cols / 32};
    const std::string sn = prefix + ".scale";
    const TensorInfo* s = take(sn);
    if (!s) return r;
    if (s->dtype != DType::F8_E8M0 || s->shape != sshape) return wrong(sn, *s, {DType::F8_E8M0}, sshape), r;
    r.w = t;
    r.scale = s;
    r.fmt = WeightFormat::FP4_BLOCK32;
    r.block_rows = 1;
    r.block_cols = 32;
    r.scale_dtype = DType::F8_E8M0;
    return r;
  }

  bool any_with_prefix(const std::string& prefix) const {
    for (const auto& t : set_.tensors())
      if (t.name.rfind(prefix, 0) == 0) return true;
    return false;
  }

  void finish() const {
    std::vector<std::string> unexpected;
    for (size_t i = 0; i < used_.size(); ++i)
      if (!used_[i]) unexpected.push_back(set_.tensors()[i].name + " (" + set_.tensors()[i].file + ")");
    if (missing_.empty() && wrong_.empty() && unexpected.empty()) return;
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (size_t i = 0; i < v.size() && i < 5; ++i) s += (i ? ", " : "") + v[i];
      if (v.size() > 5) s += fmt::format(", ... (+{} more)", v.size() - 5);
      return s;
    };
    std::string msg = set_.dir().string() + ": checkpoint does not match " + cfg_.origin + ":";
    std::string sep = " ";
    if (!missing_.empty()) msg += sep + fmt::format("{} missing tensor(s): {}", missing_.size(), list(missing_)), sep = "; ";
    if (!wrong_.empty()) msg += sep + fmt::format("{} wrong dtype/shape: {}", wrong_.size(), list(wrong_)), sep = "; ";
    if (!unexpected.empty())
      msg += sep + fmt::format("{} unexpected tensor(s): {}", unexpected.size(), list(unexpected));
    throw Error(msg);
  }

 private:
  const TensorInfo* take(const std::string& name) {
    const TensorInfo* t = set_.find(name);
    if (!t) {
      missing_.push_back(name);
      return nullptr;
    }
    used_[static_cast<size_t>(t - set_.tensors().data())] = true;
    return t;
  }
  static void set_logical(WeightRef& r, const std::vector<int64_t>& shape) {
    r.rows = shape.size() == 2 ? shape[0] : 1;
    r.cols = shape.empty() ? 1 : shape.back();
  }
  void wrong(const std::string& name, const TensorInfo& t, std::initializer_list<DType> ok, const std::vector<int64_t>& shape) {
    std::string dts;
    for (DType d : ok) {
      if (!dts.empty()) dts += '|';
      dts += dtype_name(d);
    }
    wrong_.push_back(fmt::format("{} ({}) is {} {}, expected {} {}", name, t.file, dtype_name(t.dtype), t.shape_str(),
                                 dts, shape_str(shape)));
  }

  const SafetensorsSet& set_;
  const ModelConfig& cfg_;
  std::vector<bool> used_;
  std::vector<std::string> missing_, wrong_;
};

void bind_block(Binder& b, const ModelConfig& c, const std::string& p, int layer, bool hash, LayerWeights& L) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads, Dh = c.head_dim, HC = c.hc_mult;
  const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
  const int64_t mix = c.hc_mix_dim(), hcd = c.hc_dim();
  L.layer = layer;
  L.compress_ratio = c.compress_ratio(layer);
  L.hash = hash;
  L.hc_attn_fn = b.f32(p + "hc_attn_fn", {mix, hcd});
  L.hc_attn_base = b.f32(p + "hc_attn_base", {mix});
  L.hc_attn_scale = b.f32(p + "hc_attn_scale", {3});
  L.hc_ffn_fn = b.f32(p + "hc_ffn_fn", {mix, hcd});
  L.hc_ffn_base = b.f32(p + "hc_ffn_base", {mix});
  L.hc_ffn_scale = b.f32(p + "hc_ffn_scale", {3});
  (void)HC;
  L.attn_norm = b.bf16(p + "attn_norm.weight", {D});
  L.ffn_norm = b.bf16(p + "ffn_norm.weight", {D});

  auto& A = L.attn;
  const std::string a = p + "attn.";
  A.attn_sink = b.f32(a + "attn_sink", {H});
  A.wq_a = b.fp8(a + "wq_a", c.q_lora_rank, D);
  A.q_norm = b.bf16(a + "q_norm.weight", {c.q_lora_rank});
  A.wq_b = b.fp8(a + "wq_b", H * Dh, c.q_lora_rank);
  A.wkv = b.fp8(a + "wkv", Dh, D);
  A.kv_norm = b.bf16(a + "kv_norm.weight", {Dh});
  A.wo_a = b.fp8(a + "wo_a", c.o_groups * c.o_lora_rank, c.group_in_dim());
  A.wo_b = b.fp8(a + "wo_b", D, c.o_groups * c.o_lora_rank);
  const int m = L.compress_ratio;
  auto compressor = [&](const std::string& q, int64_t ratio, int64_t width, CompressorWeights& C) {
    const int64_t coff = ModelConfig::compressor_coff(static_cast<int>(ratio));
    C.ape = b.f32(q + "ape", {ratio, coff * width});
    C.wkv = b.bf16(q + "wkv.weight", {coff * width, D});
    C.wgate = b.bf16(q + "wgate.weight", {coff * width, D});
    C.norm = b.bf16(q + "norm.weight", {width});
  };
  if (m > 0) {
    A.has_compressor = true;
    compressor(a + "compressor.", m, Dh, A.compressor);
  }
  if (m == 4) {
    A.has_indexer = true;
    const int64_t IH = c.index_n_heads, IDh = c.index_head_dim;
    A.indexer.wq_b = b.fp8(a + "indexer.wq_b", IH * IDh, c.q_lora_rank);
    A.indexer.weights_proj = b.bf16(a + "indexer.weights_proj.weight", {IH, D});
    compressor(a + "indexer.compressor.", 4, IDh, A.indexer.compressor);
  }

  auto& F = L.ffn;
  const std::string f = p + "ffn.";
  F.gate = b.bf16(f + "gate.weight", {E, D});
  if (hash) {
    F.tid2eid = b.plain(f + "gate.tid2eid", {c.vocab_size, c.num_experts_per_tok}, {DType::I64, DType::I32});
    // The router indexes experts with these ids: every entry must be a valid expert (reads vocab x top-k ints).
    if (F.tid2eid.bound()) {
      for (int64_t r = 0; r < F.tid2eid.rows; ++r)
        for (int64_t k = 0; k < F.tid2eid.cols; ++k) {
          const int64_t id = read_int(F.tid2eid, r, k);
          if (id < 0 || id >= E)
            fail("{}: tensor '{}': token {} maps to expert {}, outside [0, {})", F.tid2eid.w->file, F.tid2eid.w->name,
                 r, id, E);
        }
    }
  }
  else
    F.gate_bias = b.f32(f + "gate.bias", {E});
  if (c.n_shared_experts > 0) {
    const int64_t SI = I * c.n_shared_experts;
    F.shared.w1 = b.fp8(f + "shared_experts.w1", SI, D);
    F.shared.w2 = b.fp8(f + "shared_experts.w2", D, SI);
    F.shared.w3 = b.fp8(f + "shared_experts.w3", SI, D);
  }
  F.experts.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = f + "experts." + std::to_string(e) + ".";
    F.experts[e].w1 = b.fp4(x + "w1", I, D);
    F.experts[e].w2 = b.fp4(x + "w2", D, I);
    F.experts[e].w3 = b.fp4(x + "w3", I, D);
  }
}

}  // namespace

ModelWeights bind_weights(const SafetensorsSet& set, const ModelConfig& c) {
  Binder b(set, c);
  ModelWeights W;
  const int64_t D = c.hidden_size, HC = c.hc_mult;
  W.embed = b.bf16("embed.weight", {c.vocab_size, D});
  W.head = b.bf16("head.weight", {c.vocab_size, D});
  W.norm = b.bf16("norm.weight", {D});
  W.hc_head_fn = b.f32("hc_head_fn", {HC, c.hc_dim()});
  W.hc_head_base = b.f32("hc_head_base", {HC});
  W.hc_head_scale = b.f32("hc_head_scale", {1});
  W.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l)
    bind_block(b, c, "layers." + std::to_string(l) + ".", l, c.is_hash_layer(l), W.layers[l]);

  if (c.num_draft_layers() > 0 && !b.any_with_prefix("mtp.")) {
    log::warn("{}: config has {} {} layer(s) but the checkpoint has no mtp.* tensors; speculative decoding disabled",
              set.dir().string(), c.num_draft_layers(), c.dspark.present ? "DSpark" : "MTP");
  } else if (c.dspark.present) {
    DsparkWeights& S = W.dspark;
    const int n = c.dspark.n_stages, T = int(c.dspark.target_layer_ids.size());
    const int64_t r = c.dspark.markov_rank;
    S.stages.resize(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k)
      bind_block(b, c, "mtp." + std::to_string(k) + ".", c.num_hidden_layers + k, false, S.stages[size_t(k)]);
    S.main_proj = b.fp8("mtp.0.main_proj", D, T * D);
    S.main_norm = b.bf16("mtp.0.main_norm.weight", {D});
    const std::string p = "mtp." + std::to_string(n - 1) + ".";
    S.norm = b.bf16(p + "norm.weight", {D});
    S.hc_head_fn = b.f32(p + "hc_head_fn", {HC, c.hc_dim()});
    S.hc_head_base = b.f32(p + "hc_head_base", {HC});
    S.hc_head_scale = b.f32(p + "hc_head_scale", {1});
    S.markov_w1 = b.bf16(p + "markov_head.markov_w1.weight", {c.vocab_size, r});
    S.markov_w2 = b.bf16(p + "markov_head.markov_w2.weight", {c.vocab_size, r});
    S.confidence = b.bf16(p + "confidence_head.proj.weight", {1, D + r});
  } else {
    W.mtp.resize(static_cast<size_t>(c.num_mtp_layers()));
    for (int k = 0; k < c.num_mtp_layers(); ++k) {
      const std::string p = "mtp." + std::to_string(k) + ".";
      auto& M = W.mtp[k];
      bind_block(b, c, p, c.num_hidden_layers + k, false, M.block);
      M.e_proj = b.fp8(p + "e_proj", D, D);
      M.h_proj = b.fp8(p + "h_proj", D, D);
      M.enorm = b.bf16(p + "enorm.weight", {D});
      M.hnorm = b.bf16(p + "hnorm.weight", {D});
      M.norm = b.bf16(p + "norm.weight", {D});
      M.hc_head_fn = b.f32(p + "hc_head_fn", {HC, c.hc_dim()});
      M.hc_head_base = b.f32(p + "hc_head_base", {HC});
      M.hc_head_scale = b.f32(p + "hc_head_scale", {1});
    }
  }
  b.finish();
  return W;
}

// ---- slow accessors ----------------------------------------------------------------------------------------------

namespace {
template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
void check_index(const WeightRef& w, int64_t r, int64_t c) {
  if (!w.bound()) fail("dequant: unbound weight");
  if (r < 0 || r >= w.rows || c < 0 || c >= w.cols)
    fail("{}: element [{}, {}] outside [{}, {}]", w.w->name, r, c, w.rows, w.cols);
}
float scale_at(const WeightRef& w, int64_t sr, int64_t sc) {
  const int64_t scols = w.scale->shape.back();
  const int64_t i = sr * scols + sc;
  if (w.scale_dtype == DType::F32) return load<float>(w.scale->data + 4 * i);
  return e8m0_to_float(w.scale->data[i]);
}
}  // namespace

float dequant(const WeightRef& w, int64_t r, int64_t c) {
  check_index(w, r, c);
  const uint8_t* d = w.w->data;
  const int64_t i = r * w.cols + c;
  switch (w.fmt) {
    case WeightFormat::BF16: return bf16_to_float(load<uint16_t>(d + 2 * i));
    case WeightFormat::F32: return load<float>(d + 4 * i);
    case WeightFormat::I64: return static_cast<float>(load<int64_t>(d + 8 * i));
    case WeightFormat::I32: return static_cast<float>(load<int32_t>(d + 4 * i));
    case WeightFormat::FP8_BLOCK128: return e4m3fn_to_float(d[i]) * scale_at(w, r / w.block_rows, c / w.block_cols);
    case WeightFormat::FP4_BLOCK32: {
      const uint8_t byte = d[r * (w.cols / 2) + c / 2];
      const uint8_t nib = (c & 1) ? (byte >> 4) : (byte & 0xF);
      return e2m1_to_float(nib) * scale_at(w, r, c / 32);
    }
  }
  return 0.0f;
}

void dequant_row(const WeightRef& w, int64_t r, std::span<float> out) {
  if (static_cast<int64_t>(out.size()) != w.cols)
    fail("dequant_row: output has {} elements, row has {}", out.size(), w.cols);
  check_index(w, r, 0);
  const uint8_t* row = w.w->data + uint64_t(r) * w.row_bytes();
  const int64_t n = w.cols;
  switch (w.fmt) {
    case WeightFormat::BF16:
      for (int64_t c = 0; c < n; ++c) out[c] = bf16_to_float(load<uint16_t>(row + 2 * c));
      return;
    case WeightFormat::F32:
      std::memcpy(out.data(), row, size_t(n) * 4);
      return;
    case WeightFormat::FP8_BLOCK128: {
      const float* lut = e4m3fn_lut();
      for (int64_t c0 = 0; c0 < n; c0 += w.block_cols) {
        const float s = scale_at(w, r / w.block_rows, c0 / w.block_cols);
        const int64_t c1 = std::min(n, c0 + w.block_cols);
        for (int64_t c = c0; c < c1; ++c) out[c] = lut[row[c]] * s;
      }
      return;
    }
    case WeightFormat::FP4_BLOCK32: {
      const auto* pairs = e2m1_pair_lut();
      for (int64_t c0 = 0; c0 < n; c0 += 32) {
        const float s = scale_at(w, r, c0 / 32);
        for (int64_t c = c0; c < c0 + 32; c += 2) {
          const uint8_t b = row[c / 2];
          out[c] = pairs[b][0] * s;
          out[c + 1] = pairs[b][1] * s;
        }
      }
      return;
    }
    default:
      for (int64_t c = 0; c < n; ++c) out[c] = dequant(w, r, c);
  }
}

std::vector<float> dequant_all(const WeightRef& w) {
  std::vector<float> v(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) dequant_row(w, r, std::span<float>(v.data() + r * w.cols, w.cols));
  return v;
}

int64_t read_int(const WeightRef& w, int64_t r, int64_t c) {
  check_index(w, r, c);
  const int64_t i = r * w.cols + c;
  if (w.fmt == WeightFormat::I64) return load<int64_t>(w.w->data + 8 * i);
  if (w.fmt == WeightFormat::I32) return load<int32_t>(w.w->data + 4 * i);
  fail("{}: read_int on a {} weight", w.w->name, weight_format_name(w.fmt));
}

}  // namespace dsv4

namespace dsv4 {
namespace {
void visit_block(const LayerWeights& L, const std::function<void(const WeightRef&)>& fn) {
  for (const WeightRef* r : {&L.hc_attn_fn, &L.hc_attn_base, &L.hc_attn_scale, &L.hc_ffn_fn, &L.hc_ffn_base,
                             &L.hc_ffn_scale, &L.attn_norm, &L.ffn_norm})
    fn(*r);
  const auto& A = L.attn;
  for (const WeightRef* r : {&A.wq_a, &A.q_norm, &A.wq_b, &A.wkv, &A.kv_norm, &A.wo_a, &A.wo_b, &A.attn_sink}) fn(*r);
  auto comp = [&](const CompressorWeights& C) {
    for (const WeightRef* r : {&C.ape, &C.wkv, &C.wgate, &C.norm}) fn(*r);
  };
  if (A.has_compressor) comp(A.compressor);
  if (A.has_indexer) {
    fn(A.indexer.wq_b);
    fn(A.indexer.weights_proj);
    comp(A.indexer.compressor);
  }
  const auto& F = L.ffn;
  fn(F.gate);
  if (F.gate_bias.bound()) fn(F.gate_bias);
  if (F.tid2eid.bound()) fn(F.tid2eid);
  if (F.shared.w1.bound()) {
    fn(F.shared.w1);
    fn(F.shared.w2);
    fn(F.shared.w3);
  }
  for (const auto& e : F.experts) {
    fn(e.w1);
    fn(e.w2);
    fn(e.w3);
  }
}
}  // namespace

void for_each_weight(const ModelWeights& W, const std::function<void(const WeightRef&)>& fn) {
  for (const WeightRef* r : {&W.embed, &W.head, &W.norm, &W.hc_head_fn, &W.hc_head_base, &W.hc_head_scale}) fn(*r);
  for (const auto& L : W.layers) visit_block(L, fn);
  for (const auto& M : W.mtp) {
    visit_block(M.block, fn);
    for (const WeightRef* r : {&M.e_proj, &M.h_proj, &M.enorm, &M.hnorm, &M.norm, &M.hc_head_fn, &M.hc_head_base,
                               &M.hc_head_scale})
      fn(*r);
  }
  const DsparkWeights& S = W.dspark;
  for (const auto& L : S.stages) visit_block(L, fn);
  if (S.bound())
    for (const WeightRef* r : {&S.main_proj, &S.main_norm, &S.norm, &S.hc_head_fn, &S.hc_head_base, &S.hc_head_scale,
                               &S.markov_w1, &S.markov_w2, &S.confidence})
      fn(*r);
}

}  // namespace dsv4
