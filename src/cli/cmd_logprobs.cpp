// `dsv4 logprobs`: next-token log-probabilities of every position of a prompt given as token ids (validation against
// golden fixtures). Natural-log, descending top-k per position; non-finite logits are an error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/numerics_option.h"
#include "cli/command.h"
#include "cli/config_checks.h"
#include "cli/device_option.h"
#include "cli/int_list_option.h"
#include "cli/int_option.h"
#include "cli/placement_option.h"
#include "core/error.h"
#include "model/model.h"
#include "model/sequence.h"

namespace {

struct Opts {
  std::string model;
  std::vector<int32_t> ids;
  int top_k = 20;
  std::string numerics = "reference";
  std::string device;
  int64_t chunk = 0;
  bool json = false;
  dsv4::PlacementOptions placement;
};

struct PosResult {
  std::vector<int32_t> ids;
  std::vector<double> logprobs;
};

PosResult top_logprobs(std::span<const float> lg, int k) {
  double mx = -INFINITY;
  for (float v : lg) mx = std::max(mx, double(v));
  double s = 0;
  for (float v : lg) s += std::exp(double(v) - mx);
  const double lse = mx + std::log(s);
  std::vector<int32_t> order(lg.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t kk = std::min<size_t>(size_t(k), lg.size());
  std::partial_sort(order.begin(), order.begin() + kk, order.end(),
                    [&](int32_t a, int32_t b) { return lg[a] > lg[b] || (lg[a] == lg[b] && a < b); });
  PosResult r;
  for (size_t i = 0; i < kk; ++i) {
    r.ids.push_back(order[i]);
    r.logprobs.push_back(double(lg[order[i]]) - lse);
  }
  return r;
}

void setup_logprobs(CLI::App& app, dsv4::cli::Runner& run) {
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "model folder (config.json + safetensors)")->required();
  dsv4::cli::add_int_list_option(app, "--prompt-ids", o->ids, "comma-separated token ids, e.g. 0,15,27", 0, INT32_MAX)
      ->required();
  app.add_option("--top-k", o->top_k, "entries per position (default 20)")
      ->transform(dsv4::cli::integer_in<int64_t>(1, 1 << 20));
  dsv4::cli::add_numerics_option(app, o->numerics, "reference | dense (default reference)");
  app.add_option("--chunk", o->chunk, "feed the prompt in chunks of N tokens (default: one prefill)")
      ->transform(dsv4::cli::integer_in<int64_t>(0, int64_t(1) << 40));
  dsv4::cli::add_device_option(app, o->device);
  dsv4::cli::add_placement_options(app, o->placement);
  app.add_flag("--json", o->json, "print JSON {\"positions\": [{\"top_ids\", \"top_logprobs\"}, ...]}");
  run = [o] {
    const auto num = dsv4::parse_numerics(o->numerics);
    if (!num) dsv4::usage_fail("--numerics must be 'reference' or 'dense' (got '{}')", o->numerics);
    const std::vector<int32_t>& ids = o->ids;
    if (const std::optional<dsv4::ModelConfig> cfg = dsv4::cli::config_if_present(o->model)) {  // before loading
      dsv4::cli::check_prompt_ids(*cfg, ids);
      dsv4::check_placement(*cfg, o->placement);
    }
    dsv4::ModelOptions mo;
    mo.numerics = *num;
    mo.device = dsv4::cli::resolve_device(o->device);
    mo.placement = o->placement;
    auto model = dsv4::Model::load(o->model, mo);
    std::fprintf(stderr, "device: %s\n", model->backend().description().c_str());
    dsv4::ModelSequence seq(*model);
    std::vector<PosResult> res(ids.size());
    const int64_t chunk = o->chunk > 0 ? o->chunk : int64_t(ids.size());
    for (size_t i = 0; i < ids.size(); i += size_t(chunk)) {
      const size_t n = std::min(ids.size() - i, size_t(chunk));
      seq.append_all(std::span<const int32_t>(ids.data() + i, n), [&](int64_t p, std::span<const float> lg) {
        res[size_t(p)] = top_logprobs(lg, o->top_k);
      });
    }
    if (o->json) {
      nlohmann::json j;
      j["positions"] = nlohmann::json::array();
      for (const auto& r : res) j["positions"].push_back({{"top_ids", r.ids}, {"top_logprobs", r.logprobs}});
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%6s %8s  top entries (id:logprob)\n", "pos", "input");
      for (size_t p = 0; p < res.size(); ++p) {
        std::string line;
        for (size_t i = 0; i < res[p].ids.size() && i < 8; ++i)
          line += fmt::format(" {}:{:.4f}", res[p].ids[i], res[p].logprobs[i]);
        std::printf("%6zu %8d %s\n", p, ids[p], line.c_str());
      }
    }
    return 0;
  };
}

}  // namespace

DSV4_COMMAND(logprobs, "Next-token log-probabilities of every prompt position (token ids in, top-k out)",
             setup_logprobs);
