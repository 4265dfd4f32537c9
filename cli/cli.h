#pragma once
// The remat command line: each subcommand registers itself on the CLI11 app and returns an
// exit code. The library does the work; this layer parses, prints and maps errors to codes.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "remat/report.h"
#include "remat/solver.h"

namespace remat::cli {

/// Exit codes shared by every command (docs/cli.md).
enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,     // a bug in remat or an unexpected failure
  kExitBadInput = 2,     // bad arguments, malformed chain file, invalid sequence
  kExitInfeasible = 3,   // the budget cannot be met
  kExitOutOfMemory = 4,  // the device ran out of memory during a step (remat train)
  kExitDistributed = 5,  // another rank of a data-parallel job failed, hung or could not start
};

/// A subcommand's action, run after parsing.
using Action = std::function<int()>;

/// `remat schedule`: registers the subcommand and returns its action.
Action add_schedule_command(CLI::App& app);
/// `remat tradeoff`.
Action add_tradeoff_command(CLI::App& app);
/// `remat split`: a forward graph file split into a chain.
Action add_split_command(CLI::App& app);
/// `remat profile` (needs LibTorch; a build without it explains so).
Action add_profile_command(CLI::App& app);
/// `remat demo` (LibTorch): profile, schedule and train a built-in network.
Action add_demo_command(CLI::App& app);
/// `remat models` (LibTorch): the built-in models, or one model's stages.
Action add_models_command(CLI::App& app);
/// `remat train` (LibTorch): training steps with a schedule, measured against predicted.
Action add_train_command(CLI::App& app);

/// A command that needs LibTorch: `remat` hands it to remat-torch, next to it, and lists it
/// in its help with this description (the same in both executables).
struct TorchCommand {
  const char* name;
  const char* description;
};
inline constexpr TorchCommand kTorchCommands[] = {
    {"profile", "Measure a built-in model on a sample batch into a chain file (remat-chain/2)"},
    {"demo", "Profile a built-in network, choose a schedule at half its memory and train with it"},
    {"models", "List the built-in models, or one model's stages with output shapes and bytes"},
    {"train", "Train a built-in model on random data with a schedule for a memory budget"},
};
/// Registers the LibTorch command `name` (one of kTorchCommands) with its description.
CLI::App* add_torch_subcommand(CLI::App& app, const std::string& name);

/// The command line as main() received it (remat train --nproc starts its ranks with it).
void set_command_line(int argc, char** argv);
const std::vector<std::string>& command_line();

/// Output format of commands that print results.
enum class Format { kText, kJson };
Format parse_format(const std::string& text);

/// Checks a --plot argument: empty (no plot) or a path ending in .svg.
void check_plot_path(const std::string& path);

/// Checks a --threads argument of the solver's commands: 0 (one per core) to kMaxThreads.
void check_solver_threads(int threads);

/// A --link argument, `D2H,H2D,LATENCY`: the bandwidths out to host memory and back in GB/s
/// and each copy's latency in ms (25,25,0.01). Throws std::invalid_argument naming the part.
Link parse_link(const std::string& text);

/// Adds --offload (its help: `offload_help`), --link and --host-memory to a solving command.
void add_offload_options(CLI::App& cmd, bool& offload, std::string& link, std::string& host_memory,
                         const std::string& offload_help);

/// The bound a --host-memory argument sets (SolveOptions::host_memory_bytes): -1 where it was
/// not given; a size as parse_size reads it, with --offload only. Throws std::invalid_argument.
std::int64_t host_memory_option(const std::string& text, bool offload);

/// The chain as a command solves it: `link`, if given (--link), replaces the chain's own; with
/// `offload` (--offload) the chain must then have one.
void apply_link_options(Chain& chain, const std::string& link, bool offload);

/// Checks `cmd`'s --segments, if given: for --algorithm periodic only, and positive.
void check_segments_option(const CLI::App& cmd, Algorithm algorithm, int segments);

/// `text` as a whole number from `low` to `high` (strtol's decimal form, all of the text);
/// nullopt if it is not one.
std::optional<long> whole_number(const std::string& text, long low, long high);

/// `text` safe to print on a terminal: remat::printable, which the SVG pictures use too.
using ::remat::printable;

}  // namespace remat::cli
