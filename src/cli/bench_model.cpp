// `dsv4 bench model`: one sequence through the whole forward pass on a backend — prefill tokens/s and decode
// ms/step, weight bytes read per decode step, achieved GB/s against the device's copy bandwidth measured in the same
// run, the same figures extrapolated to the config's full layer count (`*_full`), and a per-op time breakdown.
//   dsv4 bench model (-m DIR | --config FILE) [--load-format auto|dummy|safetensors] [--layers N] [--device D]
//                    [--numerics reference|dense] [--batch B] [--ctx C] [--prefill T] [--steps S] [--json]
//                    [--deterministic] [--no-cuda-graph] [--no-pdl] [--wgmma]
//                    [--cpu-moe | --n-cpu-moe N | --gpu-experts auto|N] [--hot-experts FILE]
//                    [--stage-tokens auto|N] [--stage-mib M] [--timeline FILE]
// --batch B > 1: B sequences decode together (one batched forward step per token of each), sharing one prefilled
// ctx-token context (ctx a multiple of 128); decode_tok_s = B / step time.
// --load-format dummy (the default with --config) builds weights of the config's exact shapes and formats with
// pseudo-random values on the device, reading no tensor file (model/dummy_weights.h); --layers N keeps the first N
// layers of the schedule (24 layers of V4-Flash fit one H200).
// Extrapolation: decode time scales with the weight bytes (layers x per-layer bytes + the head), prefill time with
// the layer count. With routed experts on the CPU (issue 11, model/split_moe.h) the JSON adds the placement, the
// weight bytes the CPU reads per decode step, and per timed run (decode_split, prefill_split) the PCIe bytes per
// step, the CPU experts' time per step and per split layer, and for calls that staged their CPU experts on the
// device (model/expert_staging.h) the bytes and copy time (staged_*); decode_gpu_ms_per_layer = the profiled device time of
// all ops per step / layers. The per-op breakdown comes from a separate run with a synchronization around every op
// (backend/profiled_ops.h), so its total exceeds the timed run by the launch + sync latencies.
// --timeline FILE: one more prefill of the same tokens, traced without synchronizing (backend/timeline_ops.h): per op
// the host's enqueue begin and end and the device's end (a timing event after the op on its stream); the rows go to
// FILE (tab-separated, ms since the step's start), the summary to stderr and the JSON ("timeline"): wall, device
// busy / idle time, how long the device waited for the host (before the first op, between ops, inside an op's
// enqueue, after the last op), the ops by device time and by host enqueue time, the longest waits.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/profiled_ops.h"
#include "backend/timeline_ops.h"
#include "cli/numerics_option.h"
#include "cli/command.h"
#include "cli/device_option.h"
#include "cli/placement_option.h"
#include "core/error.h"
#include "model/dummy_weights.h"
#include "model/model.h"
#include "model/batch.h"
#include "model/sequence.h"
#include "model/state_layout.h"
#include "model/state_pool.h"

namespace dsv4::cli {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct ModelBenchOpts {
  std::string model, config, load_format = "auto", device, numerics = "reference", timeline;
  int layers = 0, batch = 1, steps = 32;
  int64_t ctx = 0, prefill = 512;
  bool json = false, no_profile = false, no_cuda_graph = false, no_pdl = false, wgmma = false;
  PlacementOptions placement;
};

// Device copy bandwidth (read + write bytes / s) of a 1 GiB buffer, best of 5.
double copy_gbps(Backend& be) {
  const size_t bytes = size_t(1) << 30;
  Buffer a(be, bytes, "bandwidth test"), b(be, bytes, "bandwidth test");
  be.fill_random(a.data(), bytes, Backend::RandomFill::fp4_pairs, 0, 1);
  be.copy_on_device(b.data(), a.data(), bytes);
  be.synchronize();
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    be.copy_on_device(b.data(), a.data(), bytes);
    be.synchronize();
    best = std::max(best, 2.0 * double(bytes) / since(t0) / 1e9);
  }
  return best;
}

