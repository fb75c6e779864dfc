// SafetensorsSet: the memory-mapped tensors of a checkpoint folder — a single `model.safetensors`, or the shards
// listed by `model.safetensors.index.json` (HF layout, e.g. 46 shards for V4-Flash, spec §2.4).
//
// File format (safetensors): u64 little-endian header length N, then N bytes of JSON
// {"NAME": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}},
// then the data region; offsets are relative to the data region start (8 + N).
// Validation is strict: header length inside the file, JSON object, known dtype, non-negative shape,
// numel(shape) x dtype_size == end - begin (overflow-checked), end inside the file, no two tensors overlap,
// no tensor defined twice across shards, every tensor named by the index present in its shard.
// Every failure is a dsv4::Error "<file>: tensor '<name>': <problem>" (one line). Tensor data may be unaligned.
// Data pages are mapped read-only and only touched when read, so opening a 160 GB checkpoint costs only the headers.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "format/dtype.h"

namespace dsv4 {

struct TensorInfo {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;      // row-major, outermost first ([out, in] for weights)
  const uint8_t* data = nullptr;   // start of the tensor's bytes in the mapping (no alignment guarantee)
  uint64_t nbytes = 0;             // == numel() * dtype_size(dtype)
  std::string file;                // shard file name (relative to the folder), for messages
  uint64_t file_offset = 0;        // absolute byte offset of `data` inside `file`

  int64_t numel() const;           // product of shape (1 for a scalar [])
  std::string shape_str() const;   // "[129280, 4096]"
};

class SafetensorsSet {
 public:
  // Open a checkpoint folder (index + shards, or model.safetensors) or a single .safetensors file.
  // Throws dsv4::Error for a missing/malformed index, a missing shard, or any invalid header.
  static SafetensorsSet open(const std::filesystem::path& path);

  // A set over tensors whose bytes live elsewhere (in memory the caller keeps alive; e.g. dummy weights). `dir`
  // names it in messages. Throws dsv4::Error for duplicate names.
  static SafetensorsSet from_tensors(const std::filesystem::path& dir, std::vector<TensorInfo> tensors);

  SafetensorsSet(SafetensorsSet&&) noexcept;
  SafetensorsSet& operator=(SafetensorsSet&&) noexcept;
  SafetensorsSet(const SafetensorsSet&) = delete;
  SafetensorsSet& operator=(const SafetensorsSet&) = delete;
  ~SafetensorsSet();  // unmaps every shard (TensorInfo::data pointers die with the set)

  // nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
  // Throws dsv4::Error "<folder>: missing tensor '<name>'" when absent.
  const TensorInfo& get(std::string_view name) const;
  // All tensors, in shard order then data-offset order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Shard file names in the order they were opened.
  const std::vector<std::string>& files() const { return files_; }
  // The folder (or the file's folder).
  const std::filesystem::path& dir() const { return dir_; }
  // Sum of nbytes over all tensors (== metadata.total_size of the HF index when consistent).
  uint64_t total_bytes() const;

  // Parse one shard header from memory (exposed for the header fuzz test). `file_size` is the full file size,
  // `header` the N header bytes; fills `out` with data == nullptr and file_offset set. Throws dsv4::Error.
  static void parse_header(std::string_view header, uint64_t file_size, const std::string& file,
                           std::vector<TensorInfo>& out);

 private:
  SafetensorsSet() = default;
  struct Mapping;
  std::filesystem::path dir_;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<Mapping>> maps_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> by_name_;  // keys view tensors_[i].name
};

}  // namespace dsv4
