// remat: optimal activation checkpointing for chains of layers. Subcommands are in
// *_command.cpp; docs/cli.md documents them all.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "cli.h"

#if REMAT_TORCH_COMMANDS
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>

#include "remat/profiler/memory_tracker.h"
#include "remat/runtime/allocator.h"
#endif

#if REMAT_EXEC_TORCH_HELPER
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

// The LibTorch commands live in remat-torch, installed next to remat.
static std::string torch_helper_path() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string path = n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string();
  const auto slash = path.rfind('/');
  return (slash == std::string::npos ? std::string(".") : path.substr(0, slash)) + "/remat-torch";
}
#endif

namespace {

// Writes a message to standard error without throwing: it may be closed or full (2>/dev/full),
// and a failure to report must neither abort the process (fmt::print throws, and a throw from
// a catch handler here would reach std::terminate) nor hide the exit code.
void report(const std::string& text) noexcept {
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
}

// What every command runs with: a closed pipe is an error, not a signal; on LibTorch, the
// process's memory settings and CPU memory counted from the start.
void set_up_process() {
  // A closed pipe on standard output (`remat tradeoff ... | head -c1`) makes a write fail with
  // EPIPE, reported below as exit 2 (docs/cli.md), rather than kill the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
#if REMAT_TORCH_COMMANDS
  // Training steps free and take back the same activations every step: keep the freed
  // memory in the process rather than faulting it back in page by page (docs/runtime.md).
  const char* malloc_defaults = std::getenv("REMAT_MALLOC_DEFAULTS");
  if (malloc_defaults == nullptr || std::strcmp(malloc_defaults, "1") != 0)
    remat::keep_freed_memory();
  // Every CPU storage from now on is counted, and a CPU allocation that fails is an
  // out-of-memory error (exit 4) as on CUDA, not LibTorch's plain error.
  remat::MemoryTracker::for_device(c10::Device(c10::kCPU));
#endif
}

// CLI11 reports an unknown command as "a subcommand is required": name it instead. Exit 2 for
// one, 0 when the first argument is an option or a command.
int refuse_unknown_command(const CLI::App& app, int argc, char** argv) {
  using namespace remat::cli;
  const auto commands = app.get_subcommands([](const CLI::App*) { return true; });
  const bool known =
      argc > 1 && std::any_of(commands.begin(), commands.end(),
                              [&](const CLI::App* c) { return c->get_name() == argv[1]; });
  if (argc <= 1 || argv[1][0] == '-' || known) return 0;
  std::string names;
  for (const CLI::App* c : commands) names += (names.empty() ? "" : ", ") + c->get_name();
  report(fmt::format("remat: unknown command '{}' (commands: {})\n", printable(argv[1]), names));
  report("Run 'remat --help' for usage.\n");
  return kExitBadInput;
}

// Values CLI11 takes but remat refuses: exit 2 for the first, 0 when there is none.
// - An empty value (-o "", a variable that expanded to nothing): taken as not given, it would
//   silently do something else (print rather than write a file).
// - A whole number past 64 bits: CLI11 reads it with strtoll and does not look at ERANGE, so it
//   would be taken as the largest (or smallest) one.
int refuse_option_values(const CLI::App& app) {
  using namespace remat::cli;
  const auto refuse = [](const CLI::App* command, const std::string& what) {
    report(fmt::format("remat {}: {}\n", command->get_name(), what));
    report(fmt::format("Run 'remat {} --help' for usage.\n", command->get_name()));
    return kExitBadInput;
  };
  for (const CLI::App* command : app.get_subcommands()) {
    for (const CLI::Option* option : command->get_options()) {
      if (option->count() == 0 || option->get_type_size() == 0) continue;
      const auto& values = option->results();
      if (std::any_of(values.begin(), values.end(),
                      [](const std::string& v) { return v.empty(); }))
        return refuse(command, option->get_name() + " was given an empty value");
      const std::string type = option->get_type_name();
      if (type != "INT" && type != "UINT") continue;
      for (const std::string& v : values) {
        errno = 0;
        char* end = nullptr;
        if (type == "INT")
          (void)std::strtoll(v.c_str(), &end, 0);
        else
          (void)std::strtoull(v.c_str(), &end, 0);
        if (errno != ERANGE) continue;
        return refuse(command, fmt::format("{} {} is out of range (a 64-bit whole number)",
                                           option->get_name(), printable(v.substr(0, 40))));
      }
    }
  }
  return 0;
}

int stdout_failed(int error) {
  // fprintf, which does not throw: standard error may be the same closed pipe.
  std::fprintf(stderr, "remat: writing to standard output failed: %s\n", std::strerror(error));
  return remat::cli::kExitBadInput;
}

// Runs the command parsed, its errors reported with their exit codes (docs/cli.md).
int run_command(const std::vector<std::pair<const char*, remat::cli::Action>>& actions,
                const CLI::App& app) {
  using namespace remat::cli;
  try {
    int code = kExitInternal;
    for (const auto& [name, action] : actions)
      if (app.got_subcommand(name)) code = action();
    // Results that did not reach standard output (a full disk, a closed pipe) are a failure.
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) return stdout_failed(errno);
    return code;
  } catch (const std::invalid_argument& error) {
    report(fmt::format("remat: {}\n", printable(error.what())));
    return kExitBadInput;
  } catch (const remat::FileError& error) {  // an output that cannot be written
    report(fmt::format("remat: {}\n", printable(error.what())));
    return kExitBadInput;
#if REMAT_TORCH_COMMANDS
  } catch (const c10::OutOfMemoryError& error) {
    report(
        fmt::format("remat: out of memory: {} (try a smaller --batch or --image, or for training a "
                    "smaller --budget)\n",
                    printable(error.what_without_backtrace())));
    return kExitOutOfMemory;
  } catch (const c10::ValueError& error) {  // bad input, as remat's LibTorch code reports it
    report(fmt::format("remat: {}\n", printable(error.what_without_backtrace())));
    return kExitBadInput;
  } catch (const c10::Error& error) {
    report(fmt::format("remat: internal error: {}\n", printable(error.what_without_backtrace())));
    return kExitInternal;
#endif
  } catch (const std::bad_alloc&) {  // the solver's tables, or any other memory remat needs
    report(
        fmt::format("remat: out of memory: an allocation failed (for the solver: fewer "
                    "--slots, or a shorter chain)\n"));
    return kExitOutOfMemory;
  } catch (const std::system_error& error) {
    // fmt::print throws when a write fails: on standard output, a closed pipe or a full disk
    // (exit 2, as when the last flush fails), not a bug; likewise on standard error.
    if (std::ferror(stdout)) return stdout_failed(error.code().value());
    // On standard error (a warning, a progress line): nothing more can be said there.
    if (std::ferror(stderr)) return kExitBadInput;
    report(fmt::format("remat: internal error: {}\n", printable(error.what())));
    return kExitInternal;
  } catch (const std::exception& error) {
    report(fmt::format("remat: internal error: {}\n", printable(error.what())));
    return kExitInternal;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace remat::cli;
  set_up_process();
  set_command_line(argc, argv);
#if REMAT_EXEC_TORCH_HELPER
  if (argc > 1 &&
      std::any_of(std::begin(kTorchCommands), std::end(kTorchCommands),
                  [&](const TorchCommand& c) { return std::string(argv[1]) == c.name; })) {
    const std::string helper = torch_helper_path();
    execv(helper.c_str(), argv);
    report(
        fmt::format("remat: cannot run {} for '{}': {}\n", helper, argv[1], std::strerror(errno)));
    return kExitInternal;
  }
#endif
  CLI::App app{"remat: train deep chains in less memory with optimal recomputation schedules",
               "remat"};
  app.set_version_flag("--version", "remat 0.1.0");
  app.require_subcommand(1);
  app.failure_message(CLI::FailureMessage::help);
  const std::vector<std::pair<const char*, Action>> actions = {
      {"schedule", add_schedule_command(app)}, {"tradeoff", add_tradeoff_command(app)},
      {"split", add_split_command(app)},       {"profile", add_profile_command(app)},
      {"demo", add_demo_command(app)},         {"models", add_models_command(app)},
      {"train", add_train_command(app)}};
  if (const int code = refuse_unknown_command(app, argc, argv)) return code;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForVersion& version) {
    return app.exit(version);
  } catch (const CLI::ParseError& error) {
    report(fmt::format("remat: {}\n", printable(error.what())));
    report("Run 'remat --help' or 'remat <command> --help' for usage.\n");
    return kExitBadInput;
  }
  if (const int code = refuse_option_values(app)) return code;
  return run_command(actions, app);
}
