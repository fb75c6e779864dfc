#include "model/dummy_weights.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "backend/cpu_backend.h"
#include "backend/random_fill.h"
#include "core/error.h"
#include "format/numeric.h"
#include "loader/layout.h"

namespace dsv4 {

namespace {

double gib(uint64_t b) { return double(b) / double(uint64_t(1) << 30); }

bool ends_with(const std::string& s, const char* suf) {
  const size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

// Generated on the device: matrices of the GEMM formats and their scales.
bool device_tensor(const TensorSpec& t) {
  if (t.dtype == DType::F8_E4M3 || t.dtype == DType::I8) return true;
  if (t.dtype == DType::F8_E8M0) return true;
  return t.dtype == DType::BF16 && t.shape.size() == 2;
}

// Exponent of 2 closest to 1/sqrt(n) (weights scaled like a variance-preserving init).
float inv_sqrt_exp(int64_t n) { return float(std::lround(-0.5 * std::log2(double(std::max<int64_t>(n, 1))))); }

}  // namespace

bool parse_routed_expert(const std::string& name, int* layer, int64_t* expert) {
  int l = -1;
  long long e = -1;
  int used = 0;
  if (std::sscanf(name.c_str(), "layers.%d.ffn.experts.%lld.%n", &l, &e, &used) != 2 || used == 0) return false;
  *layer = l;
  *expert = e;
  return true;
}

DummyDeviceBytes dummy_device_bytes(const ModelConfig& cfg, bool with_drafter) {
  DummyDeviceBytes b;
  uint64_t experts = 0;
  for (const auto& t : checkpoint_layout(cfg, with_drafter)) {
    if (!device_tensor(t)) continue;
    int l = 0;
    int64_t e = 0;
    (parse_routed_expert(t.name, &l, &e) ? experts : b.non_expert) += t.nbytes();
  }
  const uint64_t n = uint64_t(cfg.num_hidden_layers) * uint64_t(cfg.n_routed_experts);
  b.one_expert = n ? experts / n : 0;
  return b;
}

ModelConfig keep_first_layers(const ModelConfig& cfg, int n) {
  if (n <= 0 || n >= cfg.num_hidden_layers) return cfg;
  ModelConfig c = cfg;
  std::vector<int> r(cfg.compress_ratios.begin(), cfg.compress_ratios.begin() + n);
  r.insert(r.end(), cfg.compress_ratios.begin() + cfg.num_hidden_layers, cfg.compress_ratios.end());
  c.compress_ratios = r;
  c.num_hidden_layers = n;
  c.num_hash_layers = std::min(c.num_hash_layers, n);
  if (c.dspark.present) {
    std::vector<int> t;
    for (int id : cfg.dspark.target_layer_ids) {
      const int m = std::max(0, id - (cfg.num_hidden_layers - n));
      if (t.empty() || m > t.back()) t.push_back(m);
    }
    c.dspark.target_layer_ids = t;
  }
  return c;
}

DummyCheckpoint make_dummy_checkpoint(const ModelConfig& cfg, Backend& be, uint64_t seed, bool with_drafter,
                                      const ExpertPlacement* placement) {
  const std::vector<TensorSpec> layout = checkpoint_layout(cfg, with_drafter);
  DummyCheckpoint ck;
  // routed experts placed on the CPU: host memory (on a GPU backend; on the CPU backend everything is host memory)
  auto on_host = [&](const TensorSpec& t) {
    int l = 0;
    int64_t e = 0;
    return placement && !be.device().is_cpu() && device_tensor(t) && parse_routed_expert(t.name, &l, &e) &&
           placement->on_host(l, e);
  };
  uint64_t expert_host = 0;
  for (const auto& t : layout)
    (on_host(t) ? expert_host : device_tensor(t) ? ck.device_bytes : ck.host_bytes) += t.nbytes();
  if (!be.device().is_cpu()) {
    const MemoryInfo mi = be.memory();
    const uint64_t slack = uint64_t(1) << 30;
    if (ck.device_bytes + slack > mi.free)
      fail("dummy weights of {} ({} layers) need {:.2f} GiB on {} but {:.2f} GiB are free; use fewer --layers, or "
           "keep routed experts on the CPU (--gpu-experts auto, --n-cpu-moe N, --cpu-moe)",
           cfg.origin, cfg.num_hidden_layers, gib(ck.device_bytes + slack), be.device().name(), gib(mi.free));
  }
  if (be.device().is_cpu()) {  // everything in host memory: refuse up front instead of running into the OOM killer
    const MemoryInfo hm = be.memory();
    const uint64_t need = ck.device_bytes + ck.host_bytes + (uint64_t(1) << 30);
    if (hm.free > 0 && need > hm.free)
      fail("dummy weights of {} ({} layers) need {:.2f} GiB of host memory but {:.2f} GiB are available; use fewer "
           "--layers", cfg.origin, cfg.num_hidden_layers, gib(need), gib(hm.free));
  }
  if (expert_host > 0) {
    const MemoryInfo hm = cpu_backend().memory();
    const uint64_t slack = uint64_t(2) << 30;
    if (expert_host + ck.host_bytes + slack > hm.free)
      fail("the {} routed experts placed on the CPU need {:.2f} GiB of host memory but {:.2f} GiB are available; "
           "put more experts on the device (--n-cpu-moe with a smaller N, --gpu-experts auto) or use fewer --layers",
           placement->n_host(), gib(expert_host + ck.host_bytes + slack), gib(hm.free));
  }
  ck.host_bytes += expert_host;
  std::vector<TensorInfo> infos;
  infos.reserve(layout.size());
  // the FP8 / FP4 scale exponents follow their matrix (the .weight entry precedes its .scale in the layout)
  float scale_exp = -7;
  uint64_t k = 0;
  std::vector<char> dev;
  for (const auto& t : layout) {
    TensorInfo ti;
    ti.name = t.name;
    ti.dtype = t.dtype;
    ti.shape = t.shape;
    ti.nbytes = t.nbytes();
    ti.file = "(dummy)";
    const uint64_t s = seed * 1000003ull + (++k);
    const bool host_expert = on_host(t);
    if (device_tensor(t)) {
      void* p = nullptr;
      Backend& fb = host_expert ? static_cast<Backend&>(cpu_backend()) : be;  // who fills it
      if (host_expert) {
        ck.host_experts.emplace_back(new uint8_t[size_t(ti.nbytes)]);  // first touched by the parallel fill
        p = ck.host_experts.back().get();
      } else {
        ck.device.emplace_back(be, size_t(ti.nbytes), "dummy weights");
        p = ck.device.back().data();
      }
      const int64_t in = t.shape.back();
      switch (t.dtype) {
        case DType::F8_E4M3:  // codes ~ magnitude 0.7 rms; scale 2^(e) with e ~ -log2(sqrt(in))
          fb.fill_random(p, size_t(ti.nbytes), Backend::RandomFill::e4m3, 0, s);
          scale_exp = inv_sqrt_exp(in);
          break;
        case DType::I8:  // e2m1 pairs, rms ~ 2.9 per code; per-32 scale compensates
          fb.fill_random(p, size_t(ti.nbytes), Backend::RandomFill::fp4_pairs, 0, s);
          scale_exp = inv_sqrt_exp(in * 2) - 1.5f;
          break;
        case DType::F8_E8M0: fb.fill_random(p, size_t(ti.nbytes), Backend::RandomFill::e8m0, scale_exp, s); break;
        default: {  // BF16 matrices: uniform with rms 1/sqrt(in) (router gate: logits ~N(0, 1))
          const float a = float(std::sqrt(3.0 / double(in)));
          fb.fill_random(p, size_t(ti.nbytes), Backend::RandomFill::bf16, a, s);
        }
      }
      ti.data = static_cast<const uint8_t*>(p);
    } else {
      std::vector<uint8_t> h(size_t(ti.nbytes));
      const int64_t n = int64_t(ti.nbytes) / int64_t(dtype_size(t.dtype));
      auto rnd = [&](int64_t i) { return double(random_bits(s, uint64_t(i)) >> 11) * 0x1p-53; };  // [0, 1)
      auto put_f32 = [&](int64_t i, float v) { std::memcpy(&h[size_t(i) * 4], &v, 4); };
      if (t.dtype == DType::I64) {  // tid2eid: random expert ids
        for (int64_t i = 0; i < n; ++i) {
          const int64_t e = int64_t(random_bits(s, uint64_t(i)) % uint64_t(cfg.n_routed_experts));
          std::memcpy(&h[size_t(i) * 8], &e, 8);
        }
      } else if (t.dtype == DType::BF16) {  // norm weights: 1
        const uint16_t one = float_to_bf16_rne(1.0f);
        for (int64_t i = 0; i < n; ++i) std::memcpy(&h[size_t(i) * 2], &one, 2);
      } else if (ends_with(t.name, "_fn")) {  // mHC mixing matrices: small
        const float a = float(0.5 / std::sqrt(double(t.shape.back())));
        for (int64_t i = 0; i < n; ++i) put_f32(i, float((2 * rnd(i) - 1) * a));
      } else if (ends_with(t.name, "_scale")) {
        for (int64_t i = 0; i < n; ++i) put_f32(i, float(0.5 + rnd(i)));
      } else {  // bases, ape, sinks, router bias: N-ish(0, 0.5)
        for (int64_t i = 0; i < n; ++i) put_f32(i, float(rnd(i) - 0.5));
      }
      ck.host.push_back(std::move(h));
      ti.data = ck.host.back().data();
    }
    infos.push_back(std::move(ti));
    dev.push_back(device_tensor(t) && !host_expert);
  }
  be.synchronize();
  ck.set = std::make_unique<SafetensorsSet>(SafetensorsSet::from_tensors("dummy:" + cfg.origin, std::move(infos)));
  for (size_t i = 0; i < dev.size(); ++i)
    if (dev[i] && !be.device().is_cpu()) ck.on_device.insert(&ck.set->tensors()[i]);
  return ck;
}

}  // namespace dsv4
