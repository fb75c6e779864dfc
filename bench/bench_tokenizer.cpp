// Tokenizer throughput (single thread), comparable with tools/oracle/tokenizer_golden.py's HF timing:
//   whole: the corpus lines joined by "\n", repeated until >= 2,000,000 bytes, encoded as one text
//          (special tokens matched, as HF's default);
//   lines: every corpus line encoded separately; decode: the whole text's ids back to bytes.
// Usage: bench_tokenizer [--tokenizer=PATH] [--corpus=PATH] [google-benchmark flags]
//   defaults: models/dsv4-demo/tokenizer.json and tests/data/tokenizer/corpus.jsonl of this source tree.
#include <benchmark/benchmark.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace {

std::filesystem::path g_tokenizer_path, g_corpus_path;

struct Data {
  dsv4::Tokenizer tok;
  std::vector<std::string> lines;
  std::string whole;
  size_t line_bytes = 0;
};

std::vector<std::string> read_corpus(const std::filesystem::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error("cannot open corpus " + p.string());
  std::vector<std::string> out;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).get<std::string>());
  return out;
}

Data& data() {
  static Data d = [] {
    Data x{dsv4::Tokenizer::from_file(g_tokenizer_path), read_corpus(g_corpus_path), {}, 0};
    std::string text;
    for (size_t i = 0; i < x.lines.size(); ++i) {
      if (i) text += '\n';
      text += x.lines[i];
      x.line_bytes += x.lines[i].size();
    }
    x.whole = text;
    while (x.whole.size() < 2000000) x.whole += "\n" + text;
    return x;
  }();
  return d;
}

void BM_encode_whole(benchmark::State& st) {
  Data& d = data();
  size_t n = 0;
  for (auto _ : st) {
    auto ids = d.tok.encode(d.whole, true);
    n = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * d.whole.size()));
  st.counters["tokens"] = static_cast<double>(n);
}
BENCHMARK(BM_encode_whole)->Unit(benchmark::kMillisecond);

void BM_encode_lines(benchmark::State& st) {
  Data& d = data();
  for (auto _ : st)
    for (const auto& l : d.lines) {
      auto ids = d.tok.encode(l, true);
      benchmark::DoNotOptimize(ids.data());
    }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * d.line_bytes));
}
BENCHMARK(BM_encode_lines)->Unit(benchmark::kMillisecond);

void BM_decode_whole(benchmark::State& st) {
  Data& d = data();
  const auto ids = d.tok.encode(d.whole, true);
  for (auto _ : st) {
    auto s = d.tok.decode(ids);
    benchmark::DoNotOptimize(s.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * d.whole.size()));
}
BENCHMARK(BM_decode_whole)->Unit(benchmark::kMillisecond);

void BM_load(benchmark::State& st) {
  for (auto _ : st) benchmark::DoNotOptimize(dsv4::Tokenizer::from_file(g_tokenizer_path).n_vocab());
}
BENCHMARK(BM_load)->Unit(benchmark::kMillisecond)->Iterations(2);

}  // namespace

int main(int argc, char** argv) {
  const std::filesystem::path root = std::filesystem::path(__FILE__).parent_path().parent_path();
  g_tokenizer_path = root / "models/dsv4-demo/tokenizer.json";
  g_corpus_path = root / "tests/data/tokenizer/corpus.jsonl";
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--tokenizer=", 12) == 0)
      g_tokenizer_path = argv[i] + 12;
    else if (std::strncmp(argv[i], "--corpus=", 9) == 0)
      g_corpus_path = argv[i] + 9;
    else
      rest.push_back(argv[i]);
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
