#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace dsv4 {

namespace {
// GPT-2 split regex, used by a ByteLevel pre-tokenizer with use_regex=true (HF byte_level.rs).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// SAX handler: builds a DOM of tokenizer.json except model.vocab and model.merges (the bulk of the file), which it
// collects directly (about 2x faster loading than a full DOM); those two keys hold null in the DOM.
class TokenizerJsonSax {
 public:
  using J = nlohmann::json;
  explicit TokenizerJsonSax(J& root) : dom_(root, true) {}

  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool vocab_seen = false, merges_seen = false;
  std::string merge_error;

  bool null() { return capture_ ? bad() : dom_.null(); }
  bool boolean(bool v) { return capture_ ? bad() : dom_.boolean(v); }
  bool number_integer(J::number_integer_t v) { return capture_ ? vocab_id(v) : dom_.number_integer(v); }
  bool number_unsigned(J::number_unsigned_t v) {
    return capture_ ? vocab_id(static_cast<int64_t>(std::min<uint64_t>(v, INT64_MAX))) : dom_.number_unsigned(v);
  }
  bool number_float(J::number_float_t v, const std::string& s) { return capture_ ? bad() : dom_.number_float(v, s); }
  bool binary(J::binary_t& v) { return capture_ ? bad() : dom_.binary(v); }
  bool string(std::string& v) {
    if (capture_ == kNone) return dom_.string(v);
    if (capture_ == kMerges && depth_ == capture_depth_) {
      const size_t sp = v.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= v.size() || v.find(' ', sp + 1) != std::string::npos)
        return merge_bad(fmt::format("merges[{}] '{}' is malformed", merges.size(), v));
      merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    if (capture_ == kMerges && depth_ == capture_depth_ + 1) {
      pair_.push_back(std::move(v));
      return true;
    }
    return bad();
  }
  bool start_object(size_t n) {
    if (capture_ != kNone) return bad();
    if (pending_ == kVocab) return begin_capture(kVocab);
    pending_ = kNone;
    ++depth_;
    return dom_.start_object(n);
  }
  bool key(std::string& k) {
    if (capture_ == kVocab) {
      key_ = std::move(k);
      return true;
    }
    if (capture_ != kNone) return bad();
    if (depth_ == 1) top_key_ = k;
    pending_ = kNone;
    if (depth_ == 2 && top_key_ == "model") pending_ = k == "vocab" ? kVocab : k == "merges" ? kMerges : kNone;
    return dom_.key(k);
  }
  bool end_object() {
    if (capture_ == kVocab && depth_ == capture_depth_) return end_capture();
    if (capture_ != kNone) return bad();
    --depth_;
    return dom_.end_object();
  }
  bool start_array(size_t n) {
    if (capture_ == kMerges && depth_ == capture_depth_) {
      ++depth_;
      pair_.clear();
      return true;
    }
    if (capture_ != kNone) return bad();
    if (pending_ == kMerges) return begin_capture(kMerges);
    pending_ = kNone;
    ++depth_;
    return dom_.start_array(n);
  }
  bool end_array() {
    if (capture_ == kMerges && depth_ == capture_depth_ + 1) {
      --depth_;
      if (pair_.size() != 2) return merge_bad(fmt::format("merges[{}] is not a pair of strings", merges.size()));
      merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      return true;
    }
    if (capture_ == kMerges && depth_ == capture_depth_) return end_capture();
    if (capture_ != kNone) return bad();
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(size_t pos, const std::string& tok, const nlohmann::detail::exception& ex) {
    return dom_.parse_error(pos, tok, ex);
  }

 private:
  enum Capture { kNone, kVocab, kMerges };
  bool begin_capture(Capture c) {
    (c == kVocab ? vocab_seen : merges_seen) = true;
    capture_ = c;
    pending_ = kNone;
    capture_depth_ = ++depth_;
    return true;
  }
  bool end_capture() {
    capture_ = kNone;
    --depth_;
    return dom_.null();  // placeholder value for the key in the DOM
  }
  bool vocab_id(int64_t v) {
    if (capture_ != kVocab) return bad();
    vocab.emplace_back(std::move(key_), v);
    return true;
  }
  bool bad() { return merge_bad(capture_ == kVocab ? "model.vocab must map token strings to integer ids"
                                                   : "model.merges must hold \"a b\" strings or [a, b] pairs"); }
  bool merge_bad(std::string msg) {
    merge_error = std::move(msg);
    return false;  // stops the parser
  }

  nlohmann::detail::json_sax_dom_parser<J> dom_;
  Capture capture_ = kNone, pending_ = kNone;
  int depth_ = 0, capture_depth_ = 0;
  std::string top_key_, key_;
  std::vector<std::string> pair_;
};

std::string quote_regex(const std::string& s) {
  std::string out = "\\Q";
  out += s;
  out += "\\E";
  return out;
}
}  // namespace

struct Tokenizer::Impl {
  BpeModel bpe;
  PreTokenizer pre;
  AddedTokenMatcher added;
  std::vector<std::string> id_bytes;  // decode bytes per id
  std::vector<uint8_t> id_kind;       // 0 = unused id, 1 = vocab, 2 = added, 3 = added special
  std::unordered_map<std::string, int32_t> added_to_id;  // added token content -> id
  std::unordered_map<std::string, int32_t> odd_vocab;    // vocab spellings outside the byte alphabet -> id

