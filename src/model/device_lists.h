// Host-built int32 index lists uploaded to the backend's device with one copy into workspace memory (the draft and
// rollback paths of speculative decoding, model/speculation.cpp and model/dspark.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace dsv4 {

struct DeviceLists {
  std::vector<std::vector<int32_t>> host;
  std::vector<const int32_t*> dev;

  // Add a list; returns its index.
  size_t add(std::vector<int32_t> v) {
    host.push_back(std::move(v));
    return host.size() - 1;
  }
  // Copy every list to `ws` memory of `be` (one copy); dev[i] is null for an empty list.
  void upload(Backend& be, Workspace& ws) {
    size_t total = 0;
    for (const auto& v : host) total += v.size();
    std::vector<int32_t> all;
    all.reserve(total);
    std::vector<size_t> off;
    for (const auto& v : host) {
      off.push_back(all.size());
      all.insert(all.end(), v.begin(), v.end());
    }
    int32_t* d = ws.alloc<int32_t>(int64_t(std::max<size_t>(total, 1)));
    if (total) be.copy_to_device(d, all.data(), total * 4);
    for (size_t i = 0; i < host.size(); ++i) dev.push_back(host[i].empty() ? nullptr : d + off[i]);
  }
  const int32_t* operator[](size_t i) const { return dev[i]; }
  int64_t size(size_t i) const { return int64_t(host[i].size()); }
};

}  // namespace dsv4
