// An independent, deliberately naive reference of the DSpark drafter (docs/dspark.md) in double precision, for the
// dense numerics (fp32 math, exactly dequantized weights, no quantization simulation): written from the spec text
// (spec §5.2-5.4, §5.7 and docs/dspark.md steps 1-8) with scalar loops over the dequantized checkpoint tensors
// (loader/weights.h accessors only) — none of the model's ops, plans or state pools.
//
// It runs the main layers below the last target layer for the context positions (only window-only main layers are
// supported there: the capture needs no compressor), then the drafter: context rows, one block pass, the Markov head
// and the confidence head. Sizes are tiny-model sizes; nothing here is fast.
#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <vector>

#include "loader/config.h"
#include "loader/weights.h"

namespace dsv4::test {

class NaiveDspark {
 public:
  using Vec = std::vector<double>;

  NaiveDspark(const ModelConfig& c, const ModelWeights& w) : c_(c), w_(w) {
    if (!w.dspark.bound()) throw std::runtime_error("naive DSpark: the checkpoint has no drafter");
    for (int l = 0; l <= c.dspark.target_layer_ids.back() - 1; ++l)
      if (c.compress_ratio(l) != 0) throw std::runtime_error("naive DSpark: a compressed layer below a target layer");
  }

  struct Draft {
    std::vector<Vec> logits;     // [k][vocab] base logits + Markov bias of draft j
    std::vector<double> confidence;
  };

