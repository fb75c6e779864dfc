// Usage errors that only the model's config.json can tell: a --ctx beyond its positions, a prompt token id beyond
// its vocabulary, a draft count its drafter cannot make (Model::check_draft), an expert placement beyond its layers or
// experts (check_placement). Found before the model loads (minutes for a large model): exit 2, one line, nothing
// printed before it. A folder without config.json is left to the loader, which names what is missing.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>

#include "core/error.h"
#include "loader/config.h"

namespace dsv4::cli {

// DIR/config.json, or nullopt when the folder has none (a malformed one throws, as the loader would).
inline std::optional<ModelConfig> config_if_present(const std::string& model_dir) {
  const std::filesystem::path p = std::filesystem::path(model_dir) / "config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec)) return std::nullopt;
  return load_config(p);
}

// --ctx N (0: the model's maximum) within the model's positions.
inline void check_ctx(const ModelConfig& cfg, int64_t ctx) {
  if (ctx > cfg.max_position_embeddings)
    usage_fail("--ctx {}: the model has {} positions (max_position_embeddings; 0: all of them)", ctx,
               cfg.max_position_embeddings);
}

// --prompt-ids: every id in the vocabulary, and all of them within the model's positions.
inline void check_prompt_ids(const ModelConfig& cfg, std::span<const int32_t> ids) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= cfg.vocab_size)
      usage_fail("--prompt-ids: id {} (entry {}) is outside the model's vocabulary [0, {})", ids[i], i + 1,
                 cfg.vocab_size);
  if (int64_t(ids.size()) > cfg.max_position_embeddings)
    usage_fail("--prompt-ids: {} ids are more than the model's {} positions", ids.size(), cfg.max_position_embeddings);
}

}  // namespace dsv4::cli
