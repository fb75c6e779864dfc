// `dsv4 tokenize`, `dsv4 detokenize`, `dsv4 render`: the tokenizer and chat renderer from the command line.
//   dsv4 tokenize (--tokenizer FILE | -m MODEL_DIR) [--json] [--plain] TEXT   (TEXT "-" = exact stdin bytes)
//   dsv4 detokenize (--tokenizer FILE | -m MODEL_DIR) IDS...                   (ids as numbers, "-" = stdin)
//     each IDS argument (or stdin) is a JSON array ("[1, 2]", as tokenize --json prints) or ids separated by commas
//     or spaces ("1,2", "1 2", as tokenize prints); anything else is an error naming it: a usage error (exit 2) in an
//     argument, an error (exit 1) on stdin, which is data, as render's request file
//   dsv4 render [--tokenizer FILE | -m MODEL_DIR] [--ids] [--json] REQUEST.json ("-" = stdin; a bare JSON array
//     is taken as the messages)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chat/chat_encoding.h"
#include "cli/command.h"
#include "cli/int_list_option.h"
#include "core/error.h"
#include "core/json_depth.h"
#include "tokenizer/tokenizer.h"

namespace {

struct TokOpts {
  std::string tokenizer, model;
};

void add_tokenizer_opts(CLI::App& app, TokOpts& o) {
  auto* t = app.add_option("--tokenizer", o.tokenizer, "tokenizer.json file");
  auto* m = app.add_option("-m,--model", o.model, "model folder holding tokenizer.json");
  t->excludes(m);
}

dsv4::Tokenizer load_tokenizer(const TokOpts& o) {
  if (!o.tokenizer.empty()) return dsv4::Tokenizer::from_file(o.tokenizer);
  if (!o.model.empty()) return dsv4::Tokenizer::from_file(std::filesystem::path(o.model) / "tokenizer.json");
  dsv4::usage_fail("give --tokenizer FILE or -m MODEL_DIR");
}

std::string read_stdin() {
  std::string s((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  return s;
}

std::string read_input(const std::string& arg) {
  if (arg == "-") return read_stdin();
  FILE* f = std::fopen(arg.c_str(), "rb");
  if (!f) dsv4::fail("{}: cannot open", arg);
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

void write_ids(const std::vector<int32_t>& ids, bool json) {
  std::string out = json ? "[" : "";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += json ? ", " : " ";
    out += std::to_string(ids[i]);
  }
  out += json ? "]\n" : "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

struct TokenizeOpts : TokOpts {
  std::string text;
  bool json = false, plain = false;
};

void setup_tokenize(CLI::App& app, dsv4::cli::Runner& run) {
  auto o = std::make_shared<TokenizeOpts>();
  add_tokenizer_opts(app, *o);
  app.add_flag("--json", o->json, "print a JSON array instead of space-separated ids");
  app.add_flag("--plain", o->plain, "do not match special tokens (treat \"<｜User｜>\" etc. as plain text)");
  app.add_option("text", o->text, "text to tokenize; \"-\" reads the exact bytes of stdin")->required();
  run = [o] {
    const auto tok = load_tokenizer(*o);
    const std::string text = o->text == "-" ? read_stdin() : o->text;
    write_ids(tok.encode(text, !o->plain), o->json);
    return 0;
  };
}
DSV4_COMMAND(tokenize, "Text -> token ids (special tokens matched; no BOS added)", setup_tokenize);

// At most 40 characters of `s` on one line, for quoting input in an error message.
std::string excerpt(std::string_view s) {
  std::string e(s.substr(0, std::min(s.find_first_of("\r\n"), size_t(40))));
  return e.size() < s.size() ? e + "..." : e;
}

// The token ids of one IDS argument (`argument`) or of stdin: a JSON array of non-negative 32-bit integers, or such
// integers in decimal separated by commas (no empty entry: "1,,2" is an error, as in every list option) and/or
// spaces; blank text or "[]": none. Bad text throws a dsv4::UsageError for an argument, a dsv4::Error for stdin.
std::vector<int32_t> parse_token_ids(std::string_view text, bool argument) {
  const auto bad = [&](const std::string& msg) {
    if (argument) throw dsv4::UsageError(msg);
    throw dsv4::Error(msg + " (on stdin)");
  };
  std::vector<int32_t> ids;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return ids;
  if (text[first] == '[') {
    if (dsv4::json_nesting_exceeds(text, dsv4::kMaxJsonRequestDepth))
      bad(fmt::format("'{}' is nested deeper than {} levels", excerpt(text), dsv4::kMaxJsonRequestDepth));
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_array()) bad(fmt::format("'{}' is not a JSON array of token ids", excerpt(text)));
    for (size_t i = 0; i < j.size(); ++i) {
      if (!j[i].is_number_integer() || j[i].get<int64_t>() < 0 || j[i].get<int64_t>() > INT32_MAX)
        bad(fmt::format("'{}': element {} ({}) is not a token id", excerpt(text), i, excerpt(j[i].dump())));
      ids.push_back(int32_t(j[i].get<int64_t>()));
    }
    return ids;
  }
  std::string why;
  const auto entries = dsv4::cli::split_list(text, why);  // (text is not blank: only an empty entry fails)
  if (!entries) bad(fmt::format("'{}': {}", excerpt(text), why.substr(0, why.find(" in '"))));
  for (const std::string& e : *entries) {
    std::istringstream words(e);
    for (std::string w; words >> w;) {
      const std::optional<int32_t> v = dsv4::cli::decimal_in<int32_t>(w, 0, INT32_MAX);
      if (!v) bad(fmt::format("'{}' is not a token id (an integer in [0, {}])", excerpt(w), INT32_MAX));
      ids.push_back(*v);
    }
  }
  return ids;
}

void setup_detokenize(CLI::App& app, dsv4::cli::Runner& run) {
  auto o = std::make_shared<TokOpts>();
  add_tokenizer_opts(app, *o);
  // The IDS arguments are the command's extras: a positional option would let CLI11 rewrite an argument in brackets
  // ("[1,,2]" read as 1 and 2, "[]" as no argument at all) before any check could see it.
  app.allow_extras();
  app.footer("IDS...: token ids (a JSON array, or separated by commas or spaces); \"-\" reads them from stdin");
  run = [o, cmd = &app] {
    const std::vector<std::string> args = cmd->remaining();
    if (args.empty()) dsv4::usage_fail("give token ids (IDS... or \"-\" for stdin)");
    for (const std::string& a : args)
      if (a.size() > 2 && a.rfind("--", 0) == 0) dsv4::usage_fail("unknown option '{}'", a);
    std::vector<std::vector<int32_t>> parts;  // all arguments checked before the tokenizer loads
    for (const std::string& a : args) parts.push_back(a == "-" ? std::vector<int32_t>{} : parse_token_ids(a, true));
    const auto tok = load_tokenizer(*o);
    std::vector<int32_t> ids;
    for (size_t i = 0; i < args.size(); ++i) {
      const std::vector<int32_t> part = args[i] == "-" ? parse_token_ids(read_stdin(), false) : parts[i];
      for (int32_t id : part)
        if (id >= tok.n_vocab()) {
          const std::string msg = fmt::format("token id {} is outside the vocabulary [0, {})", id, tok.n_vocab());
          if (args[i] == "-") dsv4::fail("{} (on stdin)", msg);
          dsv4::usage_fail("{}", msg);
        }
      ids.insert(ids.end(), part.begin(), part.end());
    }
    const std::string text = tok.decode(ids);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  };
}
DSV4_COMMAND(detokenize, "Token ids -> exact text bytes", setup_detokenize);

struct RenderOpts : TokOpts {
  std::string request;
  bool ids = false, json = false;
};

void setup_render(CLI::App& app, dsv4::cli::Runner& run) {
  auto o = std::make_shared<RenderOpts>();
  add_tokenizer_opts(app, *o);
  app.add_flag("--ids", o->ids, "print the prompt's token ids instead of its text (needs the tokenizer)");
  app.add_flag("--json", o->json, "with --ids: a JSON array");
  app.add_option("request", o->request, "chat request JSON file (OpenAI body: messages, tools, thinking, ...; "
                                        "or a bare message array); \"-\" reads stdin")
      ->required();
  run = [o] {
    dsv4::OrderedJson req = dsv4::parse_chat_request(read_input(o->request));
    if (req.is_array()) req = dsv4::OrderedJson{{"messages", std::move(req)}};  // a bare message list
    const auto prompt = dsv4::render_chat(req);
    if (o->ids) {
      write_ids(dsv4::tokenize_prompt(load_tokenizer(*o), prompt), o->json);
    } else {
      const std::string text = prompt.text();
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
    return 0;
  };
}
DSV4_COMMAND(render, "Print the DeepSeek V4 prompt of a chat request (byte-exact official encoding)", setup_render);

}  // namespace
