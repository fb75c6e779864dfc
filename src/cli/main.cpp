// dsv4 command-line entry point: dispatches to the subcommands registered in src/cli/cmd_*.cpp.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/int_option.h"
#include "core/error.h"
#include "core/log.h"

namespace dsv4::cli {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace dsv4::cli

namespace {

// After a parse error: the first word of argv that names no command where a command is expected ("dsv4 frobnicate",
// "dsv4 bench frobnicate"), as a message listing the valid ones; empty when every command word is known.
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* level = &app;
  std::string path = "dsv4";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.empty() || a[0] == '-') {
      if (level != &app) return {};  // the command's own options: CLI11's message is the right one
      continue;                      // the top level's options are flags (-v, --verbose)
    }
    const std::vector<CLI::App*> subs = level->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return {};
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* s : subs) {
      if (s->get_name() == a) next = s;
      names += (names.empty() ? "" : ", ") + s->get_name();
    }
    if (!next) return fmt::format("unknown command '{}' for {} (commands: {}; see {} --help)", a, path, names, path);
    level = next;
    path += " " + a;
  }
  return {};
}

// CLI11 names an option by its long name in its errors ("--tokens: Value 0 not in range ..."), also when the user
// typed the short one (-n): such a message names both spellings ("-n/--tokens: ..."). Looks the option up in the
// command that was being parsed (the deepest subcommand given).
std::string with_both_spellings(CLI::App& app, const std::string& msg) {
  const size_t colon = msg.find(": ");
  if (msg.rfind("--", 0) != 0 || colon == std::string::npos) return msg;
  CLI::App* level = &app;
  for (std::vector<CLI::App*> subs = level->get_subcommands(); !subs.empty(); subs = level->get_subcommands())
    level = subs.front();
  const CLI::Option* opt = level->get_option_no_throw(msg.substr(0, colon));
  if (!opt || opt->get_snames().empty()) return msg;
  return "-" + opt->get_snames().front() + "/" + msg;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dsv4;
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"dsv4: DeepSeek V4 inference engine"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dsv4 0.1.0");
  int verbosity = 0;
  app.add_flag("-v,--verbose", verbosity, "more logging on stderr (-v info, -vv debug)");

  auto& cmds = cli::registry();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::map<CLI::App*, cli::Runner> runners;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    c.setup(*sub, runners[sub]);
  }
  cli::decimal_integer_options(app);  // "010" is 10 and "0x10" an error, for every integer option
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Usage errors: one line, like every other dsv4 error, and exit 2.
    if (const std::string u = unknown_command(app, argc, argv); !u.empty()) {
      std::fprintf(stderr, "dsv4: error: %s\n", u.c_str());
      return 2;
    }
    std::fprintf(stderr, "dsv4: error: %s (see --help)\n", with_both_spellings(app, e.what()).c_str());
    return 2;
  }
  log::set_verbosity(verbosity);
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run ? run() : 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "dsv4: error: %s (see --help)\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
