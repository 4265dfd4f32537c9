// remat schedule: the best schedule of a chain file under a budget.
#include <fmt/format.h>

#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli.h"

namespace remat::cli {
namespace {

struct ScheduleArgs {
  std::string chain_path;
  std::string budget;
  std::string algorithm = "optimal";
  int segments = 0;
  std::int64_t slots = 0;
  std::string format = "text";
  int threads = 0;
  bool ignore_nograd_time = false;
  bool reference_recurrence = false;
  bool no_search_above_budget = false;
  bool no_merged_runs = false;
  bool no_exact_storages = false;
  bool offload = false;
  std::string link;
  std::string host_memory;
  std::string plot;
};

// Wraps a space-separated text at `width` columns, each line indented.
std::string wrap(const std::string& text, std::size_t width, const std::string& indent) {
  std::string out, line;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > width) {
      out += indent + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    start = end + 1;
  }
  if (!line.empty()) out += indent + line + "\n";
  return out;
}

void print_text(const Chain& chain, const Solution& solution, const SolveOptions& options) {
  fmt::print("chain        {} ({}, input {})\n",
             chain.name.empty() ? "-" : printable(chain.name), counted(chain.length(), "stage"),
             format_bytes(chain.input_bytes()));
  std::string algorithm(algorithm_name(solution.algorithm));
  if (solution.algorithm == Algorithm::kOptimal) {
    const Discretization& disc = solution.discretization;
    if (disc.unit_bytes == 1 && disc.capacity_units == solution.solved_budget_bytes) {
      algorithm += ", exact bytes";
    } else {
      algorithm +=
          fmt::format(", {} slots of {}{}", disc.capacity_units, format_bytes(disc.unit_bytes),
                      options.slots() > 0 ? " (--slots)" : "");
    }
  } else if (solution.algorithm == Algorithm::kPeriodic) {
    algorithm += fmt::format(", {} segments", solution.parameter);
  } else if (solution.algorithm == Algorithm::kRevolve && solution.ok()) {
    algorithm += fmt::format(", {} checkpoints", solution.parameter);
  }
  if (!options.use_nograd_time()) algorithm += ", fwd_nograd_ms ignored";
  if (options.reference_recurrence()) algorithm += ", reference recurrence";
  fmt::print("algorithm    {}\n", algorithm);
  fmt::print("budget       {}\n", format_bytes_exact(solution.budget_bytes));
  // With carried members, the dynamic program's budget can be larger (its model counts them
  // more than once; the sequence's exact peak fits the budget).
  if (solution.algorithm == Algorithm::kOptimal && solution.ok() &&
      solution.solved_budget_bytes != solution.budget_bytes)
    fmt::print(
        "solved for   {} (the dynamic program counts carried members once per "
        "activation; the exact peak fits the budget)\n",
        format_bytes_exact(solution.solved_budget_bytes));
  // With runs of stages carrying a member, the sequence can be the merged chain's, expanded.
  if (solution.algorithm == Algorithm::kOptimal && solution.ok() && solution.merged_stages > 0)
    fmt::print("merged       solved as {} (each run of stages carrying a member as one)\n",
               counted(solution.merged_stages, "stage"));
  // With carried members, whether the storage-exact table was solved (every storage once).
  if (solution.algorithm == Algorithm::kOptimal && solution.exact_storages)
    fmt::print("storages     also solved with each storage counted once (the storage-exact "
               "table)\n");
  fmt::print("status       {}\n", status_name(solution.status));
  if (solution.ok()) {
    const double overhead =
        solution.store_all_makespan_ms > 0
            ? 100.0 * (solution.makespan_ms / solution.store_all_makespan_ms - 1.0)
            : 0.0;
    fmt::print("makespan     {:.3f} ms, {} against store-all ({:.3f} ms)\n", solution.makespan_ms,
               format_signed_percent(overhead), solution.store_all_makespan_ms);
    fmt::print("peak         {}\n", format_bytes_exact(solution.peak_bytes));
  }
  if (solution.min_feasible_budget_bytes >= 0) {
    fmt::print("min budget   {}\n", format_bytes_exact(solution.min_feasible_budget_bytes));
  } else {
    fmt::print("min budget   none with {} slots\n", options.slots());
  }
  fmt::print("solve time   {:.3f} s\n", solution.solve_seconds);
  if (solution.ok() && options.offload()) {
    const Simulation& sim = solution.simulation;
    fmt::print(
        "offload      {} checkpoint{} over a link of {} GB/s out, {} GB/s back, {} ms "
        "latency; copies waited for {:.3f} ms; host memory {}{}\n",
        sim.offloads, sim.offloads == 1 ? "" : "s", chain.link->d2h_gbps, chain.link->h2d_gbps,
        chain.link->latency_ms, sim.copy_wait_ms, format_bytes_exact(sim.host_peak_bytes),
        options.host_memory_bytes() >= 0
            ? " of at most " + format_bytes_exact(options.host_memory_bytes())
            : std::string());
  }
  if (solution.ok()) {
    const auto nograd = solution.simulation.nograd_forwards;
    fmt::print("sequence     {} operations, {} forward{} without autograd",
               solution.sequence.size(), nograd, nograd == 1 ? "" : "s");
    // Restarts only where the chain gives them a cost (a profile taken on a GPU).
    if (chain.restart_ms > 0) {
      const auto restarts = solution.simulation.restarts;
      fmt::print(", {} restart{} ({:.3f} ms each)", restarts, restarts == 1 ? "" : "s",
                 chain.restart_ms);
    }
    fmt::print("\n");
    fmt::print("{}", wrap(collapsed_string(solution.sequence), 100, "  "));
  }
}

void print_json(const Chain& chain, const Solution& solution, const SolveOptions& options) {
  nlohmann::json out = nlohmann::json::object();
  out["status"] = status_name(solution.status);
  out["algorithm"] = algorithm_name(solution.algorithm);
  out["chain"] = chain.name;
  out["stages"] = chain.length();
  out["budget_bytes"] = solution.budget_bytes;
  out["makespan_ms"] = solution.ok() ? nlohmann::json(solution.makespan_ms) : nlohmann::json();
  out["store_all_makespan_ms"] = solution.store_all_makespan_ms;
  out["peak_bytes"] = solution.ok() ? nlohmann::json(solution.peak_bytes) : nlohmann::json();
  out["min_feasible_budget_bytes"] = solution.min_feasible_budget_bytes >= 0
                                         ? nlohmann::json(solution.min_feasible_budget_bytes)
                                         : nlohmann::json();
  out["sequence"] = op_strings(solution.sequence);
  out["solve_seconds"] = solution.solve_seconds;
  out["use_nograd_time"] = options.use_nograd_time();
  out["reference_recurrence"] = options.reference_recurrence();
  out["offload"] = options.offload();
  if (options.offload() && solution.ok()) {
    out["offloads"] = solution.simulation.offloads;
    out["copy_wait_ms"] = solution.simulation.copy_wait_ms;
    out["host_peak_bytes"] = solution.simulation.host_peak_bytes;
  }
  if (options.host_memory_bytes() >= 0) out["host_memory_bytes"] = options.host_memory_bytes();
  if (chain.restart_ms > 0) {
    out["restart_ms"] = chain.restart_ms;
    out["restarts"] =
        solution.ok() ? nlohmann::json(solution.simulation.restarts) : nlohmann::json();
  }
  if (!solution.warning.empty()) out["warning"] = solution.warning;
  if (solution.algorithm == Algorithm::kOptimal) {
    out["slots"] = solution.discretization.capacity_units;
    out["unit_bytes"] = solution.discretization.unit_bytes;
    out["solved_budget_bytes"] = solution.solved_budget_bytes;
    out["merged_stages"] = solution.merged_stages;
    out["exact_storages"] = solution.exact_storages;
  } else if (solution.algorithm == Algorithm::kPeriodic) {
    out["segments"] = solution.parameter;
  } else if (solution.algorithm == Algorithm::kRevolve) {
    out["checkpoints"] = solution.ok() ? nlohmann::json(solution.parameter) : nlohmann::json();
  }
  fmt::print("{}\n", out.dump(2));
}

}  // namespace

