#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pre_tokenizer.h"

#include <pcre2.h>

#include "core/error.h"

namespace dsv4 {

// One compiled pattern. Match data is per thread (pcre2 match data is not shareable between threads).
class Pcre2Regex {
 public:
  explicit Pcre2Regex(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                          &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("tokenizer regex '{}': {} at offset {}", pattern, reinterpret_cast<const char*>(msg), off);
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Pcre2Regex() { pcre2_code_free(code_); }
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  bool find(std::string_view subject, size_t offset, size_t& begin, size_t& end) const {
    struct Tls {
      pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
      pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
      pcre2_match_context* mctx = pcre2_match_context_create(nullptr);
      Tls() { pcre2_jit_stack_assign(mctx, nullptr, stack); }
      ~Tls() {
        pcre2_match_context_free(mctx);
        pcre2_jit_stack_free(stack);
        pcre2_match_data_free(md);
      }
    };
    thread_local Tls tls;
    const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    int rc = jit_ ? pcre2_jit_match(code_, s, subject.size(), offset, 0, tls.md, tls.mctx)
                  : pcre2_match(code_, s, subject.size(), offset, PCRE2_NO_UTF_CHECK, tls.md, tls.mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code_, s, subject.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, tls.md, tls.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("tokenizer regex match failed: {}", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tls.md);
    begin = ov[0];
    end = ov[1];
    return true;
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

namespace {
// Oniguruma (HF tokenizers' regex engine) defines \s as the Unicode White_Space property; PCRE2's UCP \s adds
// U+180E. Spell the White_Space set out so both engines agree.
constexpr const char* kWhiteSpace = "\\t-\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";
}  // namespace

std::string onig_to_pcre2(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        if (in_class) fail("tokenizer regex '{}': \\S inside a character class is not supported", pattern);
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // leading ']' is literal
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

PreTokenizer::PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::add_split(const std::string& pattern) {
  steps_.push_back(std::make_unique<Pcre2Regex>(onig_to_pcre2(pattern)));
}

bool PreTokenizer::find(size_t step, std::string_view subject, size_t offset, size_t& begin, size_t& end) const {
  return steps_[step]->find(subject, offset, begin, end);
}

}  // namespace dsv4
