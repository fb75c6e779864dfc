// Byte-level BPE model: vocabulary over raw byte strings plus ranked merges (HF `models::bpe`).
// encode_word() reproduces HF `Word::merge_all` exactly: a priority queue of candidate merges ordered by
// (rank, position), stale entries skipped, ties merged leftmost first. Results are cached per word.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dsv4 {

class BpeModel {
 public:
  BpeModel() = default;
  BpeModel(BpeModel&& o) noexcept;
  BpeModel& operator=(BpeModel&& o) noexcept;

  // Vocabulary entry: raw bytes -> id. Throws dsv4::Error on duplicates.
  void add_token(std::string bytes, int32_t id);
  // Merge of two byte strings (both must be vocab entries, and their concatenation too); rank = order of addition.
  // Throws dsv4::Error (with the merge's index) otherwise.
  void add_merge(std::string_view left, std::string_view right);
  void reserve(size_t n_tokens, size_t n_merges);
  // Id of a vocab entry given its raw bytes.
  std::optional<int32_t> token_id(std::string_view bytes) const;
  // Must be called after the vocabulary is complete: checks all 256 single bytes exist.
  void finalize();

  // Appends the ids of one pre-token (raw bytes, non-empty).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  size_t vocab_size() const { return bytes_to_id_.size(); }
  size_t n_merges() const { return merges_.size(); }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;

  struct StrHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  std::unordered_map<std::string, int32_t, StrHash, std::equal_to<>> bytes_to_id_;
  struct MergeValue {
    int32_t rank, new_id;
  };
  std::unordered_map<uint64_t, MergeValue> merges_;  // key: (uint64(left id) << 32) | right id
  int32_t byte_id_[256] = {};

  // Word cache (HF keeps one too); bounded, cleared when full.
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StrHash, std::equal_to<>> cache_;
};

}  // namespace dsv4
