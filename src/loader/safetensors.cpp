#include "loader/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "loader/json_text.h"

namespace dsv4 {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // 100 MiB, as the safetensors reference implementation

std::string one_line(std::string s) {
  for (auto& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

}  // namespace

// ---- TensorInfo ------------------------------------------------------------------------------------------------

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- one mapped file -------------------------------------------------------------------------------------------

struct SafetensorsSet::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) munmap(addr, size);
  }
};

void SafetensorsSet::parse_header(std::string_view header, uint64_t file_size, const std::string& file,
                                  std::vector<TensorInfo>& out) {
  const uint64_t data_start = 8 + header.size();
  if (data_start > file_size) fail("{}: header length {} runs past the end of the file ({} bytes)", file, header.size(), file_size);
  const uint64_t data_size = file_size - data_start;
  const json j = parse_json_text(header, file, "safetensors header");
  if (!j.is_object()) fail("{}: safetensors header is not a JSON object", file);

  const size_t first = out.size();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) fail("{}: __metadata__ is not an object", file);
      continue;
    }
    const json& t = *it;
    if (!t.is_object()) fail("{}: tensor '{}': entry is not an object", file, name);
    TensorInfo ti;
    ti.name = name;
    ti.file = file;
    auto dt = t.find("dtype");
    if (dt == t.end() || !dt->is_string()) fail("{}: tensor '{}': missing dtype", file, name);
    auto parsed = parse_dtype(dt->get<std::string>());
    if (!parsed) fail("{}: tensor '{}': unsupported dtype '{}'", file, name, dt->get<std::string>());
    ti.dtype = *parsed;
    auto sh = t.find("shape");
    if (sh == t.end() || !sh->is_array()) fail("{}: tensor '{}': missing shape", file, name);
    if (sh->size() > 8) fail("{}: tensor '{}': shape has {} dimensions", file, name, sh->size());
    // numel with overflow check (bounded by the file size anyway)
    unsigned __int128 numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        fail("{}: tensor '{}': invalid shape {}", file, name, one_line(sh->dump()).substr(0, 80));
      const uint64_t v = d.get<uint64_t>();
      if (v > uint64_t(std::numeric_limits<int64_t>::max())) fail("{}: tensor '{}': shape dimension too large", file, name);
      ti.shape.push_back(static_cast<int64_t>(v));
      numel *= v;
      if (numel > (unsigned __int128)(uint64_t(1) << 62)) fail("{}: tensor '{}': shape too large", file, name);
    }
    auto off = t.find("data_offsets");
    if (off == t.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      fail("{}: tensor '{}': data_offsets must be [begin, end] (non-negative integers)", file, name);
    const uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
    if (b > e) fail("{}: tensor '{}': data_offsets [{}, {}] are reversed", file, name, b, e);
    if (e > data_size)
      fail("{}: tensor '{}': data_offsets [{}, {}] out of range (data region is {} bytes)", file, name, b, e, data_size);
    const unsigned __int128 want = numel * dtype_size(ti.dtype);
    if (want != (unsigned __int128)(e - b))
      fail("{}: tensor '{}': {} {} needs {} bytes but data_offsets span {}", file, name, dtype_name(ti.dtype),
           ti.shape_str(), uint64_t(want), e - b);
    ti.nbytes = e - b;
    ti.file_offset = data_start + b;
    out.push_back(std::move(ti));
  }
  // Overlap check (zero-length tensors cannot overlap anything).
  std::vector<const TensorInfo*> sorted;
  for (size_t i = first; i < out.size(); ++i)
    if (out[i].nbytes) sorted.push_back(&out[i]);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->file_offset < b->file_offset; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i]->file_offset < sorted[i - 1]->file_offset + sorted[i - 1]->nbytes)
      fail("{}: tensor '{}': data overlaps tensor '{}'", file, sorted[i]->name, sorted[i - 1]->name);
  std::stable_sort(out.begin() + first, out.end(),
                   [](const TensorInfo& a, const TensorInfo& b) { return a.file_offset < b.file_offset; });
}

// ---- set -------------------------------------------------------------------------------------------------------

SafetensorsSet SafetensorsSet::from_tensors(const fs::path& dir, std::vector<TensorInfo> tensors) {
  SafetensorsSet set;
  set.dir_ = dir;
  set.tensors_ = std::move(tensors);
  set.by_name_.reserve(set.tensors_.size());
  for (size_t i = 0; i < set.tensors_.size(); ++i)
    if (!set.by_name_.emplace(std::string_view(set.tensors_[i].name), i).second)
      fail("{}: duplicate tensor '{}'", dir.string(), set.tensors_[i].name);
  return set;
}

SafetensorsSet::SafetensorsSet(SafetensorsSet&&) noexcept = default;
SafetensorsSet& SafetensorsSet::operator=(SafetensorsSet&&) noexcept = default;
SafetensorsSet::~SafetensorsSet() = default;

const TensorInfo* SafetensorsSet::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsSet::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) fail("{}: missing tensor '{}'", dir_.string(), name);
  return *t;
}

uint64_t SafetensorsSet::total_bytes() const {
  uint64_t s = 0;
  for (const auto& t : tensors_) s += t.nbytes;
  return s;
}