std::vector<int32_t> random_ids(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(2, vocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

nlohmann::json op_table(const ProfiledOps& p, double per) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, e] : p.times()) j[name] = {{"ms", e.seconds * 1e3 / per}, {"calls", double(e.calls) / per}};
  return j;
}

// The timeline of one prefill of `ids` in a fresh sequence (--timeline): rows to `path`, the summary to `out` and
// stderr.
void prefill_timeline(Model& m, std::span<const int32_t> ids, const std::string& path, nlohmann::json& out) {
  Backend& be = m.backend();
  TimelineOps tl(be);
  ModelSequence seq(m);
  std::vector<float> lg(static_cast<size_t>(m.n_vocab()));
  m.set_op_hook(&tl);
  try {
    tl.start();
    seq.append(ids, lg);
  } catch (...) {
    m.set_op_hook(nullptr);
    throw;
  }
  const double end = Backend::timeline_clock();
  m.set_op_hook(nullptr);
  tl.finish();
  const TimelineOps::Summary s = tl.summarize(end);
  {
    std::ofstream f(path);
    if (!f) fail("bench model: cannot write the timeline to {}", path);
    tl.write_tsv(f);
    if (!f.flush()) fail("bench model: cannot write the timeline to {}", path);
  }
  auto ms = [](double v) { return v * 1e3; };
  nlohmann::json j;
  j["file"] = path;
  j["tokens"] = int64_t(ids.size());
  j["ops"] = s.ops;
  j["wall_ms"] = ms(s.wall);
  j["before_first_op_ms"] = ms(s.before_first_op);
  j["after_last_op_ms"] = ms(s.after_last_op);
  j["host_enqueue_ms"] = ms(s.host_enqueue);
  j["device_intervals_ms"] = ms(s.device_intervals);
  j["device_busy_ms"] = ms(s.device_busy);
  j["device_idle_ms"] = ms(s.device_idle);
  j["host_behind_ms"] = ms(s.host_behind);
  j["host_behind_between_ops_ms"] = ms(s.host_behind_between);
  j["host_behind_in_enqueue_ms"] = ms(s.host_behind_enqueue);
  j["clock_uncertainty_ms"] = ms(s.clock_uncertainty);
  nlohmann::json by = nlohmann::json::array();
  for (const auto& o : s.by_op)
    by.push_back({{"op", o.op}, {"calls", o.calls}, {"device_ms", ms(o.device)}, {"host_ms", ms(o.host)},
                  {"host_behind_ms", ms(o.host_behind)}});
  j["by_op"] = by;
  // the longest single waits of the device on the host (rows of the file)
  const auto& rows = tl.rows();
  std::vector<std::pair<double, size_t>> waits;
  for (size_t i = 0; i < rows.size(); ++i) {
    double prev = tl.origin();
    for (int d : rows[i].after)
      if (d >= 0) prev = std::max(prev, rows[size_t(d)].device_end);
    if (i > 0) waits.push_back({std::min(rows[i].host_end, rows[i].device_end) - prev, i});
  }
  std::sort(waits.rbegin(), waits.rend());
  nlohmann::json top = nlohmann::json::array();
  std::string top_line;
  for (size_t k = 0; k < waits.size() && k < 8 && waits[k].first > 0; ++k) {
    const auto& r = rows[waits[k].second];
    top.push_back({{"row", waits[k].second}, {"op", r.op}, {"n", r.n}, {"host_behind_ms", ms(waits[k].first)},
                   {"host_ms", ms(r.host_end - r.host_begin)}});
    top_line += fmt::format(" #{} {} {:.3f}", waits[k].second, r.op, ms(waits[k].first));
  }
  j["longest_waits"] = top;
  out["timeline"] = j;
  std::fprintf(stderr,
               "timeline of a prefill of %zu tokens (traced again, %s): %.1f ms wall, %lld ops; device busy %.1f ms, "
               "idle %.1f ms: before the first op %.1f, host behind the device %.1f (between ops %.1f, inside "
               "enqueues %.1f), after the last op %.1f; ops enqueued in %.1f ms of host time; device intervals sum "
               "%.1f ms (clock +-%.3f ms)\n",
               ids.size(), path.c_str(), ms(s.wall), static_cast<long long>(s.ops), ms(s.device_busy),
               ms(s.device_idle), ms(s.before_first_op), ms(s.host_behind), ms(s.host_behind_between),
               ms(s.host_behind_enqueue), ms(s.after_last_op), ms(s.host_enqueue), ms(s.device_intervals),
               ms(s.clock_uncertainty));
  std::string dev_line, host_line;
  for (size_t k = 0; k < s.by_op.size() && k < 8; ++k)
    dev_line += fmt::format(" {} {:.2f}", s.by_op[k].op, ms(s.by_op[k].device));
  std::vector<TimelineOps::OpTotal> by_host = s.by_op;
  std::sort(by_host.begin(), by_host.end(), [](const auto& a, const auto& b) { return a.host > b.host; });
  for (size_t k = 0; k < by_host.size() && k < 8; ++k)
    host_line += fmt::format(" {} {:.2f}", by_host[k].op, ms(by_host[k].host));
  std::fprintf(stderr,
               "  ms by device interval:%s\n  ms by host enqueue:%s\n  longest waits on the host (row op ms):%s\n",
               dev_line.c_str(), host_line.c_str(), top_line.empty() ? " none" : top_line.c_str());
  std::fflush(stderr);
}

