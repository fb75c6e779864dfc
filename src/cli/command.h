// Subcommand registry of the `dsv4` program. Each src/cli/cmd_<name>.cpp defines one subcommand:
//
//   static void setup_info(CLI::App& app, dsv4::cli::Runner& run) {
//     auto opts = std::make_shared<Opts>();
//     app.add_option("-m,--model", opts->model, "model folder")->required();
//     run = [opts] { ...; return 0; };      // exit code; throw dsv4::Error for user errors
//   }
//   DSV4_COMMAND(info, "Summarise a checkpoint folder", setup_info);
//
// main.cpp parses with CLI11, calls the chosen Runner, prints dsv4::Error as "dsv4: error: ..." and exits 1 (2 for a
// dsv4::UsageError: a bad command line, to be thrown before the model is loaded).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace dsv4::cli {

using Runner = std::function<int()>;
using Setup = void (*)(CLI::App& app, Runner& run);

struct Command {
  std::string name;
  std::string help;
  Setup setup;
};

std::vector<Command>& registry();

struct Registrar {
  Registrar(const char* name, const char* help, Setup setup) { registry().push_back({name, help, setup}); }
};

}  // namespace dsv4::cli

#define DSV4_COMMAND(name, help, setup) \
  static ::dsv4::cli::Registrar dsv4_command_registrar_##name(#name, help, setup)
