// `dsv4 profile-experts`: routed-expert usage of a model over a prompt file, for --hot-experts (issue 11).
//   dsv4 profile-experts -m DIR --prompts FILE -o PROFILE.json [--device D] [--numerics N] [--threads N]
// Every non-empty line of the prompt file is one prompt (raw text, BOS prepended, special tokens parsed), prefilled
// as a fresh sequence; every main layer's router choices are counted per (token, slot). The profile format is
// described in model/expert_placement.h.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "backend/numerics.h"
#include "backend/parallel.h"
#include "cli/int_option.h"
#include "cli/numerics_option.h"
#include "cli/command.h"
#include "cli/device_option.h"
#include "core/error.h"
#include "engine/model_loader.h"
#include "model/expert_placement.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Opts {
  std::string model, prompts, out, numerics = "reference", device;
  int threads = 0;
};

int run_profile(const Opts& o) {
  using namespace dsv4;
  const auto num = parse_numerics(o.numerics);
  if (!num) fail("--numerics must be 'reference' or 'dense', got '{}'", o.numerics);
  if (!std::filesystem::is_directory(o.model)) fail("{}: not a model folder (no such directory)", o.model);
  const auto tj = std::filesystem::path(o.model) / "tokenizer.json";
  if (!std::filesystem::exists(tj)) fail("{}: no tokenizer.json (profile-experts reads text prompts)", o.model);
  std::ifstream pf(o.prompts);
  if (!pf) fail("--prompts {}: cannot open the file", o.prompts);
  std::vector<std::string> prompts;
  for (std::string line; std::getline(pf, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) prompts.push_back(line);
  if (prompts.empty()) fail("--prompts {}: no prompt (one prompt per non-empty line)", o.prompts);

  set_num_threads(o.threads);
  ModelOptions mo;
  mo.numerics = *num;
  mo.device = cli::resolve_device(o.device);
  auto model = Model::load(o.model, mo);
  const Tokenizer tok = Tokenizer::from_file(tj);
  const ModelConfig& c = model->config();
  ExpertProfile prof;
  prof.model = model_folder_name(o.model);
  prof.top_k = c.num_experts_per_tok;
  prof.hidden_size = c.hidden_size;
  prof.vocab_size = c.vocab_size;
  prof.counts.assign(size_t(c.num_hidden_layers), std::vector<uint64_t>(size_t(c.n_routed_experts), 0));
  model->set_route_observer([&](int layer, const int32_t* ids, int64_t n, int64_t k) {
    for (int64_t i = 0; i < n * k; ++i)
      if (ids[i] >= 0 && ids[i] < c.n_routed_experts) ++prof.counts[size_t(layer)][size_t(ids[i])];
  });
  for (const std::string& p : prompts) {
    std::vector<int32_t> ids = tok.encode(p, true);
    if (ids.empty() || ids.front() != model->bos_id()) ids.insert(ids.begin(), model->bos_id());
    if (int64_t(ids.size()) >= model->max_context())
      fail("--prompts {}: a prompt of {} tokens exceeds the context ({})", o.prompts, ids.size(), model->max_context());
    SequenceState st = model->fresh_state();
    model->forward(st, ids, [](int64_t) { return false; }, nullptr);
    ++prof.prompts;
    prof.tokens += int64_t(ids.size());
  }
  model->set_route_observer(nullptr);
  write_expert_profile(prof, o.out);
  std::fprintf(stderr, "profile-experts: %lld prompts, %lld tokens, %d layers x %d experts -> %s\n",
               static_cast<long long>(prof.prompts), static_cast<long long>(prof.tokens), c.num_hidden_layers,
               c.n_routed_experts, o.out.c_str());
  return 0;
}

void setup_profile_experts(CLI::App& app, dsv4::cli::Runner& run) {
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "model folder")->required();
  app.add_option("--prompts", o->prompts, "prompt file: one prompt per non-empty line")->required();
  app.add_option("-o,--output", o->out, "profile to write (JSON; read by --hot-experts)")->required();
  dsv4::cli::add_numerics_option(app, o->numerics, "reference | dense");
  app.add_option("--threads", o->threads, "CPU threads (0: all cores)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, 4096));
  dsv4::cli::add_device_option(app, o->device);
  run = [o] { return run_profile(*o); };
}

}  // namespace

static ::dsv4::cli::Registrar dsv4_command_registrar_profile_experts(
    "profile-experts", "Count routed-expert usage over a prompt file (a profile for --hot-experts)",
    setup_profile_experts);
