// Host cost of one forward step's plan (model/step_plan.h) for a prefill chunk: StepPlan::rebuild (positions ->
// arrays, into the plan of the step before), then DevicePlan::upload (pack into a staging buffer kept across steps
// + one copy) on the CPU backend, as Model::forward does. No weights: the plan depends on the config and the
// positions alone.
//
//   build/bench_step_plan [--config FILE] [--tokens N] [--p0 P] [--reps R] [--threads T] [--drafter] [--fresh]
//                         [--cold-rope]
//
// --fresh: a new plan per rep (StepPlan::build, as the lanes and verify steps do); --cold-rope: new RoPE caches per
// rep (the first step that reaches these positions).
// Run from the repository root. Defaults: V4-Flash (tests/data/configs/deepseek-v4-flash-config.json), one
// sequence of 8,192 tokens at position 0, 15 timed reps after one untimed, the OpenMP pool's threads. Prints one
// JSON object: the per-rep times in ms (build, pack + upload) and the medians (build, pack + upload, both).
#include <algorithm>
#include <exception>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/parallel.h"
#include "loader/config.h"
#include "model/rope_cache.h"
#include "model/state_layout.h"
#include "model/step_plan.h"

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

std::string list(const std::vector<double>& v) {
  std::string s = "[";
  char b[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(b, sizeof b, i ? ",%.3f" : "%.3f", v[i]);
    s += b;
  }
  s += "]";
  return s;
}

}  // namespace

int run(int argc, char** argv) {
  using namespace dsv4;
  std::string config = "tests/data/configs/deepseek-v4-flash-config.json";
  int64_t tokens = 8192, p0 = 0;
  int reps = 15, threads = 0;
  bool drafter = false, fresh = false, cold_rope = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_step_plan: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--config") config = next();
    else if (a == "--tokens") tokens = std::atoll(next());
    else if (a == "--p0") p0 = std::atoll(next());
    else if (a == "--reps") reps = std::atoi(next());
    else if (a == "--threads") threads = std::atoi(next());
    else if (a == "--drafter") drafter = true;
    else if (a == "--fresh") fresh = true;
    else if (a == "--cold-rope") cold_rope = true;
    else {
      std::fprintf(stderr, "usage: bench_step_plan [--config FILE] [--tokens N] [--p0 P] [--reps R] [--threads T] "
                           "[--drafter] [--fresh] [--cold-rope]\n");
      return 2;
    }
  }
  if (tokens < 1 || p0 < 0 || reps < 1) {
    std::fprintf(stderr, "bench_step_plan: --tokens and --reps must be >= 1, --p0 >= 0\n");
    return 2;
  }
  set_num_threads(threads);
  const ModelConfig cfg = load_config(config);
  const StateLayout layout = StateLayout::of(cfg, drafter);
  auto rope = [&](int ratio) { return RopeCache(RopeTable::for_ratio(cfg, ratio), cfg.max_position_embeddings); };
  RopeCache plain = rope(0), yarn = rope(4);
  std::unique_ptr<Backend> be = make_backend(Device{});

  std::vector<int32_t> tok(static_cast<size_t>(tokens));
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 7919) % size_t(cfg.vocab_size));
  std::vector<int32_t> pages(static_cast<size_t>(StateLayout::pages_for(p0 + tokens)));
  std::iota(pages.begin(), pages.end(), 0);
  auto pieces = [&] {
    PlanPiece pc;
    pc.p0 = p0;
    pc.tokens = tok;
    pc.pages = pages;
    pc.want.assign(tok.size(), 0);
    pc.want.back() = 1;
    if (layout.has_mtp()) pc.next.assign(tok.size(), 1);
    std::vector<PlanPiece> v;
    v.push_back(std::move(pc));
    return v;
  };

  std::vector<uint8_t> staging;
  StepPlan plan;
  std::vector<double> t_build, t_upload, t_all;
  for (int r = -1; r < reps; ++r) {
    std::vector<PlanPiece> pcs = pieces();
    Workspace& ws = be->workspace();
    Workspace::Scope scope(ws);
    if (cold_rope) plain = rope(0), yarn = rope(4);
    if (fresh) plan = StepPlan{};
    const double t0 = now_ms();
    if (fresh)
      plan = StepPlan::build(cfg, layout, plain, yarn, 1, std::move(pcs));
    else
      plan.rebuild(cfg, layout, plain, yarn, 1, std::move(pcs));
    const double t1 = now_ms();
    const DevicePlan dp = DevicePlan::upload(plan, *be, ws, &staging);
    const double t2 = now_ms();
    if (dp.tokens == nullptr) return 1;
    if (r < 0) continue;  // untimed: first touch of the workspace and the staging buffer
    t_build.push_back(t1 - t0);
    t_upload.push_back(t2 - t1);
    t_all.push_back(t2 - t0);
  }
  std::printf("{\"tokens\":%lld,\"p0\":%lld,\"threads\":%d,\"drafter\":%s,\"fresh\":%s,\"cold_rope\":%s,"
              "\"build_ms_median\":%.3f,\"pack_upload_ms_median\":%.3f,\"total_ms_median\":%.3f,\"build_ms\":%s,"
              "\"pack_upload_ms\":%s}\n",
              (long long)tokens, (long long)p0, max_threads(), drafter ? "true" : "false",
              fresh ? "true" : "false", cold_rope ? "true" : "false", median(t_build),
              median(t_upload), median(t_all), list(t_build).c_str(), list(t_upload).c_str());
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_step_plan: %s\n", e.what());
    return 1;
  }
}
