// Sampler cost per token on a V4-sized vocabulary (129,280 logits): greedy, temperature, top-k, top-p, min-p and
// penalties. Run: build/bench_sampling
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "sampling/sampler.h"
#include "sampling/stop_matcher.h"

namespace {

constexpr int32_t kVocab = 129280;

// Logits shaped like a language model's: a few likely tokens over a long Gaussian tail.
std::vector<float> make_logits(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> l(kVocab);
  for (auto& x : l) x = nd(rng);
  for (int i = 0; i < 20; ++i) l[rng() % kVocab] += 12.0f;
  return l;
}

void run(benchmark::State& state, dsv4::SamplingParams p) {
  const auto base = make_logits(1);
  dsv4::Sampler s(p, kVocab);
  std::vector<int32_t> prompt(2000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919) % kVocab);
  s.set_prompt(prompt);
  std::vector<float> l(kVocab);
  for (auto _ : state) {
    std::copy(base.begin(), base.end(), l.begin());
    int32_t t = s.sample(l);
    s.accept(t);
    benchmark::DoNotOptimize(t);
  }
  state.SetItemsProcessed(state.iterations());
}

dsv4::SamplingParams P(float temp, int top_k = 0, float top_p = 1.0f, float min_p = 0.0f, float rep = 1.0f,
                       float pres = 0.0f) {
  dsv4::SamplingParams p;
  p.temperature = temp;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repetition_penalty = rep;
  p.presence_penalty = pres;
  p.seed = 7;
  return p;
}

void BM_Greedy(benchmark::State& st) { run(st, P(0.0f)); }
void BM_Temperature(benchmark::State& st) { run(st, P(1.0f)); }
void BM_TopK40(benchmark::State& st) { run(st, P(0.8f, 40)); }
void BM_TopP095(benchmark::State& st) { run(st, P(1.0f, 0, 0.95f)); }
void BM_MinP005(benchmark::State& st) { run(st, P(1.0f, 0, 1.0f, 0.05f)); }
void BM_AllWithPenalties(benchmark::State& st) { run(st, P(0.7f, 50, 0.9f, 0.02f, 1.1f, 0.5f)); }

void BM_StopMatcher(benchmark::State& st) {
  dsv4::StopMatcher m({"</answer>", "\n\nUser:", "STOP"});
  const std::string piece = " token";
  for (auto _ : st) benchmark::DoNotOptimize(m.push(piece));
  st.SetItemsProcessed(st.iterations());
}

}  // namespace

BENCHMARK(BM_Greedy);
BENCHMARK(BM_Temperature);
BENCHMARK(BM_TopK40);
BENCHMARK(BM_TopP095);
BENCHMARK(BM_MinP005);
BENCHMARK(BM_AllWithPenalties);
BENCHMARK(BM_StopMatcher);
BENCHMARK_MAIN();
