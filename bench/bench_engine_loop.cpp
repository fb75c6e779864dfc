// Aggregate generation throughput of the continuous-batching engine loop (src/engine/engine_loop.h) on the demo
// model (CPU), with 1 .. 16 concurrent requests (issue 10: >= 3x at 8 concurrent vs 1).
//   Decode/<n>:  n requests of a 32-token prompt generating 64 tokens each (ignore_eos), submitted at once; tok/s =
//                generated tokens / wall time (prefill included, as clients see it); step_tok = tokens per step.
//   Prefill/<n>: n requests of a 512-token prompt, 1 generated token each; tok/s = prompt tokens / wall time.
// Every iteration uses a fresh loop (no prefix-cache hits between iterations). Compare ratios, not absolute numbers,
// on a noisy machine. Usage: bench_engine_loop [--model=DIR] [--threads=N] [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/parallel.h"
#include "engine/engine_loop.h"
#include "model/model.h"

namespace {

std::filesystem::path g_model;
int g_threads = 0;

std::shared_ptr<const dsv4::Model> demo() {
  static std::shared_ptr<const dsv4::Model> m = [] {
    dsv4::ModelOptions o;
    o.n_threads = g_threads;
    return std::shared_ptr<const dsv4::Model>(dsv4::Model::load(g_model, o));
  }();
  return m;
}

std::vector<int32_t> prompt(int64_t n, int salt) {
  std::vector<int32_t> v{0};
  for (int64_t i = 1; i < n; ++i) v.push_back(int32_t(1000 + (i * 7919 + salt * 104729) % 120000));
  return v;
}

void run(benchmark::State& st, int64_t prompt_len, int64_t gen, bool count_prompt) {
  const auto m = demo();
  const int64_t n = st.range(0);
  int64_t tokens = 0, steps = 0, step_tokens = 0;
  for (auto _ : st) {
    dsv4::EngineLoopOptions o;
    o.max_running = std::max<int64_t>(n, 1);
    o.batch_tokens = 512;
    o.state_bytes = uint64_t(512) << 20;
    o.start_thread = false;
    dsv4::EngineLoop loop(m, o);
    std::vector<std::shared_ptr<dsv4::RequestStream>> streams;
    for (int64_t r = 0; r < n; ++r) {
      dsv4::EngineRequest q;
      q.prompt = prompt(prompt_len, int(r + 1));
      q.sampling.temperature = 0.0f;
      q.max_tokens = gen;
      q.ignore_eos = true;
      streams.push_back(loop.submit(q));
    }
    loop.run_until_idle();
    for (const auto& s : streams) tokens += count_prompt ? prompt_len : int64_t(s->wait().tokens.size());
    const auto stats = loop.stats();
    steps += stats.steps;
    step_tokens += stats.step_tokens;
  }
  st.counters["tok/s"] = benchmark::Counter(double(tokens), benchmark::Counter::kIsRate);
  st.counters["step_tok"] = steps ? double(step_tokens) / double(steps) : 0.0;
}

void BM_Decode(benchmark::State& st) { run(st, 32, 64, false); }
BENCHMARK(BM_Decode)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Prefill(benchmark::State& st) { run(st, 512, 1, true); }
BENCHMARK(BM_Prefill)->Arg(1)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  const std::filesystem::path root = std::filesystem::path(__FILE__).parent_path().parent_path();
  g_model = root / "models/dsv4-demo";
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--model=", 8) == 0)
      g_model = argv[i] + 8;
    else if (std::strncmp(argv[i], "--threads=", 10) == 0)
      g_threads = std::atoi(argv[i] + 10);
    else
      rest.push_back(argv[i]);
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
