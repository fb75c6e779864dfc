// Regex pre-tokenizer: HF `Split` steps (behaviour "Isolated", invert=false) applied in sequence, each one to every
// piece produced by the previous steps (a regex sees one piece as its whole subject, so look-arounds stop at piece
// boundaries, as in HF). Patterns are HF/Oniguruma regexes compiled with PCRE2 (UTF, UCP, JIT).
// Input must be valid UTF-8 (the tokenizer isolates invalid bytes before calling this).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

class Pcre2Regex;

// Rewrites an Oniguruma pattern for PCRE2 where their semantics differ (\s / \S -> the White_Space set).
std::string onig_to_pcre2(const std::string& pattern);

class PreTokenizer {
 public:
  PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Appends a Split step. Throws dsv4::Error if PCRE2 rejects the pattern.
  void add_split(const std::string& pattern);
  size_t n_steps() const { return steps_.size(); }

  // Calls piece(sub) for every non-empty piece of `text`, in order; the pieces concatenate to `text`.
  // Templated visitor to keep the hot loop free of std::function overhead.
  template <typename F>
  void split(std::string_view text, F&& piece) const {
    split_from(0, text, piece);
  }

 private:
  template <typename F>
  void split_from(size_t step, std::string_view text, F& piece) const;
  // Finds the next match of step `step` in subject at or after offset; returns false if none.
  bool find(size_t step, std::string_view subject, size_t offset, size_t& begin, size_t& end) const;

  std::vector<std::unique_ptr<Pcre2Regex>> steps_;
};

template <typename F>
void PreTokenizer::split_from(size_t step, std::string_view text, F& piece) const {
  if (text.empty()) return;
  if (step == steps_.size()) {
    piece(text);
    return;
  }
  size_t last = 0, offset = 0, b = 0, e = 0;
  while (offset < text.size() && find(step, text, offset, b, e)) {
    if (b > last) split_from(step + 1, text.substr(last, b - last), piece);
    if (e > b) split_from(step + 1, text.substr(b, e - b), piece);
    last = e;
    offset = e > b ? e : e + 1;  // patterns here never match empty; guard anyway
    while (offset < text.size() && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) ++offset;
  }
  if (last < text.size()) split_from(step + 1, text.substr(last), piece);
}

}  // namespace dsv4
