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
#include <system_error>

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

}  // namespace

int main(int argc, char** argv) {
  using namespace remat::cli;
  // A closed pipe on standard output (`remat tradeoff ... | head -c1`) makes a write fail with
  // EPIPE, reported below as exit 2 (docs/cli.md), rather than kill the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  set_command_line(argc, argv);
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
  Action schedule = add_schedule_command(app);
  Action tradeoff = add_tradeoff_command(app);
  Action split = add_split_command(app);
  Action profile = add_profile_command(app);
  Action demo = add_demo_command(app);
  Action models = add_models_command(app);
  Action train = add_train_command(app);

  // CLI11 reports an unknown command as "a subcommand is required": name it instead.
  const auto commands = app.get_subcommands([](const CLI::App*) { return true; });
  const bool known =
      argc > 1 && std::any_of(commands.begin(), commands.end(),
                              [&](const CLI::App* c) { return c->get_name() == argv[1]; });
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::string names;
    for (const CLI::App* c : commands) names += (names.empty() ? "" : ", ") + c->get_name();
    report(fmt::format("remat: unknown command '{}' (commands: {})\n", printable(argv[1]), names));
    report("Run 'remat --help' for usage.\n");
    return kExitBadInput;
  }
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
  // An option given an empty value (-o "", a variable that expanded to nothing) is refused:
  // taken as not given, it would silently do something else (print rather than write a file).
  for (const CLI::App* command : app.get_subcommands()) {
    for (const CLI::Option* option : command->get_options()) {
      if (option->count() == 0 || option->get_type_size() == 0) continue;
      const auto& values = option->results();
      if (std::any_of(values.begin(), values.end(),
                      [](const std::string& v) { return v.empty(); })) {
        report(fmt::format("remat {}: {} was given an empty value\n", command->get_name(),
                           option->get_name()));
        report(fmt::format("Run 'remat {} --help' for usage.\n", command->get_name()));
        return kExitBadInput;
      }
      // CLI11 reads a whole number with strtoll and does not look at ERANGE: a value past 64
      // bits would be taken as the largest (or smallest) one.
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
        report(fmt::format("remat {}: {} {} is out of range (a 64-bit whole number)\n",
                           command->get_name(), option->get_name(), printable(v.substr(0, 40))));
        report(fmt::format("Run 'remat {} --help' for usage.\n", command->get_name()));
        return kExitBadInput;
      }
    }
  }
  const auto stdout_failed = [](int error) {
    // fprintf, which does not throw: standard error may be the same closed pipe.
    std::fprintf(stderr, "remat: writing to standard output failed: %s\n", std::strerror(error));
    return kExitBadInput;
  };
  try {
    int code = kExitInternal;
    if (app.got_subcommand("schedule")) code = schedule();
    if (app.got_subcommand("tradeoff")) code = tradeoff();
    if (app.got_subcommand("split")) code = split();
    if (app.got_subcommand("profile")) code = profile();
    if (app.got_subcommand("demo")) code = demo();
    if (app.got_subcommand("models")) code = models();
    if (app.got_subcommand("train")) code = train();
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
  return kExitInternal;
}