  void encode_plain(std::string_view s, std::vector<int32_t>& out) const {
    size_t i = 0;
    const size_t n = s.size();
    while (i < n) {
      size_t j = i;
      while (j < n) {
        if (static_cast<unsigned char>(s[j]) < 0x80) {
          ++j;
          continue;
        }
        const size_t len = utf8::valid_seq_len(s, j);
        if (len == 0) break;
        j += len;
      }
      if (j > i) pre.split(s.substr(i, j - i), [&](std::string_view piece) { bpe.encode_word(piece, out); });
      if (j < n) bpe.encode_word(s.substr(j, 1), out);  // an invalid byte: its own piece
      i = j + 1;
    }
  }

  void configure_pre_tokenizer(const nlohmann::json& pt, const std::string& where) {
    if (pt.is_null()) return;
    const std::string type = pt.value("type", "");
    if (type == "Sequence") {
      const auto& list = pt.at("pretokenizers");
      for (size_t i = 0; i < list.size(); ++i) configure_pre_tokenizer(list[i], fmt::format("{}[{}]", where, i));
    } else if (type == "Split") {
      const std::string behavior = pt.value("behavior", "");
      if (behavior != "Isolated" || pt.value("invert", false))
        fail("{}: Split behavior '{}' (invert={}) is not supported", where, behavior, pt.value("invert", false));
      const auto& p = pt.at("pattern");
      if (p.contains("Regex"))
        pre.add_split(p.at("Regex").get<std::string>());
      else if (p.contains("String"))
        pre.add_split(quote_regex(p.at("String").get<std::string>()));
      else
        fail("{}: Split pattern must be Regex or String", where);
    } else if (type == "ByteLevel") {
      if (pt.value("add_prefix_space", false)) fail("{}: ByteLevel add_prefix_space=true is not supported", where);
      if (pt.value("use_regex", true)) pre.add_split(kGpt2Pattern);
    } else {
      fail("{}: pre-tokenizer type '{}' is not supported", where, type);
    }
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  std::ifstream f(tokenizer_json, std::ios::binary);
  if (!f) fail("{}: cannot open tokenizer file", tokenizer_json.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return from_json_text(ss.str(), tokenizer_json.string());
}

Tokenizer Tokenizer::from_json_text(std::string_view json_text, std::string_view origin) {
  const std::string where(origin);
  nlohmann::json j;
  TokenizerJsonSax sax(j);
  try {
    const bool ok = nlohmann::json::sax_parse(json_text, &sax);
    if (!sax.merge_error.empty()) fail("{}: {}", where, sax.merge_error);
    if (!ok) fail("{}: invalid JSON", where);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", where, e.what());
  }
  auto impl = std::make_unique<Impl>();
  try {
    if (!j.is_object() || !j.contains("model")) fail("{}: not a tokenizer.json (no 'model')", where);
    const auto& norm = j.value("normalizer", nlohmann::json());
    if (!norm.is_null() && !(norm.value("type", "") == "Sequence" && norm.value("normalizers", nlohmann::json::array()).empty()))
      fail("{}: normalizer '{}' is not supported", where, norm.dump());
    const auto& model = j.at("model");
    if (!model.is_object()) fail("{}: 'model' must be an object", where);
    if (model.value("type", "BPE") != "BPE") fail("{}: model type '{}' is not supported", where, model.value("type", ""));
    if (!model.value("continuing_subword_prefix", nlohmann::json()).is_null() ||
        !model.value("end_of_word_suffix", nlohmann::json()).is_null() || model.value("byte_fallback", false) ||
        model.value("ignore_merges", false))
      fail("{}: BPE options (subword prefix/suffix, byte_fallback, ignore_merges) are not supported", where);
    const auto& dec = j.value("decoder", nlohmann::json());
    if (!dec.is_null() && dec.value("type", "") != "ByteLevel")
      fail("{}: decoder '{}' is not supported", where, dec.value("type", ""));

    impl->configure_pre_tokenizer(j.value("pre_tokenizer", nlohmann::json()), where + ": pre_tokenizer");

    // Vocabulary.
    if (!sax.vocab_seen || sax.vocab.empty()) fail("{}: model.vocab must be a non-empty object", where);
    if (!sax.merges_seen) fail("{}: model.merges is missing", where);
    int32_t max_id = -1;
    for (const auto& [spelling, id] : sax.vocab) {
      if (id < 0 || id > (1 << 30)) fail("{}: vocab id {} out of range", where, id);
      max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
    }
    const auto& added = j.value("added_tokens", nlohmann::json::array());
    for (const auto& a : added) max_id = std::max<int32_t>(max_id, a.at("id").get<int32_t>());
    impl->id_bytes.assign(max_id + 1, std::string());
    impl->id_kind.assign(max_id + 1, 0);
    impl->bpe.reserve(sax.vocab.size(), sax.merges.size());
    for (auto& [spelling, id64] : sax.vocab) {
      const auto id = static_cast<int32_t>(id64);
      auto bytes = byte_level::decode_token(spelling);
      impl->id_bytes[id] = bytes ? *bytes : spelling;
      impl->id_kind[id] = 1;
      // Only spellings in the byte alphabet are reachable by BPE; others (e.g. ids 0-2) are added tokens.
      if (bytes)
        impl->bpe.add_token(std::move(*bytes), id);
      else
        impl->odd_vocab.emplace(spelling, id);
    }
    impl->bpe.finalize();

    // Merges ("a b" strings or ["a", "b"] pairs, in the vocabulary spelling), rank = position.
    for (size_t i = 0; i < sax.merges.size(); ++i) {
      const auto& [l, r] = sax.merges[i];
      auto lb = byte_level::decode_token(l), rb = byte_level::decode_token(r);
      if (!lb || !rb) fail("{}: merges[{}] uses characters outside the byte alphabet", where, i);
      impl->bpe.add_merge(*lb, *rb);
    }

    // Added tokens (override vocab entries with the same id, as HF does).
    for (size_t i = 0; i < added.size(); ++i) {
      const auto& a = added[i];
      const int32_t id = a.at("id").get<int32_t>();
      const std::string content = a.at("content").get<std::string>();
      if (content.empty()) fail("{}: added_tokens[{}] has empty content", where, i);
      if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false) ||
          (a.value("normalized", false) && !a.value("special", false)))
        fail("{}: added_tokens[{}]: lstrip/rstrip/single_word/normalized options are not supported", where, i);
      auto bytes = byte_level::decode_token(content);
      impl->id_bytes[id] = bytes ? *bytes : content;
      impl->id_kind[id] = a.value("special", false) ? 3 : 2;
      impl->added.add(content, id, a.value("special", false));
      impl->added_to_id[content] = id;
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed tokenizer.json: {}", where, e.what());
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  size_t pos = 0;
  AddedTokenMatcher::Match m;
  while (impl_->added.find(text, pos, m, parse_special)) {
    if (m.begin > pos) impl_->encode_plain(text.substr(pos, m.begin - pos), out);
    out.push_back(m.id);
    pos = m.end;
  }
  if (pos < text.size()) impl_->encode_plain(text.substr(pos), out);
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= n_vocab() || impl_->id_kind[id] == 0) fail("token id {} is out of range [0, {})", id, n_vocab());
  return impl_->id_bytes[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->id_bytes.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token_text) const {
  const std::string key(token_text);
  if (const auto it = impl_->added_to_id.find(key); it != impl_->added_to_id.end()) return it->second;
  if (const auto it = impl_->odd_vocab.find(key); it != impl_->odd_vocab.end()) return it->second;
  const auto bytes = byte_level::decode_token(token_text);
  if (!bytes) return std::nullopt;
  return impl_->bpe.token_id(*bytes);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < n_vocab() && impl_->id_kind[id] == 3;
}

}  // namespace dsv4