  // Drafts after `context` (positions 0 .. P-1) with anchor x_P = `anchor`; prev[j] is the previous token of
  // Markov step j (prev[0] must be the anchor; the caller passes the drafts it compares against).
  Draft draft(const std::vector<int32_t>& context, const std::vector<int32_t>& prev) {
    const int64_t P = int64_t(context.size()), D = c_.hidden_size, HC = c_.hc_mult, W = c_.sliding_window;
    const int64_t B = c_.dspark.block_size;
    const std::vector<int>& targets = c_.dspark.target_layer_ids;
    const int T = int(targets.size());
    // 1. target hiddens of every context position: the stream means entering each target layer
    std::vector<Vec> H(static_cast<size_t>(P), Vec(size_t(T * D), 0.0));
    std::vector<std::vector<Vec>> X(static_cast<size_t>(P));  // [p][stream][D]
    for (int64_t p = 0; p < P; ++p) X[size_t(p)] = streams_of(context[size_t(p)]);
    std::vector<Vec> layer_kv;  // the current main layer's window rows of every position
    for (int l = 0; l <= targets.back(); ++l) {
      for (int i = 0; i < T; ++i)
        if (targets[size_t(i)] == l)
          for (int64_t p = 0; p < P; ++p)
            for (int64_t d = 0; d < D; ++d) {
              double s = 0;
              for (int64_t j = 0; j < HC; ++j) s += X[size_t(p)][size_t(j)][size_t(d)];
              H[size_t(p)][size_t(i * D + d)] = s / double(HC);
            }
      if (l == targets.back()) break;
      // main layer l (window-only) over the context, position by position
      const LayerWeights& L = w_.layers[size_t(l)];
      layer_kv.assign(size_t(P), {});
      for (int64_t p = 0; p < P; ++p) {
        std::vector<Vec>& Xp = X[size_t(p)];
        Hc hc = hc_pre(Xp, L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base);
        const Vec x = rmsnorm(hc.u, L.attn_norm);
        layer_kv[size_t(p)] = kv_row(L, x, p);
        std::vector<const Vec*> cand;
        for (int64_t q = std::max<int64_t>(0, p - W + 1); q <= p; ++q) cand.push_back(&layer_kv[size_t(q)]);
        const Vec a = attention(L, x, p, cand);
        hc_post(Xp, a, hc);
        hc = hc_pre(Xp, L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base);
        const Vec f = moe(L, rmsnorm(hc.u, L.ffn_norm), context[size_t(p)], l);
        hc_post(Xp, f, hc);
      }
    }
    // 2-3. context rows of every stage: kv_norm(wkv(main_norm(main_proj(H)))) with RoPE at p
    const DsparkWeights& S = w_.dspark;
    const int n_st = int(S.stages.size());
    std::vector<std::vector<Vec>> ctx(static_cast<size_t>(n_st));  // [stage][p]
    for (int64_t p = std::max<int64_t>(0, P - W); p < P; ++p) {
      const Vec mx = rmsnorm(linear(S.main_proj, H[size_t(p)]), S.main_norm);
      for (int s = 0; s < n_st; ++s) {
        ctx[size_t(s)].resize(size_t(P));
        ctx[size_t(s)][size_t(p)] = kv_row(S.stages[size_t(s)], mx, p);
      }
    }
    // 4-5. the block through the stages
    std::vector<std::vector<Vec>> Xb(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b)
      Xb[size_t(b)] = streams_of(b == 0 ? prev.at(0) : int32_t(c_.dspark.noise_token_id));
    for (int s = 0; s < n_st; ++s) {
      const LayerWeights& L = S.stages[size_t(s)];
      std::vector<Hc> hcs(static_cast<size_t>(B));
      std::vector<Vec> xs(static_cast<size_t>(B)), kvb(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) {
        hcs[size_t(b)] = hc_pre(Xb[size_t(b)], L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base);
        xs[size_t(b)] = rmsnorm(hcs[size_t(b)].u, L.attn_norm);
        kvb[size_t(b)] = kv_row(L, xs[size_t(b)], P + b);
      }
      std::vector<const Vec*> cand;
      for (int64_t q = std::max<int64_t>(0, P - W); q < P; ++q) cand.push_back(&ctx[size_t(s)][size_t(q)]);
      for (int64_t b = 0; b < B; ++b) cand.push_back(&kvb[size_t(b)]);
      for (int64_t b = 0; b < B; ++b) {
        const Vec a = attention(L, xs[size_t(b)], P + b, cand);
        hc_post(Xb[size_t(b)], a, hcs[size_t(b)]);
        Hc hf = hc_pre(Xb[size_t(b)], L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base);
        const Vec f = moe(L, rmsnorm(hf.u, L.ffn_norm), 0, c_.num_hidden_layers + s);
        hc_post(Xb[size_t(b)], f, hf);
      }
    }
    // 6-8. hc_head, norm, head; Markov bias and confidence per draft
    Draft out;
    const int64_t V = c_.vocab_size, r = c_.dspark.markov_rank;
    const Vec& w1 = mat(S.markov_w1);
    const Vec& w2 = mat(S.markov_w2);
    const Vec& conf = mat(S.confidence);
    for (size_t j = 0; j < prev.size() && int64_t(j) < B; ++j) {
      const Vec u = hc_head(Xb[j], S.hc_head_fn, S.hc_head_scale, S.hc_head_base);
      const Vec lg = linear(w_.head, rmsnorm(u, S.norm));
      const double* e = &w1[size_t(prev[j]) * size_t(r)];
      Vec row(static_cast<size_t>(V));
      for (int64_t v = 0; v < V; ++v) {
        double b = 0;
        for (int64_t k = 0; k < r; ++k) b += w2[size_t(v * r + k)] * e[k];
        row[size_t(v)] = lg[size_t(v)] + b;
      }
      double z = 0;
      for (int64_t d = 0; d < D; ++d) z += conf[size_t(d)] * u[size_t(d)];
      for (int64_t k = 0; k < r; ++k) z += conf[size_t(D + k)] * e[k];
      out.logits.push_back(std::move(row));
      out.confidence.push_back(1.0 / (1.0 + std::exp(-z)));
    }
    return out;
  }

 private:
  struct Hc {
    Vec u, post, comb;  // [D], [HC], [HC][HC] (C[j][k])
  };

