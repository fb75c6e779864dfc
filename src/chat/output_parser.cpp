#include "chat/output_parser.h"

#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chat/dsv4_format.h"
#include "chat/py_json.h"

namespace dsv4 {

namespace fmtc = chatfmt;

namespace {

constexpr std::string_view kBlockNl = "\n\n<｜DSML｜tool_calls>";
constexpr std::string_view kWs = " \t\r\n";

// Longest k < marker.size() such that s ends with marker[0:k].
size_t partial_suffix(std::string_view s, std::string_view marker) {
  const size_t max_k = std::min(s.size(), marker.size() - 1);
  for (size_t k = max_k; k > 0; --k)
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

// Literal match at rest[pos...]: 1 = matched (pos advanced), 0 = rest ends inside a prefix of lit, -1 = mismatch.
int match_lit(std::string_view rest, size_t& pos, std::string_view lit) {
  const size_t avail = rest.size() - pos;
  const size_t n = std::min(avail, lit.size());
  if (rest.substr(pos, n) != lit.substr(0, n)) return -1;
  if (n < lit.size()) return 0;
  pos += lit.size();
  return 1;
}

size_t skip_ws(std::string_view s, size_t pos) {
  while (pos < s.size() && kWs.find(s[pos]) != std::string_view::npos) ++pos;
  return pos;
}

enum class Parse { kComplete, kNeedMore, kMalformed };

struct ParsedCall {
  std::string name, arguments;
};

// Parses one `<｜DSML｜invoke name="N">…</｜DSML｜invoke>` at the start of s; on success sets consumed.
Parse parse_invoke(std::string_view s, size_t& consumed, ParsedCall& call) {
  size_t pos = 0;
  int r = match_lit(s, pos, fmtc::kInvokeOpen);
  if (r <= 0) return r == 0 ? Parse::kNeedMore : Parse::kMalformed;
  const size_t q = s.find_first_of("\"\n", pos);
  if (q == std::string_view::npos) return Parse::kNeedMore;
  if (s[q] != '"') return Parse::kMalformed;
  call.name.assign(s.substr(pos, q - pos));
  pos = q + 1;
  if ((r = match_lit(s, pos, ">")) <= 0) return r == 0 ? Parse::kNeedMore : Parse::kMalformed;
  std::vector<std::string> keys;
  std::string args = "{";
  for (;;) {
    pos = skip_ws(s, pos);
    if (pos == s.size()) return Parse::kNeedMore;
    size_t p2 = pos;
    const int close = match_lit(s, p2, fmtc::kInvokeClose);
    if (close == 1) {
      pos = p2;
      break;
    }
    size_t p3 = pos;
    const int param = match_lit(s, p3, fmtc::kParamOpen);
    if (param == -1 && close == -1) return Parse::kMalformed;
    if (param == 0 || (param == -1 && close == 0)) return Parse::kNeedMore;
    pos = p3;
    const size_t kq = s.find_first_of("\"\n", pos);
    if (kq == std::string_view::npos) return Parse::kNeedMore;
    if (s[kq] != '"') return Parse::kMalformed;
    std::string key(s.substr(pos, kq - pos));
    pos = kq;
    if ((r = match_lit(s, pos, "\" string=\"")) <= 0) return r == 0 ? Parse::kNeedMore : Parse::kMalformed;
    bool is_string;
    size_t pt = pos, pf = pos;
    const int rt = match_lit(s, pt, "true\">"), rf = match_lit(s, pf, "false\">");
    if (rt == 1) {
      is_string = true;
      pos = pt;
    } else if (rf == 1) {
      is_string = false;
      pos = pf;
    } else if (rt == 0 || rf == 0) {
      return Parse::kNeedMore;
    } else {
      return Parse::kMalformed;
    }
    const size_t vend = s.find(fmtc::kParamClose, pos);
    if (vend == std::string_view::npos) return Parse::kNeedMore;
    const std::string_view value = s.substr(pos, vend - pos);
    pos = vend + fmtc::kParamClose.size();
    for (const auto& k : keys)
      if (k == key) return Parse::kMalformed;  // duplicate parameter name (the official parser rejects it)
    if (keys.size()) args += ", ";
    args += py_json_dumps(key);
    args += ": ";
    if (!is_string && nlohmann::json::accept(value))
      args += value;
    else
      args += py_json_dumps(std::string(value));
    keys.push_back(std::move(key));
  }
  args += "}";
  call.arguments = std::move(args);
  consumed = pos;
  return Parse::kComplete;
}

}  // namespace

std::string random_tool_id_prefix(ToolIdStyle style) {
  std::random_device rd;
  std::mt19937_64 g((static_cast<uint64_t>(rd()) << 32) ^ rd());
  const uint64_t r = g();
  return style == ToolIdStyle::anthropic ? fmt::format("toolu_{:016x}", r) : fmt::format("call_{:016x}_", r);
}

OutputParser::OutputParser(bool thinking, std::string id_prefix)
    : state_(thinking ? State::kReasoning : State::kContent),
      id_prefix_(id_prefix.empty() ? random_tool_id_prefix(ToolIdStyle::openai) : std::move(id_prefix)) {}

OutputParser OutputParser::parse(std::string_view text, bool thinking, std::string id_prefix) {
  OutputParser p(thinking, std::move(id_prefix));
  p.push(text);
  p.finish();
  return p;
}

void OutputParser::emit_reasoning(ChatDelta& out, std::string_view s) {
  if (s.empty()) return;
  out.reasoning += s;
  reasoning_ += s;
}

void OutputParser::emit_content(ChatDelta& out, std::string_view s) {
  if (s.empty()) return;
  out.content += s;
  content_ += s;
}

ChatDelta OutputParser::push(std::string_view text) {
  ChatDelta out;
  if (finished_ || state_ == State::kDone) return out;
  buf_ += text;
  step(out, false);
  return out;
}

ChatDelta OutputParser::finish(bool truncated) {
  ChatDelta out;
  if (finished_) return out;
  truncated_ = truncated;
  step(out, true);
  finished_ = true;
  return out;
}

bool OutputParser::parse_tools(ChatDelta& out, bool at_end) {
  for (;;) {
    const size_t j = skip_ws(tool_buf_, 0);
    const std::string_view rest = std::string_view(tool_buf_).substr(j);
    if (rest.empty()) return !at_end;
    size_t pos = 0;
    const int close = match_lit(rest, pos, fmtc::kToolCallsClose);
    if (close == 1) {
      buf_ = tool_buf_.substr(j + pos) + buf_;
      tool_buf_.clear();
      state_ = State::kAfterTools;
      return true;
    }
    ParsedCall call;
    size_t consumed = 0;
    const Parse r = parse_invoke(rest, consumed, call);
    if (r == Parse::kMalformed && close != 0) return false;
    if (r != Parse::kComplete) return !at_end;  // need more text (or the end came first: unterminated)
    ToolCall tc{id_prefix_ + std::to_string(tool_calls_.size()), std::move(call.name), std::move(call.arguments)};
    out.tool_calls.push_back(ToolCallDelta{static_cast<int>(tool_calls_.size()), tc.id, tc.name, tc.arguments});
    tool_calls_.push_back(std::move(tc));
    ++calls_in_block_;
    tool_buf_.erase(0, j + consumed);
  }
}

void OutputParser::step(ChatDelta& out, bool at_end) {
  for (;;) {
    switch (state_) {
      case State::kDone:
        buf_.clear();
        return;
      case State::kReasoning:
      case State::kContent: {
        const bool reasoning = state_ == State::kReasoning;
        if (reasoning && at_start_) {
          if (!at_end && buf_.size() < fmtc::kThinkStart.size() && fmtc::kThinkStart.substr(0, buf_.size()) == buf_)
            return;  // could still become a leading "<think>"
          if (buf_.compare(0, fmtc::kThinkStart.size(), fmtc::kThinkStart) == 0) buf_.erase(0, fmtc::kThinkStart.size());
          at_start_ = false;
        }
        const size_t p_think = reasoning ? buf_.find(fmtc::kThinkEnd) : std::string::npos;
        const size_t p_block = buf_.find(fmtc::kToolCallsOpen);
        const size_t p_eos = buf_.find(fmtc::kEos);
        const size_t p = std::min({p_think, p_block, p_eos});
        const auto emit = [&](std::string_view s) { reasoning ? emit_reasoning(out, s) : emit_content(out, s); };
        if (p == std::string::npos) {
          const auto partial = [&](std::string_view s) {  // the longest suffix of s that may begin a marker
            size_t h = std::max({partial_suffix(s, kBlockNl), partial_suffix(s, fmtc::kToolCallsOpen),
                                 partial_suffix(s, fmtc::kEos)});
            return reasoning ? std::max(h, partial_suffix(s, fmtc::kThinkEnd)) : h;
          };
          // buf_ without its trailing U+FFFD characters (the engine's stand-in for a character the end cut in two),
          // the last of which may still be arriving byte by byte
          std::string_view s = buf_;
          if (s.ends_with("\xEF\xBF")) s.remove_suffix(2);
          else if (s.ends_with("\xEF")) s.remove_suffix(1);
          while (s.ends_with("\xEF\xBF\xBD")) s.remove_suffix(3);
          size_t hold = 0;
          if (!at_end) {
            const size_t h = partial(s);  // a marker's beginning, perhaps followed by such stand-ins: held back too
            hold = std::max(h > 0 ? h + (buf_.size() - s.size()) : 0, partial(buf_));
          } else if (truncated_) {
            // cut off by the token limit inside a marker: its beginning is not content (nor the U+FFFD that stands
            // for a character of it the cut split)
            const size_t h = partial(s);
            if (h > 0) {
              emit(s.substr(0, s.size() - h));
              buf_.clear();
              return;
            }
          }
          emit(std::string_view(buf_).substr(0, buf_.size() - hold));
          buf_.erase(0, buf_.size() - hold);
          return;
        }
        if (p == p_think) {
          emit(std::string_view(buf_).substr(0, p));
          buf_.erase(0, p + fmtc::kThinkEnd.size());
          state_ = State::kContent;
        } else if (p == p_block) {
          const bool nl = p >= 2 && buf_.compare(p - 2, 2, "\n\n") == 0;
          emit(std::string_view(buf_).substr(0, nl ? p - 2 : p));
          block_raw_prefix_ = nl ? std::string(kBlockNl) : std::string(fmtc::kToolCallsOpen);
          buf_.erase(0, p + fmtc::kToolCallsOpen.size());
          tool_buf_.clear();
          calls_in_block_ = 0;
          state_ = State::kTools;
        } else {
          emit(std::string_view(buf_).substr(0, p));
          buf_.clear();
          state_ = State::kDone;
          return;
        }
        break;
      }
      case State::kTools: {
        tool_buf_ += buf_;
        buf_.clear();
        const bool ok = parse_tools(out, at_end);
        if (state_ == State::kAfterTools) break;
        if (ok) return;  // need more text
        if (at_end && truncated_) {  // cut off inside the block: no half call, no markup in content
          tool_buf_.clear();
          state_ = State::kDone;
          return;
        }
        // Malformed or unterminated: the unparsed raw text becomes content (re-scanned for later markers).
        if (calls_in_block_ == 0) emit_content(out, block_raw_prefix_);
        buf_ = std::move(tool_buf_);
        tool_buf_.clear();
        state_ = State::kContent;
        break;
      }
      case State::kAfterTools: {
        const size_t p = buf_.find_first_not_of(kWs);
        if (p == std::string::npos) {
          if (at_end) buf_.clear();
          return;
        }
        const std::string_view rest = std::string_view(buf_).substr(p);
        if (rest.substr(0, fmtc::kEos.size()) == fmtc::kEos) {
          buf_.clear();
          state_ = State::kDone;
          return;
        }
        if (!at_end && rest.size() < fmtc::kEos.size() && fmtc::kEos.substr(0, rest.size()) == rest) return;
        buf_.erase(0, p);
        state_ = State::kContent;
        break;
      }
    }
  }
}

}  // namespace dsv4
