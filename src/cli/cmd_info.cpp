// `dsv4 info -m MODEL_DIR [--json]`: open and validate a checkpoint folder (config.json + safetensors), then print
// the architecture, layer schedule, parameter counts, bytes by dtype, weight formats and decode-state sizes.
// Reads only the headers (weights are memory-mapped, never touched), so it is fast on a 160 GB checkpoint.
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "loader/config.h"
#include "loader/safetensors.h"
#include "loader/state_size.h"
#include "loader/summary.h"
#include "loader/weights.h"
#include "model/state_layout.h"

namespace dsv4::cli {
namespace {

struct InfoOpts {
  std::string model;
  bool json = false;
};

std::string group3(uint64_t v) {
  std::string s = std::to_string(v), r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) r += ',';
    r += s[i];
  }
  return r;
}

std::string schedule_str(const ModelConfig& c) {
  // Run-length view: "0-1:0 2:4 3:128 ..." compacted to alternating patterns where possible.
  std::string s;
  int l = 0;
  const int n = c.num_hidden_layers;
  while (l < n) {
    int e = l;
    while (e + 1 < n && c.compress_ratios[e + 1] == c.compress_ratios[l]) ++e;
    if (e == l && l + 3 < n && c.compress_ratios[l + 2] == c.compress_ratios[l] &&
        c.compress_ratios[l + 1] != c.compress_ratios[l] && c.compress_ratios[l + 3] == c.compress_ratios[l + 1]) {
      // alternating pair run
      int p = l;
      while (p + 3 < n && c.compress_ratios[p + 2] == c.compress_ratios[l] && c.compress_ratios[p + 3] == c.compress_ratios[l + 1])
        p += 2;
      s += fmt::format("{}{}-{}:[{},{}]", s.empty() ? "" : " ", l, p + 1, c.compress_ratios[l], c.compress_ratios[l + 1]);
      l = p + 2;
      continue;
    }
    s += fmt::format("{}{}{}:{}", s.empty() ? "" : " ", l, e > l ? "-" + std::to_string(e) : "", c.compress_ratios[l]);
    l = e + 1;
  }
  for (int k = 0; k < c.num_draft_layers(); ++k)
    s += fmt::format(" {}{}:{}", c.dspark.present ? "dspark" : "mtp", k, c.compress_ratios[n + k]);
  return s;
}

std::string expert_format(const ModelWeights& w) {
  for (const auto& L : w.layers)
    if (!L.ffn.experts.empty()) return weight_format_name(L.ffn.experts[0].w1.fmt);
  return "none";
}