  const Vec& mat(const WeightRef& r) {
    auto it = cache_.find(r.w);
    if (it != cache_.end()) return it->second;
    const std::vector<float> f = dequant_all(r);
    return cache_[r.w] = Vec(f.begin(), f.end());
  }
  Vec linear(const WeightRef& W, const Vec& x) {
    const Vec& m = mat(W);
    Vec y(static_cast<size_t>(W.rows), 0.0);
    for (int64_t o = 0; o < W.rows; ++o) {
      double s = 0;
      for (int64_t i = 0; i < W.cols; ++i) s += m[size_t(o * W.cols + i)] * x[size_t(i)];
      y[size_t(o)] = s;
    }
    return y;
  }
  Vec rmsnorm(const Vec& x, const WeightRef& w) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / double(x.size()) + c_.rms_norm_eps);
    const Vec& g = mat(w);
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * g[i];
    return y;
  }
  std::vector<Vec> streams_of(int32_t token) {
    const Vec& e = mat(w_.embed);
    const int64_t D = c_.hidden_size;
    Vec row(e.begin() + token * D, e.begin() + (token + 1) * D);
    return std::vector<Vec>(size_t(c_.hc_mult), row);
  }
  // interleaved RoPE on the last rd dims of x [dim] at position p (ratio-0 table: rope_theta, no YaRN)
  void rope(double* x, int64_t dim, int64_t p, bool inverse) const {
    const int64_t rd = c_.qk_rope_head_dim, off = dim - rd;
    for (int64_t i = 0; i < rd / 2; ++i) {
      const double f = std::pow(c_.rope_theta, -double(2 * i) / double(rd));
      const double a = double(p) * f, cs = std::cos(a), sn = inverse ? -std::sin(a) : std::sin(a);
      const double re = x[off + 2 * i], im = x[off + 2 * i + 1];
      x[off + 2 * i] = re * cs - im * sn;
      x[off + 2 * i + 1] = re * sn + im * cs;
    }
  }
  static double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
  Hc hc_pre(const std::vector<Vec>& X, const WeightRef& fn_w, const WeightRef& sc_w, const WeightRef& bs_w) {
    const int64_t HC = c_.hc_mult, D = c_.hidden_size;
    const Vec &fn = mat(fn_w), &scale = mat(sc_w), &base = mat(bs_w);
    double ss = 0;
    for (const Vec& s : X)
      for (double v : s) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / double(HC * D) + c_.rms_norm_eps);
    const int64_t n_mix = (2 + HC) * HC;
    Vec mix(static_cast<size_t>(n_mix));
    for (int64_t m = 0; m < n_mix; ++m) {
      double s = 0;
      for (int64_t j = 0; j < HC; ++j)
        for (int64_t d = 0; d < D; ++d) s += fn[size_t(m * HC * D + j * D + d)] * X[size_t(j)][size_t(d)];
      mix[size_t(m)] = s * r;
    }
    const double eps = c_.hc_eps;
    Hc h;
    h.u.assign(size_t(D), 0.0);
    h.post.resize(size_t(HC));
    h.comb.resize(size_t(HC * HC));
    for (int64_t j = 0; j < HC; ++j) {
      const double pre = sigmoid(mix[size_t(j)] * scale[0] + base[size_t(j)]) + eps;
      for (int64_t d = 0; d < D; ++d) h.u[size_t(d)] += pre * X[size_t(j)][size_t(d)];
      h.post[size_t(j)] = 2.0 * sigmoid(mix[size_t(HC + j)] * scale[1] + base[size_t(HC + j)]);
    }
    Vec& C = h.comb;
    for (int64_t j = 0; j < HC; ++j) {  // softmax over k of each row, + eps
      double mx = -1e300, s = 0;
      for (int64_t k = 0; k < HC; ++k) {
        C[size_t(j * HC + k)] = mix[size_t(2 * HC + j * HC + k)] * scale[2] + base[size_t(2 * HC + j * HC + k)];
        mx = std::max(mx, C[size_t(j * HC + k)]);
      }
      for (int64_t k = 0; k < HC; ++k) s += (C[size_t(j * HC + k)] = std::exp(C[size_t(j * HC + k)] - mx));
      for (int64_t k = 0; k < HC; ++k) C[size_t(j * HC + k)] = C[size_t(j * HC + k)] / s + eps;
    }
    auto col = [&] {
      for (int64_t k = 0; k < HC; ++k) {
        double s = 0;
        for (int64_t j = 0; j < HC; ++j) s += C[size_t(j * HC + k)];
        for (int64_t j = 0; j < HC; ++j) C[size_t(j * HC + k)] /= s + eps;
      }
    };
    auto row = [&] {
      for (int64_t j = 0; j < HC; ++j) {
        double s = 0;
        for (int64_t k = 0; k < HC; ++k) s += C[size_t(j * HC + k)];
        for (int64_t k = 0; k < HC; ++k) C[size_t(j * HC + k)] /= s + eps;
      }
    };
    col();
    for (int it = 1; it < c_.hc_sinkhorn_iters; ++it) {
      row();
      col();
    }
    return h;
  }
  void hc_post(std::vector<Vec>& X, const Vec& f, const Hc& h) const {
    const int64_t HC = c_.hc_mult, D = c_.hidden_size;
    std::vector<Vec> Y(static_cast<size_t>(HC), Vec(size_t(D), 0.0));
    for (int64_t k = 0; k < HC; ++k)
      for (int64_t d = 0; d < D; ++d) {
        double s = h.post[size_t(k)] * f[size_t(d)];
        for (int64_t j = 0; j < HC; ++j) s += h.comb[size_t(j * HC + k)] * X[size_t(j)][size_t(d)];
        Y[size_t(k)][size_t(d)] = s;
      }
    X = std::move(Y);
  }
  Vec hc_head(const std::vector<Vec>& X, const WeightRef& fn_w, const WeightRef& sc_w, const WeightRef& bs_w) {
    const int64_t HC = c_.hc_mult, D = c_.hidden_size;
    const Vec &fn = mat(fn_w), &scale = mat(sc_w), &base = mat(bs_w);
    double ss = 0;
    for (const Vec& s : X)
      for (double v : s) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / double(HC * D) + c_.rms_norm_eps);
    Vec u(static_cast<size_t>(D), 0.0);
    for (int64_t j = 0; j < HC; ++j) {
      double m = 0;
      for (int64_t i = 0; i < HC; ++i)
        for (int64_t d = 0; d < D; ++d) m += fn[size_t(j * HC * D + i * D + d)] * X[size_t(i)][size_t(d)];
      const double pre = sigmoid(m * r * scale[0] + base[size_t(j)]) + c_.hc_eps;
      for (int64_t d = 0; d < D; ++d) u[size_t(d)] += pre * X[size_t(j)][size_t(d)];
    }
    return u;
  }
  // kv_norm(wkv x) with RoPE at p: a window row (dense numerics: no FP8 simulation)
  Vec kv_row(const LayerWeights& L, const Vec& x, int64_t p) {
    Vec kv = rmsnorm(linear(L.attn.wkv, x), L.attn.kv_norm);
    rope(kv.data(), int64_t(kv.size()), p, false);
    return kv;
  }
  // attention of one query row x at position p over the candidate rows (K = V), with the sink; output projection
  Vec attention(const LayerWeights& L, const Vec& x, int64_t p, const std::vector<const Vec*>& cand) {
    const int64_t H = c_.num_attention_heads, Dh = c_.head_dim, G = c_.o_groups, R = c_.o_lora_rank;
    Vec q = linear(L.attn.wq_b, rmsnorm(linear(L.attn.wq_a, x), L.attn.q_norm));
    const Vec& sink = mat(L.attn.attn_sink);
    const double scale = 1.0 / std::sqrt(double(Dh));
    Vec o(static_cast<size_t>(H * Dh), 0.0);
    for (int64_t h = 0; h < H; ++h) {
      double* qh = &q[size_t(h * Dh)];
      double ss = 0;
      for (int64_t d = 0; d < Dh; ++d) ss += qh[d] * qh[d];
      const double rr = 1.0 / std::sqrt(ss / double(Dh) + c_.rms_norm_eps);
      for (int64_t d = 0; d < Dh; ++d) qh[d] *= rr;
      rope(qh, Dh, p, false);
      std::vector<double> s(cand.size());
      double mx = sink[size_t(h)];
      for (size_t i = 0; i < cand.size(); ++i) {
        double v = 0;
        for (int64_t d = 0; d < Dh; ++d) v += qh[d] * (*cand[i])[size_t(d)];
        s[i] = v * scale;
        mx = std::max(mx, s[i]);
      }
      double den = std::exp(sink[size_t(h)] - mx);
      for (size_t i = 0; i < cand.size(); ++i) den += (s[i] = std::exp(s[i] - mx));
      double* oh = &o[size_t(h * Dh)];
      for (size_t i = 0; i < cand.size(); ++i)
        for (int64_t d = 0; d < Dh; ++d) oh[d] += s[i] / den * (*cand[i])[size_t(d)];
      rope(oh, Dh, p, true);
    }
    // grouped wo_a: z_g = wo_a[g R : (g+1) R] . o_g (the group's heads), then wo_b
    const Vec& wa = mat(L.attn.wo_a);
    const int64_t Dg = H / G * Dh;
    Vec z(static_cast<size_t>(G * R), 0.0);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t rr = 0; rr < R; ++rr) {
        double v = 0;
        for (int64_t i = 0; i < Dg; ++i) v += wa[size_t((g * R + rr) * Dg + i)] * o[size_t(g * Dg + i)];
        z[size_t(g * R + rr)] = v;
      }
    return linear(L.attn.wo_b, z);
  }
  Vec expert(const ExpertWeights& e, const Vec& x, double weight) {
    const Vec g = linear(e.w1, x), up = linear(e.w3, x);
    const double lim = c_.swiglu_limit;
    Vec h(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      double a = g[i], b = up[i];
      if (lim > 0) {
        a = std::min(a, lim);
        b = std::clamp(b, -lim, lim);
      }
      h[i] = a / (1.0 + std::exp(-a)) * b * weight;
    }
    return linear(e.w2, h);
  }
  // sqrt-softplus scores; hash layers take tid2eid[token], others the top-k of score + bias (ties: lower id);
  // weights = score / sum of the picked scores * route scale; + the shared expert
  Vec moe(const LayerWeights& L, const Vec& x, int32_t token, int layer) {
    const int64_t E = c_.n_routed_experts, k = c_.num_experts_per_tok;
    const Vec lg = linear(L.ffn.gate, x);
    Vec sc(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const double v = lg[size_t(e)];
      sc[size_t(e)] = std::sqrt(v > 20 ? v : std::log1p(std::exp(v)));
    }
    std::vector<int64_t> ids;
    if (c_.is_hash_layer(layer)) {
      for (int64_t i = 0; i < k; ++i) ids.push_back(read_int(L.ffn.tid2eid, token, i));
    } else {
      const Vec& bias = mat(L.ffn.gate_bias);
      std::vector<int64_t> order(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) order[size_t(e)] = e;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return sc[size_t(a)] + bias[size_t(a)] > sc[size_t(b)] + bias[size_t(b)];
      });
      ids.assign(order.begin(), order.begin() + k);
    }
    double sum = 0;
    for (int64_t id : ids) sum += sc[size_t(id)];
    Vec y(x.size(), 0.0);
    for (int64_t id : ids) {
      const Vec o = expert(L.ffn.experts[size_t(id)], x, sc[size_t(id)] / sum * c_.routed_scaling_factor);
      for (size_t d = 0; d < y.size(); ++d) y[d] += o[d];
    }
    const Vec s = expert(L.ffn.shared, x, 1.0);
    for (size_t d = 0; d < y.size(); ++d) y[d] += s[d];
    return y;
  }

  const ModelConfig& c_;
  const ModelWeights& w_;
  std::map<const TensorInfo*, Vec> cache_;
};

}  // namespace dsv4::test
