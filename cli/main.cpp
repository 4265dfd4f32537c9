// remat: optimal activation checkpointing for chains of layers. Subcommands are in
// *_command.cpp; docs/cli.md documents them all.
#include <fmt/core.h>

#include <exception>
#include <iostream>

#include "cli.h"

int main(int argc, char** argv) {
  using namespace remat::cli;
  CLI::App app{"remat: train deep chains in less memory with optimal recomputation schedules",
               "remat"};
  app.set_version_flag("--version", "remat 0.1.0");
  app.require_subcommand(1);
  app.failure_message(CLI::FailureMessage::help);
  Action schedule = add_schedule_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForVersion& version) {
    return app.exit(version);
  } catch (const CLI::ParseError& error) {
    fmt::print(stderr, "remat: {}\n", error.what());
    fmt::print(stderr, "Run 'remat --help' or 'remat <command> --help' for usage.\n");
    return kExitBadInput;
  }
  try {
    if (app.got_subcommand("schedule")) return schedule();
  } catch (const std::invalid_argument& error) {
    fmt::print(stderr, "remat: {}\n", error.what());
    return kExitBadInput;
  } catch (const std::exception& error) {
    fmt::print(stderr, "remat: internal error: {}\n", error.what());
    return kExitInternal;
  }
  return kExitInternal;
}