Action add_schedule_command(CLI::App& app) {
  auto args = std::make_shared<ScheduleArgs>();
  CLI::App* cmd = app.add_subcommand(
      "schedule", "Compute the fastest schedule of a chain file within a budget");
  cmd->add_option("--chain", args->chain_path, "Chain file (remat-chain/3, /2 or /1 JSON)")
      ->required();
  cmd->add_option("--budget", args->budget,
                  "Activation memory budget: bytes with a unit (700MiB, 2.5GiB, 1e9) or a "
                  "percentage of the store-all peak (50%); min, the least budget any schedule "
                  "fits; either followed by + (50%+): that, or the least where more")
      ->required();
  cmd->add_option("--algorithm", args->algorithm,
                  "optimal, store-all, recompute-all, periodic or revolve")
      ->capture_default_str();
  cmd->add_option("--segments", args->segments,
                  "periodic: number of segments K (default round(sqrt(L)))");
  cmd->add_option("--slots", args->slots,
                  "optimal: memory slots N, as the reference rotor (default: automatic)");
  cmd->add_option("--format", args->format, "Output: text or json")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Solver threads (default: all cores)");
  cmd->add_option("--plot", args->plot, "Draw the schedule (timeline and memory) into FILE.svg");
  cmd->add_flag("--ignore-nograd-time", args->ignore_nograd_time,
                "Cost Fn/CF with fwd_ms, as the reference does, even when fwd_nograd_ms is given");
  cmd->add_flag("--reference-recurrence", args->reference_recurrence,
                "optimal: check the chain step's memory as the published recurrence does "
                "(reproduces the reference's numbers; may overrun with fwd_tmp_bytes)");
  cmd->add_flag("--no-search-above-budget", args->no_search_above_budget,
                "optimal, with carried members: do not also solve for larger budgets whose "
                "schedule's exact peak fits (docs/algorithms.md, \"Carried members\")");
  cmd->add_flag("--no-merged-runs", args->no_merged_runs,
                "optimal, with carried members: do not also solve the chain with each run of "
                "stages that carries a member merged into one stage");
  add_offload_options(*cmd, args->offload, args->link, args->host_memory,
                      "optimal: also offload checkpoints to host memory over the chain's link and "
                      "copy them back, where that beats keeping or recomputing them "
                      "(docs/cost-model.md, \"Offload\")");
  cmd->add_flag("--no-exact-storages", args->no_exact_storages,
                "optimal, with carried members: do not also solve the storage-exact table, in "
                "which every storage counts once (docs/algorithms.md)");

  return [args, cmd]() -> int {
    const Format format = parse_format(args->format);
    const Algorithm algorithm = parse_algorithm(args->algorithm);
    check_segments_option(*cmd, algorithm, args->segments);
    REMAT_CHECK(cmd->count("--slots") == 0 || algorithm == Algorithm::kOptimal,
                "--slots applies to --algorithm optimal only");
    REMAT_CHECK(cmd->count("--slots") == 0 || args->slots > 0, "--slots (", args->slots,
                ") must be a positive number of slots");
    REMAT_CHECK(!args->reference_recurrence || algorithm == Algorithm::kOptimal,
                "--reference-recurrence applies to --algorithm optimal only");
    REMAT_CHECK(
        !(args->no_search_above_budget || args->no_merged_runs || args->no_exact_storages) ||
            algorithm == Algorithm::kOptimal,
        "--no-search-above-budget, --no-merged-runs and --no-exact-storages apply to "
        "--algorithm optimal only");
    check_solver_threads(args->threads);
    check_plot_path(args->plot);
    REMAT_CHECK(!args->offload || algorithm == Algorithm::kOptimal,
                "--offload applies to --algorithm optimal only");
    REMAT_CHECK(!(args->offload && args->reference_recurrence),
                "--offload and --reference-recurrence exclude each other");
    Chain chain = load_chain(args->chain_path);
    apply_link_options(chain, args->link, args->offload);
    SolveOptions options =
        SolveOptions(0)
            .algorithm(algorithm)
            .segments(args->segments)
            .slots(args->slots)
            .threads(args->threads)
            .use_nograd_time(!args->ignore_nograd_time)
            .reference_recurrence(args->reference_recurrence)
            .search_above_budget(!args->no_search_above_budget)
            .merge_carried_runs(!args->no_merged_runs)
            .exact_storages(!args->no_exact_storages)
            .offload(args->offload)
            .host_memory_bytes(host_memory_option(args->host_memory, args->offload));
    const std::int64_t budget = parse_budget(args->budget, store_all_peak(chain), [&] {
      return min_feasible_budget(chain, options);
    });
    options.budget_bytes(budget);
    const Solution solution = solve(chain, options);
    if (format == Format::kJson) {
      print_json(chain, solution, options);
    } else {
      print_text(chain, solution, options);
    }
    if (!args->plot.empty() && solution.ok())
      write_text_file(args->plot, schedule_svg(chain, solution));
    std::fflush(stdout);  // keep stdout and stderr in order when both go to one place
    if (!solution.warning.empty())
      fmt::print(stderr, "remat: warning: {}\n", printable(solution.warning));
    if (!solution.ok()) {
      if (solution.min_feasible_budget_bytes >= 0) {
        fmt::print(stderr, "remat: infeasible: {} cannot run in {}; it needs at least {}\n",
                   algorithm_name(algorithm), format_bytes_exact(budget),
                   format_bytes_exact(solution.min_feasible_budget_bytes));
      } else {
        const std::int64_t needed = min_feasible_slots(chain, options);
        if (needed > args->slots) {
          fmt::print(stderr,
                     "remat: infeasible: no budget works with {} slots: this chain needs at least "
                     "{} (--slots {})\n",
                     args->slots, needed, needed);
        } else {  // every budget up to int64's largest rounds to too few units
          fmt::print(stderr,
                     "remat: infeasible: no budget up to {} bytes works with {} slots; use fewer "
                     "slots\n",
                     std::numeric_limits<std::int64_t>::max(), args->slots);
        }
      }
      return kExitInfeasible;
    }
    return kExitOk;
  };
}

}  // namespace remat::cli