SafetensorsSet SafetensorsSet::open(const fs::path& path) {
  SafetensorsSet set;
  std::vector<std::string> shards;
  std::unordered_map<std::string, std::string> index_map;  // tensor -> shard (sharded layout only)
  bool have_index = false;
  std::error_code ec;

  if (fs::is_regular_file(path, ec)) {
    set.dir_ = path.parent_path();
    shards.push_back(path.filename().string());
  } else if (fs::is_directory(path, ec)) {
    set.dir_ = path;
    const fs::path idx = path / "model.safetensors.index.json";
    if (fs::exists(idx, ec)) {
      have_index = true;
      std::ifstream f(idx, std::ios::binary);
      if (!f) fail("{}: cannot open", idx.string());
      std::stringstream ss;
      ss << f.rdbuf();
      json j = parse_json_text(ss.str(), idx.string(), "index");
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        fail("{}: malformed index: no \"weight_map\" object", idx.string());
      std::unordered_set<std::string> seen;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it->is_string()) fail("{}: malformed index: tensor '{}' maps to a non-string", idx.string(), it.key());
        const std::string shard = it->get<std::string>();
        if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
          fail("{}: malformed index: tensor '{}' maps to invalid shard name '{}'", idx.string(), it.key(), shard);
        index_map.emplace(it.key(), shard);
        if (seen.insert(shard).second) shards.push_back(shard);
      }
      if (shards.empty()) fail("{}: index lists no tensors", idx.string());
      std::sort(shards.begin(), shards.end());
    } else if (fs::exists(path / "model.safetensors", ec)) {
      shards.push_back("model.safetensors");
    } else {
      fail("{}: no model.safetensors.index.json or model.safetensors in this folder", path.string());
    }
  } else {
    fail("{}: no such checkpoint file or folder", path.string());
  }

  if (have_index) {
    for (const auto& shard : shards) {
      if (fs::is_regular_file(set.dir_ / shard, ec)) continue;
      std::string first_tensor;
      size_t count = 0;
      for (const auto& [name, s] : index_map)
        if (s == shard && (count++ == 0 || name < first_tensor)) first_tensor = name;
      fail("{}: tensor '{}'{} mapped to shard {}, which does not exist",
           (set.dir_ / "model.safetensors.index.json").string(), first_tensor,
           count > 1 ? fmt::format(" (and {} more)", count - 1) : std::string(), shard);
    }
  }
  for (const auto& shard : shards) {
    const fs::path p = set.dir_ / shard;
    const std::string label = p.string();
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (have_index) fail("{}: shard listed by model.safetensors.index.json cannot be opened: {}", label, std::strerror(errno));
      fail("{}: cannot open: {}", label, std::strerror(errno));
    }
    struct FdGuard {
      int fd;
      ~FdGuard() { ::close(fd); }
    } guard{fd};
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail("{}: not a regular file", label);
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < 8) fail("{}: truncated file ({} bytes, no safetensors header)", label, size);
    uint8_t lenbuf[8];
    if (::pread(fd, lenbuf, 8, 0) != 8) fail("{}: cannot read header length", label);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | lenbuf[i];
    if (n > size - 8) fail("{}: header length {} runs past the end of the file ({} bytes)", label, n, size);
    if (n > kMaxHeader) fail("{}: header length {} exceeds the 100 MiB limit", label, n);
    std::string header(n, '\0');
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::pread(fd, header.data() + got, n - got, static_cast<off_t>(8 + got));
      if (r <= 0) fail("{}: cannot read header", label);
      got += static_cast<size_t>(r);
    }
    const size_t first = set.tensors_.size();
    parse_header(header, size, label, set.tensors_);

    auto m = std::make_unique<Mapping>();
    if (size > 0) {
      void* a = mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_NORESERVE, fd, 0);
      if (a == MAP_FAILED) fail("{}: mmap failed: {}", label, std::strerror(errno));
      m->addr = a;
      m->size = size;
    }
    for (size_t i = first; i < set.tensors_.size(); ++i) {
      auto& t = set.tensors_[i];
      t.data = static_cast<const uint8_t*>(m->addr) + t.file_offset;
      t.file = shard;
    }
    set.maps_.push_back(std::move(m));
    set.files_.push_back(shard);
  }

  // Name table, duplicates, index consistency.
  set.by_name_.reserve(set.tensors_.size());
  for (size_t i = 0; i < set.tensors_.size(); ++i) {
    const auto& t = set.tensors_[i];
    auto [it, fresh] = set.by_name_.emplace(std::string_view(t.name), i);
    if (!fresh)
      fail("{}: tensor '{}': defined twice (also in {})", (set.dir_ / t.file).string(), t.name,
           set.tensors_[it->second].file);
    if (have_index) {
      auto m = index_map.find(t.name);
      if (m == index_map.end())
        fail("{}: tensor '{}': not listed in model.safetensors.index.json", (set.dir_ / t.file).string(), t.name);
      if (m->second != t.file)
        fail("{}: tensor '{}': index says it is in {}", (set.dir_ / t.file).string(), t.name, m->second);
    }
  }
  if (have_index && index_map.size() != set.tensors_.size()) {
    for (const auto& [name, shard] : index_map)
      if (!set.by_name_.count(name))
        fail("{}: tensor '{}': listed in model.safetensors.index.json but absent from the shard",
             (set.dir_ / shard).string(), name);
  }
  log::debug("{}: {} tensors in {} file(s), {} bytes", set.dir_.string(), set.tensors_.size(), set.files_.size(),
             set.total_bytes());
  return set;
}

}  // namespace dsv4