int run_info(const InfoOpts& o) {
  const std::filesystem::path dir = o.model;
  const ModelConfig cfg = load_config(dir / "config.json");
  const SafetensorsSet set = SafetensorsSet::open(dir);
  const ModelWeights w = bind_weights(set, cfg);
  const CheckpointSummary s = summarize(set, cfg, w);
  // Sequence state as stored: the CPU backend in reference numerics (the default numerics) keeps compact rows when
  // the config's dims fit them (model/state_layout.h); dense numerics and the CUDA backend keep fp32 rows.
  const bool compact = StateLayout::compact_fits(cfg);
  const int64_t n_ctx = cfg.max_position_embeddings;
  struct StateSizes {
    const char* rows;
    const char* used_by;
    uint64_t kv_row, key_row, fixed, per_seq;
    double per_tok;
    StateLayout paged;  // the engine loop's pool
  };
  auto sizes = [&](bool c, const char* used_by) {
    return StateSizes{c ? "compact" : "f32", used_by,
                      state_kv_row_bytes(cfg, c), state_key_row_bytes(cfg, c),
                      state_bytes_fixed_per_sequence(cfg, false, c), state_bytes_total(cfg, n_ctx, false, c),
                      state_bytes_per_token(cfg, false, c),
                      StateLayout::of(cfg, false, c ? RowFormat::compact : RowFormat::f32)};
  };
  const StateSizes st = sizes(compact, compact ? "cpu backend, reference numerics" : "every backend and numerics");
  const StateSizes st32 = sizes(false, compact ? "dense numerics; cuda backend" : "every backend and numerics");
  const StateLayout& paged = st.paged;
  const int n_swa = cfg.count_layers_with_ratio(0), n_csa = cfg.count_layers_with_ratio(4),
            n_hca = cfg.count_layers_with_ratio(128);
  const std::string dense_fmt = weight_format_name(w.layers.empty() ? WeightFormat::BF16 : w.layers[0].attn.wq_a.fmt);
  const std::string exp_fmt = expert_format(w);
  // GPU memory of the CUDA backend: the main (non-MTP) tensors as stored, tid2eid as int32, plus the workspace and
  // first-sequence allowance the loader checks for (model/model.cpp); state per sequence on top (below).
  uint64_t gpu_weights = s.bytes_main;
  // the drafter that --spec-draft would run (model/speculation.h, docs/dspark.md)
  const bool dspark = cfg.dspark.present && w.dspark.bound();
  const bool mtp = !w.mtp.empty();
  const char* drafter = dspark ? "dspark" : mtp ? "mtp" : "none";
  const int max_draft = dspark ? cfg.dspark.block_size : mtp ? int(StateLayout::kMaxMtpDraft) : 0;
  for (const auto& L : w.layers)
    if (L.ffn.tid2eid.bound() && L.ffn.tid2eid.fmt == WeightFormat::I64) gpu_weights -= L.ffn.tid2eid.w->nbytes / 2;
  const uint64_t gpu_needed = gpu_weights + (uint64_t(1) << 30);

  if (o.json) {
    nlohmann::json j;
    j["model_dir"] = dir.string();
    j["model_type"] = cfg.model_type;
    j["architectures"] = cfg.architectures;
    j["num_hidden_layers"] = cfg.num_hidden_layers;
    j["num_mtp_layers"] = cfg.num_mtp_layers();
    j["mtp_bound"] = !w.mtp.empty();
    j["dspark_drafter"] = cfg.dspark.present;
    j["drafter"] = drafter;
    j["max_spec_draft"] = max_draft;
    if (cfg.dspark.present)
      j["dspark"] = {{"block_size", cfg.dspark.block_size},       {"stages", cfg.dspark.n_stages},
                     {"target_layer_ids", cfg.dspark.target_layer_ids}, {"markov_rank", cfg.dspark.markov_rank},
                     {"noise_token_id", cfg.dspark.noise_token_id}, {"bound", w.dspark.bound()}};
    j["compress_ratios"] = cfg.compress_ratios;
    j["layer_kinds"] = {{"sliding_window", n_swa}, {"csa_ratio4", n_csa}, {"hca_ratio128", n_hca}};
    j["num_hash_layers"] = cfg.num_hash_layers;
    j["hidden_size"] = cfg.hidden_size;
    j["num_attention_heads"] = cfg.num_attention_heads;
    j["head_dim"] = cfg.head_dim;
    j["vocab_size"] = cfg.vocab_size;
    j["n_routed_experts"] = cfg.n_routed_experts;
    j["num_experts_per_tok"] = cfg.num_experts_per_tok;
    j["max_position_embeddings"] = cfg.max_position_embeddings;
    j["params_main"] = s.params_main;
    j["params_mtp"] = s.params_mtp;
    j["params_total"] = s.params_total;
    j["params_routed_experts"] = s.params_routed;
    j["params_active"] = s.params_active;
    j["bytes_total"] = s.bytes_total;
    j["bytes_main"] = s.bytes_main;
    j["bytes_by_dtype"] = s.bytes_by_dtype;
    j["n_tensors"] = s.n_tensors;
    j["n_files"] = s.n_files;
    const auto& q = cfg.quantization;
    j["quantization"] = {{"present", q.present},
                         {"quant_method", q.quant_method},
                         {"fmt", q.fmt},
                         {"scale_fmt", q.scale_fmt},
                         {"weight_block_size", {q.weight_block_rows, q.weight_block_cols}},
                         {"expert_dtype", q.expert_dtype},
                         {"dense_linear_format", dense_fmt},
                         {"expert_format", exp_fmt},
                         {"weights_by_format", s.weights_by_format}};
    // the first state format (cpu, reference numerics) at the top level; both in "state_formats"
    j["state_row_format"] = st.rows;
    j["state_bytes_per_token"] = st.per_tok;
    j["state_bytes_fixed_per_sequence"] = st.fixed;
    j["state_bytes_per_sequence"] = st.per_seq;  // at max_position_embeddings tokens
    auto fmt_json = [](const StateSizes& x) {
      return nlohmann::json{{"row_format", x.rows},
                            {"used_by", x.used_by},
                            {"kv_row_bytes", x.kv_row},
                            {"key_row_bytes", x.key_row},
                            {"bytes_per_token", x.per_tok},
                            {"bytes_fixed_per_sequence", x.fixed},
                            {"bytes_per_sequence", x.per_seq}};
    };
    j["state_formats"] = nlohmann::json::array({fmt_json(st)});
    if (compact) j["state_formats"].push_back(fmt_json(st32));
    auto paged_json = [](const StateLayout& p) {
      return nlohmann::json{{"layout_version", StateLayout::kVersion},
                            {"row_format", row_format_name(p.row_format)},
                            {"page_tokens", StateLayout::kPageTokens},
                            {"page_bytes", p.page_bytes},
                            {"bytes_per_token", p.bytes_per_token()},
                            {"slot_bytes_per_sequence", p.slot_bytes},
                            {"snapshot_bytes", p.snapshot_bytes}};
    };
    j["paged_state"] = paged_json(paged);
    j["paged_state_f32"] = paged_json(st32.paged);
    j["gpu_bytes_weights"] = gpu_weights;
    j["gpu_bytes_needed"] = gpu_needed;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  auto gb = [](double v) { return fmt::format("{:.2f}B", v / 1e9); };
  auto gib = [](double v) { return fmt::format("{:.2f} GiB", v / double(1ull << 30)); };
  std::printf("model        %s\n", dir.string().c_str());
  std::printf("architecture %s (%s)%s\n", cfg.model_type.c_str(),
              cfg.architectures.empty() ? "-" : cfg.architectures[0].c_str(),
              cfg.dspark.present ? ", mtp.* = DSpark drafter" : "");
  std::printf("layers       %d main + %d %s: %d sliding-window only, %d CSA (ratio 4), %d HCA (ratio 128); "
              "hash-routed: first %d\n",
              cfg.num_hidden_layers, cfg.num_draft_layers(), cfg.dspark.present ? "DSpark stages" : "MTP", n_swa, n_csa,
              n_hca, cfg.num_hash_layers);
  if (dspark) {
    std::string t;
    for (int id : cfg.dspark.target_layer_ids) t += (t.empty() ? "" : ",") + std::to_string(id);
    std::printf("drafter      DSpark (mtp.*): %d stages, block %d, target layers %s, Markov rank %d, noise token %lld; "
                "--spec-draft 1-%d\n",
                cfg.dspark.n_stages, cfg.dspark.block_size, t.c_str(), cfg.dspark.markov_rank,
                (long long)cfg.dspark.noise_token_id, max_draft);
  } else if (mtp) {
    std::printf("drafter      MTP module (mtp.0): --spec-draft 1-%d\n", max_draft);
  } else {
    std::printf("drafter      none (%s): no --spec-draft\n",
                cfg.num_draft_layers() > 0 ? "the config names one but the checkpoint has no mtp.* tensors"
                                           : "the config has no MTP layer and no dspark_* keys");
  }
  std::printf("schedule     %s\n", schedule_str(cfg).c_str());
  std::printf("dims         hidden %lld, %d heads x %d (rope %d), q_lora %lld, o %d groups x %lld, window %d, "
              "vocab %lld, context %lld\n",
              (long long)cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim,
              (long long)cfg.q_lora_rank, cfg.o_groups, (long long)cfg.o_lora_rank, cfg.sliding_window,
              (long long)cfg.vocab_size, (long long)cfg.max_position_embeddings);
  std::printf("moe          %d routed (top %d, inter %lld) + %d shared, %s, scale %g; indexer %d x %d top %d; "
              "mHC %d streams\n",
              cfg.n_routed_experts, cfg.num_experts_per_tok, (long long)cfg.moe_intermediate_size,
              cfg.n_shared_experts, cfg.scoring_func.c_str(), cfg.routed_scaling_factor, cfg.index_n_heads,
              cfg.index_head_dim, cfg.index_topk, cfg.hc_mult);
  std::printf("params       %s main (%s), %s with the drafter (%s), %s active per token\n",
              gb(double(s.params_main)).c_str(),
              group3(s.params_main).c_str(), gb(double(s.params_total)).c_str(), group3(s.params_total).c_str(),
              gb(double(s.params_active)).c_str());
  std::string by;
  for (const auto& [k, v] : s.bytes_by_dtype) by += fmt::format("{}{} {}", by.empty() ? "" : ", ", k, gib(double(v)));
  std::printf("bytes        %s (%s) in %zu files, %zu tensors; %s\n", group3(s.bytes_total).c_str(),
              gib(double(s.bytes_total)).c_str(), s.n_files, s.n_tensors, by.c_str());
  std::printf("weights      dense linears %s, routed experts %s, scales %s (block %lldx%lld); memory-mapped %s\n",
              dense_fmt.c_str(), exp_fmt.c_str(), cfg.quantization.scale_fmt.empty() ? "-" : cfg.quantization.scale_fmt.c_str(),
              (long long)cfg.quantization.weight_block_rows, (long long)cfg.quantization.weight_block_cols,
              gib(double(s.bytes_total)).c_str());
  std::printf("gpu memory   %s of weights + ~1 GiB workspace = %s to load on one GPU (--device cuda), plus the state "
              "below per sequence\n",
              gib(double(gpu_weights)).c_str(), gib(double(gpu_needed)).c_str());
  for (const StateSizes* x : {&st, &st32}) {
    if (x == &st32 && !compact) break;
    std::printf("state        %s rows (%s): %s B/token + %s B fixed per sequence = %s per sequence at %lld tokens "
                "(KV row %s B, indexer key row %s B)\n",
                x->rows, x->used_by, fmt::format("{:.2f}", x->per_tok).c_str(), group3(x->fixed).c_str(),
                gib(double(x->per_seq)).c_str(), (long long)n_ctx, group3(x->kv_row).c_str(),
                group3(x->key_row).c_str());
  }
  std::printf("paged state  %s rows: %s B per %lld-token page (%s B/token), %s B slot per running sequence, %s B "
              "per prefix-cache snapshot\n",
              row_format_name(paged.row_format), group3(paged.page_bytes).c_str(),
              (long long)StateLayout::kPageTokens, group3(uint64_t(paged.bytes_per_token())).c_str(),
              group3(paged.slot_bytes).c_str(), group3(paged.snapshot_bytes).c_str());
  return 0;
}

void setup_info(CLI::App& app, Runner& run) {
  auto o = std::make_shared<InfoOpts>();
  app.add_option("-m,--model", o->model, "checkpoint folder (config.json + safetensors)")->required();
  app.add_flag("--json", o->json, "print one JSON object");
  run = [o] { return run_info(*o); };
}

}  // namespace

DSV4_COMMAND(info, "Summarise and validate a checkpoint folder", setup_info);

}  // namespace dsv4::cli
