// A modified copy of a test checkpoint (tests/data/<model>): tensors dropped, reshaped or refilled, config keys
// edited, written as one safetensors shard + index (tests/common/replica.h). For refused-checkpoint tests and for
// checkpoints with hand-made weights.
#pragma once
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common/replica.h"
#include "format/dtype.h"
#include "loader/safetensors.h"

namespace dsv4::testing {

struct VariantEdits {
  // Called per tensor (name, dtype, shape editable); false: drop it.
  std::function<bool(ReplicaTensor&)> tensor;
  // Fills a tensor's bytes; false: copy them from the source (as many as both hold, zeros after).
  std::function<bool(const ReplicaTensor&, uint8_t*)> fill;
  std::function<void(nlohmann::json&)> config;
};

inline void write_checkpoint_variant(const std::filesystem::path& src_dir, const std::filesystem::path& dst_dir,
                                     const VariantEdits& e) {
  const SafetensorsSet src = SafetensorsSet::open(src_dir);
  std::ifstream f(src_dir / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(f);
  if (e.config) e.config(cfg);
  std::vector<ReplicaTensor> tensors;
  for (const TensorInfo& t : src.tensors()) {
    ReplicaTensor r{t.name, std::string(dtype_name(t.dtype)), t.shape};
    if (!e.tensor || e.tensor(r)) tensors.push_back(r);
  }
  ReplicaOptions o;
  o.n_shards = 1;
  o.fill = [&](const ReplicaTensor& t, uint8_t* d) {
    if (e.fill && e.fill(t, d)) return;
    const TensorInfo* s = src.find(t.name);
    std::memcpy(d, s->data, size_t(std::min<uint64_t>(s->nbytes, t.nbytes())));
  };
  write_replica(dst_dir, cfg, tensors, o);
}

}  // namespace dsv4::testing