int run_model_bench(const ModelBenchOpts& o) {
  auto say = [&](const std::string& s) {
    std::fprintf(stderr, "%s\n", s.c_str());
    std::fflush(stderr);
  };
  // What the command line alone tells is a usage error (exit 2), before any file is read.
  if (o.model.empty() == o.config.empty()) usage_fail("bench model: give exactly one of -m DIR and --config FILE");
  const std::string fmt_ = o.load_format == "auto" ? (o.config.empty() ? "safetensors" : "dummy") : o.load_format;
  if (fmt_ != "dummy" && fmt_ != "safetensors")
    usage_fail("bench model: --load-format must be auto, dummy or safetensors (got '{}')", o.load_format);
  if (fmt_ == "safetensors" && o.model.empty()) usage_fail("bench model: --load-format safetensors needs -m DIR");
  if (o.batch < 1 || o.batch > 4096) usage_fail("bench model: --batch must be in [1, 4096] (got {})", o.batch);
  if (o.batch > 1 && o.ctx % StateLayout::kPageTokens != 0)
    usage_fail("bench model: --batch > 1 needs --ctx a multiple of {} (the sequences share the context's full pages)",
               StateLayout::kPageTokens);
  if (o.steps < 1) usage_fail("bench model: --steps must be >= 1");
  if (o.prefill < 0 || o.ctx < 0) usage_fail("bench model: --prefill and --ctx must be >= 0");
  if (!o.timeline.empty() && o.prefill == 0) usage_fail("bench model: --timeline traces a prefill: give --prefill > 0");
  if (!o.timeline.empty() && !std::ofstream(o.timeline, std::ios::app))  // now, not after the whole run
    fail("bench model: cannot write the timeline to {}", o.timeline);
  const auto num = parse_numerics(o.numerics);
  if (!num) usage_fail("bench model: --numerics must be reference or dense (got '{}')", o.numerics);
  const std::filesystem::path cfg_path =
      o.config.empty() ? std::filesystem::path(o.model) / "config.json" : std::filesystem::path(o.config);
  const ModelConfig full = load_config(cfg_path);
  if (o.layers < 0 || o.layers > full.num_hidden_layers)
    usage_fail("bench model: --layers must be in [1, {}], or 0 for all (got {})", full.num_hidden_layers, o.layers);
  const ModelConfig cfg = keep_first_layers(full, o.layers);
  if (fmt_ == "safetensors" && cfg.num_hidden_layers != full.num_hidden_layers)
    usage_fail("bench model: --layers needs --load-format dummy (a checkpoint holds all of its layers)");
  check_placement(cfg, o.placement);  // (before the copy bandwidth run and the load)
  const int64_t max_pos = cfg.max_position_embeddings;  // (each term bounded first: the sum cannot overflow)
  if (o.ctx > max_pos || o.prefill > max_pos || o.steps > max_pos || o.ctx + o.prefill + o.steps + 9 > max_pos)
    usage_fail("bench model: --ctx + --prefill + --steps must stay below the model's {} positions", max_pos);

  ModelOptions mo;
  mo.numerics = *num;
  mo.device = resolve_device(o.device);
  mo.placement = o.placement;
  mo.ubatch = std::max<int64_t>({256, o.prefill, std::min<int64_t>(o.ctx, 8192)});  // the context in few steps
  mo.cuda_graphs = !o.no_cuda_graph;
  set_cuda_pdl(!o.no_pdl);  // process-wide (backend.h), before any kernel of the run is launched
  set_cuda_wgmma(o.wgmma);
  // the copy bandwidth first: with --gpu-experts auto the model fills the device memory
  std::unique_ptr<Backend> backend = make_backend(mo.device);
  const double copy = copy_gbps(*backend);
  say(fmt::format("copy bandwidth {:.0f} GB/s", copy));
  mo.backend = backend.get();
  const auto t_load = Clock::now();
  say(fmt::format("bench model: {} {} layers of {} ({}), {} numerics, device {}", fmt_, cfg.num_hidden_layers,
                  full.num_hidden_layers, cfg_path.string(), o.numerics, mo.device.name()));
  std::unique_ptr<Model> m = fmt_ == "dummy" ? Model::load_dummy(cfg, mo) : Model::load(o.model, mo);
  Backend& be = m->backend();
  say(fmt::format("loaded in {:.1f} s on {}", since(t_load), be.description()));

  nlohmann::json out;
  out["device"] = be.description();
  out["layers"] = cfg.num_hidden_layers;
  out["layers_full"] = full.num_hidden_layers;
  out["batch"] = o.batch;
  out["ctx"] = o.ctx;
  out["prefill"] = o.prefill;
  out["steps"] = o.steps;
  out["numerics"] = o.numerics;
  out["load_format"] = fmt_;
  out["deterministic"] = cuda_deterministic();
  out["cuda_graph"] = m->step_graphs() != nullptr;
  out["pdl"] = cuda_pdl_active(be);
  out["copy_GBps"] = copy;
  const double layer_scale = double(full.num_hidden_layers) / double(cfg.num_hidden_layers);
  // routed experts split between the device and the CPU (--cpu-moe, --n-cpu-moe, --gpu-experts, --hot-experts)
  const ExpertPlacement& pl = m->placement();
  const int64_t split_layers = [&] {
    int64_t n = 0;
    for (int l = 0; l < cfg.num_hidden_layers; ++l) n += pl.n_host(l) > 0 ? 1 : 0;
    return n;
  }();
  out["placement"] = pl.summary();
  out["experts_on_cpu"] = pl.n_host();
  out["experts_on_device"] = int64_t(cfg.num_hidden_layers) * cfg.n_routed_experts - pl.n_host();
  out["split_layers"] = split_layers;
  out["host_expert_bytes"] = m->host_expert_bytes();
  if (pl.n_host() > 0) {
    say(pl.summary());
    say(fmt::format("{:.2f} GiB of routed experts in host memory", double(m->host_expert_bytes()) / double(1ull << 30)));
  }
  // the split's traffic and host time over `steps` steps of the timed run just finished (per step, per split layer)
  if (const SplitMoe* sm = m->split_moe()) {
    out["stage_min_tokens"] = sm->stage_min_tokens();
    out["stage_slot_bytes"] = sm->stage_slot_bytes();
    out["host_experts_pinned"] = sm->host_experts_pinned();
    if (sm->stage_min_tokens() > 0)
      say(fmt::format("split layers stage their CPU experts on the device from {} tokens per call (2 x {:.0f} MiB, "
                      "host experts {}page-locked)", sm->stage_min_tokens(), double(sm->stage_slot_bytes()) / 1048576.0,
                      sm->host_experts_pinned() ? "" : "not "));
  }
  // the split's traffic and host time over `steps` steps of the timed run just finished (per step, per split layer);
  // calls with many tokens stream the layer's CPU experts to the device instead (staged_*: their bytes, and the time
  // the copies took on the copy queue, overlapped with the device's work)
  auto report_split = [&](const char* key, double steps, double step_s) {
    const SplitMoeStats st = m->split_stats();
    if (st.calls == 0) return;
    const double calls_per_step = double(st.calls) / steps;
    const double cpu_calls = double(st.calls - st.staged_calls);
    nlohmann::json j;
    j["pcie_bytes_per_step"] = double(st.to_host_bytes + st.to_device_bytes + st.staged_bytes) / steps;
    j["to_host_bytes_per_step"] = double(st.to_host_bytes) / steps;
    j["to_device_bytes_per_step"] = double(st.to_device_bytes + st.staged_bytes) / steps;
    j["split_layer_calls_per_step"] = calls_per_step;
    j["cpu_ms_per_step"] = st.host_s * 1e3 / steps;
    j["cpu_ms_per_split_layer"] = cpu_calls > 0 ? st.host_s * 1e3 / cpu_calls : 0.0;
    j["cpu_wait_ms_per_split_layer"] = cpu_calls > 0 ? st.wait_s * 1e3 / cpu_calls : 0.0;
    j["cpu_pairs_per_step"] = double(st.host_pairs) / steps;
    j["device_pairs_per_step"] = double(st.device_pairs) / steps;
    j["staged_calls_per_step"] = double(st.staged_calls) / steps;
    j["staged_chunks_per_step"] = double(st.staged_chunks) / steps;
    j["staged_bytes_per_step"] = double(st.staged_bytes) / steps;
    j["staged_copy_ms_per_step"] = st.staged_copy_s * 1e3 / steps;
    j["staged_copy_GBps"] = st.staged_copy_s > 0 ? double(st.staged_bytes) / st.staged_copy_s / 1e9 : 0.0;
    j["staged_copy_share_of_step"] = st.staged_copy_s / steps / step_s;
    j["step_ms"] = step_s * 1e3;
    j["cpu_share_of_step"] = st.host_s / steps / step_s;
    out[key] = j;
    if (cpu_calls > 0)
      say(fmt::format("  split ({}): {:.1f} KB over PCIe per step ({:.1f} KB to host, {:.1f} KB back), CPU experts "
                      "{:.2f} ms per step = {:.3f} ms per split layer ({:.0f}% of the step), {:.1f} CPU pairs per step",
                      key, double(st.to_host_bytes + st.to_device_bytes) / steps / 1e3,
                      double(st.to_host_bytes) / steps / 1e3, double(st.to_device_bytes) / steps / 1e3,
                      st.host_s * 1e3 / steps, st.host_s * 1e3 / cpu_calls, 100.0 * st.host_s / steps / step_s,
                      double(st.host_pairs) / steps));
    if (st.staged_calls > 0)
      say(fmt::format("  split ({}): {:.0f} calls per step staged their CPU experts on the device: {:.1f} MB per step "
                      "in {:.0f} chunks, copies {:.1f} ms per step ({:.1f} GB/s, {:.0f}% of the step)",
                      key, double(st.staged_calls) / steps, double(st.staged_bytes) / steps / 1e6,
                      double(st.staged_chunks) / steps, st.staged_copy_s * 1e3 / steps,
                      st.staged_copy_s > 0 ? double(st.staged_bytes) / st.staged_copy_s / 1e9 : 0.0,
                      100.0 * st.staged_copy_s / steps / step_s));
  };

  // prefill: a warm-up run of the same length, then the timed one (fresh sequences)
  if (o.prefill > 0) {
    const auto ids = random_ids(o.prefill, int32_t(cfg.vocab_size), 11);
    std::vector<float> lg(static_cast<size_t>(cfg.vocab_size));
    for (int rep = 0; rep < 2; ++rep) {
      ModelSequence seq(*m);
      m->reset_split_stats();
      const auto t0 = Clock::now();
      seq.append(ids, lg);
      const double t = since(t0);
      if (rep == 1) {
        out["prefill_ms"] = t * 1e3;
        out["prefill_tok_s"] = double(o.prefill) / t;
        out["prefill_tok_s_full"] = double(o.prefill) / (t * layer_scale);
        say(fmt::format("prefill {} tokens: {:.1f} ms, {:.0f} tok/s ({:.0f} tok/s at {} layers)", o.prefill, t * 1e3,
                        double(o.prefill) / t, double(o.prefill) / (t * layer_scale), full.num_hidden_layers));
        // the matrix products' work (Model::matmul_flops_per_token: linears, mHC projections, shared and top-k
        // routed experts; not attention scores) over the time, against the device's dense FP8 tensor-core peak
        const double tflops = m->matmul_flops_per_token() * double(o.prefill) / t / 1e12;
        const double peak = be.fp8_peak_flops() / 1e12;
        out["prefill_matmul_TFLOPs"] = tflops;
        if (peak > 0) {
          out["fp8_peak_TFLOPs"] = peak;
          out["prefill_pct_of_fp8_peak"] = 100.0 * tflops / peak;
        }
        say(fmt::format("prefill matrix products: {:.3g} TFLOP/s{}", tflops,
                        peak > 0 ? fmt::format(" = {:.1f}% of the {:.0f} TFLOP/s dense FP8 tensor-core peak",
                                               100.0 * tflops / peak, peak)
                                 : std::string()));
        report_split("prefill_split", 1.0, t);
      }
    }
    if (!o.timeline.empty()) prefill_timeline(*m, ids, o.timeline, out);
  }

  // decode: ctx tokens already in the sequence, then steps single-token steps (kWarmSteps warm-up steps first)
  uint64_t outside = 0;
  const uint64_t bytes = m->decode_weight_bytes(&outside, o.batch);
  const uint64_t bytes_full = outside + uint64_t(double(bytes - outside) * layer_scale);
  const uint64_t host_bytes = m->host_decode_weight_bytes(o.batch);
  auto report_decode = [&](double t) {
    const double gbs = double(bytes) / t / 1e9;
    const double t_full = t * double(bytes_full) / double(bytes);
    out["decode_ms_per_step"] = t * 1e3;
    out["decode_tok_s"] = double(o.batch) / t;
    out["decode_ms_per_step_full"] = t_full * 1e3;
    out["decode_tok_s_full"] = double(o.batch) / t_full;
    out["weight_bytes_per_step"] = bytes;
    out["weight_bytes_per_step_full"] = bytes_full;
    out["achieved_GBps"] = gbs;
    out["pct_of_copy"] = 100.0 * gbs / copy;
    if (host_bytes > 0) {
      out["weight_bytes_per_step_cpu"] = host_bytes;
      out["weight_bytes_per_step_device"] = bytes - host_bytes;
      out["decode_tok_s_full_note"] = "with routed experts on the CPU, *_full scales the measured step by weight bytes "
                                      "as if the extra layers split like the measured ones";
    }
    say(fmt::format("decode batch {} at ctx {}: {:.2f} ms/step, {:.1f} tok/s; {:.2f} GB of weights per step -> {:.0f} "
                    "GB/s = {:.1f}% of copy; at {} layers: {:.2f} ms/step, {:.1f} tok/s",
                    o.batch, std::max<int64_t>(o.ctx, 1), t * 1e3, double(o.batch) / t, double(bytes) / 1e9, gbs,
                    100.0 * gbs / copy, full.num_hidden_layers, t_full * 1e3, double(o.batch) / t_full));
  };
  // Warm-up decode steps: with CUDA graphs, each step shape runs eagerly once, is recorded the second time and
  // replayed after that; a decode's shapes come back every 4 positions (ratio-4 compressor), so 8 steps record all.
  constexpr int kWarmSteps = 8;
  const int64_t replays0 = m->step_graphs() ? m->step_graphs()->replays() : 0;
  auto report_graphs = [&] {
    if (!m->step_graphs()) return;
    const int64_t r = m->step_graphs()->replays() - replays0;
    out["cuda_graph_replays"] = r;
    out["cuda_graphs_recorded"] = m->step_graphs()->recorded();
    say(fmt::format("CUDA graphs: {} step shapes recorded, {} replays in {} warm-up + {} timed steps",
                    m->step_graphs()->recorded(), r, kWarmSteps, o.steps));
  };
  auto report_ops = [&](const ProfiledOps& prof, int n) {
    out["decode_ops"] = op_table(prof, n);
    double dev_ms = 0;  // device time of every op (synchronized per op), per step
    for (const auto& [k, e] : prof.times()) dev_ms += e.seconds * 1e3 / n;
    out["decode_gpu_ms_per_layer"] = dev_ms / double(cfg.num_hidden_layers);
    std::string line;
    std::vector<std::pair<double, std::string>> v;
    for (const auto& [k, e] : prof.times()) v.push_back({e.seconds * 1e3 / n, k});
    std::sort(v.rbegin(), v.rend());
    for (size_t i = 0; i < v.size() && i < 8; ++i) line += fmt::format(" {} {:.2f}", v[i].second, v[i].first);
    say("decode ms/step by op (synchronized per op):" + line);
  };
  if (o.batch > 1) {
    // B sequences over one state pool: the ctx-token context is prefilled once into slot 0 and shared (its full
    // pages in every page table, its window ring and compressor frontiers copied to the other slots); then every
    // step decodes one token of each sequence (random tokens) in one batched forward step.
    const int64_t B = o.batch, shared = StateLayout::pages_for(o.ctx);
    const int64_t own = StateLayout::pages_for(o.ctx + o.steps + 12) - shared;
    StatePool pool = m->make_pool({B, shared + B * own, 0});
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t pg = 0; pg < shared; ++pg) tables[size_t(b)].push_back(int32_t(pg));
      for (int64_t pg = 0; pg < own; ++pg) tables[size_t(b)].push_back(int32_t(shared + b * own + pg));
    }
    int64_t bad = 0;
    const BatchLogitsSink sink = [&](size_t, int64_t, std::span<const float>, bool finite) { bad += finite ? 0 : 1; };
    if (o.ctx > 0) {
      const auto ctx_ids = random_ids(o.ctx, int32_t(cfg.vocab_size), 12);
      Batch b;
      BatchSeq s;
      s.slot = 0;
      s.p0 = 0;
      s.tokens = ctx_ids;
      s.pages = tables[0];
      b.seqs.push_back(std::move(s));
      const auto t0 = Clock::now();
      m->forward(b, pool, sink);
      for (int64_t i = 1; i < B; ++i) pool.copy_slot(0, i);
      say(fmt::format("context of {} tokens prefilled once in {:.1f} s, shared by the {} sequences", o.ctx, since(t0),
                      B));
    }
    std::mt19937 rng(14);
    std::uniform_int_distribution<int32_t> dist(2, int32_t(cfg.vocab_size) - 1);
    std::vector<int32_t> tok(static_cast<size_t>(B));
    for (auto& x : tok) x = dist(rng);
    int64_t pos = o.ctx;
    auto step = [&] {
      Batch b;
      for (int64_t i = 0; i < B; ++i) {
        BatchSeq s;
        s.slot = i;
        s.p0 = pos;
        s.tokens = std::span<const int32_t>(&tok[size_t(i)], 1);
        s.pages = tables[size_t(i)];
        b.seqs.push_back(std::move(s));
      }
      m->forward(b, pool, sink);
      for (auto& x : tok) x = dist(rng);
      ++pos;
    };
    for (int i = 0; i < kWarmSteps; ++i) step();
    m->reset_split_stats();
    const auto t0 = Clock::now();
    for (int i = 0; i < o.steps; ++i) step();
    const double step_s = since(t0) / o.steps;
    report_decode(step_s);
    report_graphs();
    report_split("decode_split", o.steps, step_s);
    out["batch_note"] = "the sequences share one prefilled ctx-token context (full pages shared, ring and frontiers "
                        "copied); weight_bytes_per_step counts the expected distinct routed experts of the batch";
    if (bad > 0) say(fmt::format("warning: {} logit rows were not finite", bad));
    out["nonfinite_logit_rows"] = bad;
    if (!o.no_profile && pos + 2 <= o.ctx + o.steps + 12) {
      ProfiledOps prof(be);
      m->set_op_hook(&prof);
      step();
      step();
      m->set_op_hook(nullptr);
      report_ops(prof, 2);
    }
  } else {
    ModelSequence seq(*m);
    std::vector<float> lg(static_cast<size_t>(cfg.vocab_size));
    const auto ctx_ids = random_ids(std::max<int64_t>(o.ctx, 1), int32_t(cfg.vocab_size), 12);
    seq.append(ctx_ids, lg);
    auto step = [&] {
      const int32_t t = int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin());
      seq.append(std::span<const int32_t>(&t, 1), lg);
    };
    for (int i = 0; i < kWarmSteps; ++i) step();
    m->reset_split_stats();
    const auto t0 = Clock::now();
    for (int i = 0; i < o.steps; ++i) step();
    const double step_s = since(t0) / o.steps;
    report_decode(step_s);
    report_graphs();
    report_split("decode_split", o.steps, step_s);
    if (!o.no_profile) {
      ProfiledOps prof(be);
      m->set_op_hook(&prof);
      const int n = std::min(o.steps, 4);
      for (int i = 0; i < n; ++i) step();
      m->set_op_hook(nullptr);
      report_ops(prof, n);
    }
  }
  if (o.prefill > 0 && !o.no_profile) {
    ProfiledOps prof(be);
    m->set_op_hook(&prof);
    ModelSequence seq(*m);
    std::vector<float> lg(static_cast<size_t>(cfg.vocab_size));
    seq.append(random_ids(o.prefill, int32_t(cfg.vocab_size), 13), lg);
    m->set_op_hook(nullptr);
    out["prefill_ops"] = op_table(prof, 1);
  }
  out["workspace_high_water_bytes"] = be.workspace().high_water();
  if (o.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

void setup_bench_model(CLI::App& app, Runner& run) {
  auto o = std::make_shared<ModelBenchOpts>();
  app.add_option("-m,--model", o->model, "checkpoint folder");
  app.add_option("--config", o->config, "config.json of the model to build (with --load-format dummy)");
  dsv4::cli::add_load_format_option(app, o->load_format, "auto (dummy with --config) | dummy | safetensors");
  app.add_option("--layers", o->layers, "keep the first N layers of the schedule (dummy weights; 0: all)");
  add_device_option(app, o->device);
  add_placement_options(app, o->placement);
  dsv4::cli::add_numerics_option(app, o->numerics, "reference | dense");
  app.add_option("--batch", o->batch, "sequences per decode step (1; > 1: batched decode over one state pool)");
  app.add_option("--ctx", o->ctx, "tokens already in the sequence before the decode steps");
  app.add_option("--prefill", o->prefill, "prefill chunk length (tokens; 0: skip)");
  app.add_option("--steps", o->steps, "timed decode steps");
  app.add_flag("--no-profile", o->no_profile, "skip the per-op breakdown runs");
  app.add_flag("--no-cuda-graph", o->no_cuda_graph, "CUDA: launch every kernel of a step (no recorded step graphs)");
  app.add_flag("--no-pdl", o->no_pdl,
               "CUDA: launch the decode kernels without Programmatic Dependent Launch (each starts when the one before "
               "it completed; same results)");
  app.add_flag("--wgmma", o->wgmma,
               "CUDA: the prefill expert segments on the wgmma kernel instead of mma.sync (compute capability 9.0; "
               "results within the fast mode's tolerance of each other; not yet run on a GPU, so not the default)");
  app.add_option("--timeline", o->timeline,
                 "trace one more prefill without per-op synchronization: per op the host's enqueue time and the "
                 "device's end (TSV rows into FILE), where the device waited for the host (stderr, JSON \"timeline\")")
      ->check(CLI::Validator([](std::string& s) { return s.empty() ? "needs a file name" : std::string(); }, ""));
  app.add_flag("--json", o->json, "print one JSON object on stdout (progress stays on stderr)");
  run = [o] { return run_model_bench(*o); };
}

}  // namespace dsv4::cli
