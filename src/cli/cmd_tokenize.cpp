// `dsv4 tokenize`, `dsv4 detokenize`, `dsv4 render`: the tokenizer and chat renderer from the command line.
//   dsv4 tokenize (--tokenizer FILE | -m MODEL_DIR) [--json] [--plain] TEXT   (TEXT "-" = exact stdin bytes)
//   dsv4 detokenize (--tokenizer FILE | -m MODEL_DIR) IDS...                   (ids as numbers, "-" = stdin)
//   dsv4 render [--tokenizer FILE | -m MODEL_DIR] [--ids] [--json] REQUEST.json ("-" = stdin; a bare JSON array
//     is taken as the messages)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chat/chat_encoding.h"
#include "cli/command.h"
#include "core/error.h"
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
  dsv4::fail("give --tokenizer FILE or -m MODEL_DIR");
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

struct DetokenizeOpts : TokOpts {
  std::vector<std::string> ids;
};

void setup_detokenize(CLI::App& app, dsv4::cli::Runner& run) {
  auto o = std::make_shared<DetokenizeOpts>();
  add_tokenizer_opts(app, *o);
  app.add_option("ids", o->ids, "token ids (separated by spaces, commas or as a JSON array); \"-\" reads stdin")
      ->required();
  run = [o] {
    const auto tok = load_tokenizer(*o);
    std::string all;
    for (const auto& a : o->ids) all += (a == "-" ? read_stdin() : a) + " ";
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < all.size()) {
      const char c = all[i];
      if (c == ' ' || c == ',' || c == '[' || c == ']' || c == '\n' || c == '\t' || c == '\r') {
        ++i;
        continue;
      }
      size_t j = i;
      if (all[j] == '-') ++j;
      while (j < all.size() && all[j] >= '0' && all[j] <= '9') ++j;
      const std::string num = all.substr(i, j - i);
      if (num.empty() || num == "-" || num.size() > 11) {
        const size_t end = std::min(all.find_first_of(" ,[]\n\t\r", i), i + 20);  // quote one word, one line
        dsv4::fail("'{}' is not a token id", all.substr(i, end - i));
      }
      const long long v = std::stoll(num);  // (11 characters at most: fits)
      if (v < INT32_MIN || v > INT32_MAX) dsv4::fail("token id {} is out of range", num);  // (a cast would wrap)
      ids.push_back(static_cast<int32_t>(v));
      i = j;
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
