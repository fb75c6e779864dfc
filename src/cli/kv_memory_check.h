// An impossible --kv-memory (less than the running sequences' slots and one page of compressed rows) is a usage error
// (exit 2) reported before the model loads, which takes minutes on a large model: the state layout follows from
// config.json alone. The bound takes the smallest row format the config allows, so a value accepted here may still
// be refused after loading (by the engine loop, with the backend's actual formats), never the other way round.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "cli/config_checks.h"
#include "core/error.h"
#include "loader/config.h"
#include "model/state_layout.h"

namespace dsv4::cli {

inline void check_kv_memory_early(const std::string& model_dir, uint64_t state_bytes, int64_t max_running,
                                  bool mtp) {
  const std::optional<ModelConfig> cfg = config_if_present(model_dir);
  if (!cfg) return;  // the loader reports a missing config
  const StateLayout L =
      StateLayout::of(*cfg, mtp, StateLayout::compact_fits(*cfg) ? RowFormat::compact : RowFormat::f32);
  const uint64_t slots = uint64_t(max_running) * L.slot_bytes;
  if (state_bytes <= slots + L.page_bytes)
    usage_fail("--kv-memory: state memory of {} bytes cannot hold {} sequence slots of {} bytes and a page of {} "
               "bytes (raise --kv-memory or lower --parallel)",
               state_bytes, max_running, L.slot_bytes, L.page_bytes);
}

}  // namespace dsv4::cli
