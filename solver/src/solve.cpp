#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>

#include "discretization.h"
#include "heuristics.h"
#include "merged_chain.h"
#include "remat/base/check.h"
#include "remat/solver/solver.h"
#include "strategies.h"
#include "unit_chain.h"

namespace remat {
namespace {

struct AlgorithmName {
  Algorithm algorithm;
  const char* name;
};
constexpr AlgorithmName kAlgorithmNames[] = {
    {Algorithm::kOptimal, "optimal"},
    {Algorithm::kStoreAll, "store-all"},
    {Algorithm::kRecomputeAll, "recompute-all"},
    {Algorithm::kPeriodic, "periodic"},
    {Algorithm::kRevolve, "revolve"},
};

int default_segments(int length) {
  return std::clamp(static_cast<int>(std::lround(std::sqrt(static_cast<double>(length)))), 1,
                    length);
}

// Records a sequence that fits, with its simulation, as the result.
void accept(Sequence sequence, Simulation sim, SolveStatus status, Solution& out) {
  out.status = status;
  out.sequence = std::move(sequence);
  out.makespan_ms = sim.makespan_ms;
  out.peak_bytes = sim.peak_bytes;
  out.simulation = std::move(sim);
}

// A heuristic's sequence against the budget; its smallest budget is `min_budget`, or its own
// peak when `min_budget` is negative (a sequence that does not depend on the budget).
void finish_heuristic(const Chain& chain, const SolveOptions& options, Sequence sequence,
                      std::int64_t min_budget, Solution& out) {
  Simulation sim = simulate(chain, sequence, TimeModel{options.use_nograd_time()});
  out.min_feasible_budget_bytes = min_budget >= 0 ? min_budget : sim.peak_bytes;
  if (sim.peak_bytes > options.budget_bytes()) {
    out.status = SolveStatus::kInfeasible;
    return;
  }
  accept(std::move(sequence), std::move(sim), SolveStatus::kFeasible, out);
}

// The optimal solver: the strategies that apply (strategies.h), each run in turn; the fastest
// candidate is kept (a tie keeps the earlier), and the least budget is the least of theirs.
void solve_optimal(const Chain& chain, const SolveOptions& options, Solution& out) {
  out.solved_budget_bytes = options.budget_bytes();
  out.min_feasible_budget_bytes = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::unique_ptr<detail::Strategy>> strategies =
      detail::optimal_strategies(chain, options);
  std::optional<detail::Candidate> best;
  for (std::size_t k = 0; k < strategies.size(); ++k) {
    detail::Strategy& strategy = *strategies[k];
    // Store-all's time is never beaten: the other strategies give their least budgets only.
    if (!best || best->simulation.makespan_ms > out.store_all_makespan_ms) {
      detail::Outcome outcome = strategy.run(best ? &*best : nullptr);
      out.exact_storages = out.exact_storages || outcome.exact_storages;
      if (k == 0) {  // what the result reports where no strategy finds a sequence
        out.discretization = outcome.discretization;
        out.warning = outcome.warning;
      }
      // Under a bound on host memory, a strategy that does not know it may still offload
      // more: its candidate is dropped.
      if (outcome.candidate && options.host_memory_bytes() >= 0 &&
          outcome.candidate->simulation.host_peak_bytes > options.host_memory_bytes())
        outcome.candidate.reset();
      if (outcome.candidate &&
          (!best || detail::faster(outcome.candidate->simulation.makespan_ms,
                                   best->simulation.makespan_ms)))
        best = std::move(outcome.candidate);
    }
    out.min_feasible_budget_bytes =
        std::min(out.min_feasible_budget_bytes, strategy.least_budget());
  }
  if (!best) return;
  out.discretization = best->discretization;
  out.solved_budget_bytes = best->solved_budget_bytes;
  out.merged_stages = best->merged_stages;
  out.warning = std::move(best->warning);
  accept(std::move(best->sequence), std::move(best->simulation), best->status, out);
}

std::int64_t peak_of(const Chain& chain, const Sequence& sequence) {
  return simulate(chain, sequence).peak_bytes;
}

// Revolve: the most checkpoints whose sequence fits (more checkpoints, fewer recomputations).
void solve_revolve(const Chain& chain, const SolveOptions& options, Solution& out) {
  const int length = chain.length();
  const detail::RevolvePlanner planner(length, length);
  std::vector<std::int64_t> peaks(static_cast<std::size_t>(length) + 1);
  for (int snapshots = 1; snapshots <= length; ++snapshots)
    peaks[static_cast<std::size_t>(snapshots)] = peak_of(chain, planner.sequence(snapshots));
  const std::int64_t min_budget = *std::min_element(peaks.begin() + 1, peaks.end());
  for (int snapshots = length; snapshots >= 1; --snapshots) {
    if (peaks[static_cast<std::size_t>(snapshots)] <= options.budget_bytes()) {
      out.parameter = snapshots;
      finish_heuristic(chain, options, planner.sequence(snapshots), min_budget, out);
      return;
    }
  }
  out.status = SolveStatus::kInfeasible;
  out.min_feasible_budget_bytes = min_budget;
}

}  // namespace

std::string_view algorithm_name(Algorithm algorithm) {
  for (const auto& entry : kAlgorithmNames)
    if (entry.algorithm == algorithm) return entry.name;
  return "?";
}

Algorithm parse_algorithm(std::string_view name) {
  for (const auto& entry : kAlgorithmNames)
    if (name == entry.name) return entry.algorithm;
  REMAT_CHECK(false, "unknown algorithm '", name,
              "' (expected optimal, store-all, recompute-all, periodic or revolve)");
  return Algorithm::kOptimal;
}

const std::vector<Algorithm>& all_algorithms() {
  static const std::vector<Algorithm> kAll = {Algorithm::kOptimal, Algorithm::kStoreAll,
                                              Algorithm::kRecomputeAll, Algorithm::kPeriodic,
                                              Algorithm::kRevolve};
  return kAll;
}

std::string_view status_name(SolveStatus status) {
  switch (status) {
    case SolveStatus::kOptimal:
      return "optimal";
    case SolveStatus::kFeasible:
      return "feasible";
    case SolveStatus::kInfeasible:
      return "infeasible";
  }
  return "?";
}

namespace {
// The options other than the budget (which min_feasible_budget ignores).
void check_options(const SolveOptions& options) {
  REMAT_CHECK(options.slots() >= 0, "slots (", options.slots(), ") must not be negative");
  REMAT_CHECK(options.threads() >= 0, "threads (", options.threads(), ") must not be negative");
  REMAT_CHECK(options.threads() <= kMaxThreads, "threads (", options.threads(),
              ") must be at most ", kMaxThreads, " (0, the default, runs one per core)");
  REMAT_CHECK(options.memory_limit_bytes() >= 0, "memory_limit_bytes (",
              options.memory_limit_bytes(), ") must not be negative");
  // An option the algorithm would ignore is refused: the caller meant something else.
  const std::string_view algorithm = algorithm_name(options.algorithm());
  REMAT_CHECK(options.slots() == 0 || options.algorithm() == Algorithm::kOptimal, "slots (",
              options.slots(), ") apply to algorithm 'optimal' only, not '", algorithm, "'");
  REMAT_CHECK(options.segments() == 0 || options.algorithm() == Algorithm::kPeriodic, "segments (",
              options.segments(), ") apply to algorithm 'periodic' only, not '", algorithm, "'");
  REMAT_CHECK(!options.reference_recurrence() || options.algorithm() == Algorithm::kOptimal,
              "the reference recurrence applies to algorithm 'optimal' only, not '", algorithm,
              "'");
  REMAT_CHECK(!options.offload() || options.algorithm() == Algorithm::kOptimal,
              "offload applies to algorithm 'optimal' only, not '", algorithm, "'");
  REMAT_CHECK(!options.offload() || !options.reference_recurrence(),
              "offload and the reference recurrence exclude each other (the reference has no "
              "offload)");
  REMAT_CHECK(options.host_memory_bytes() >= -1, "host_memory_bytes (", options.host_memory_bytes(),
              ") must be at least 0 (-1: no bound)");
  REMAT_CHECK(options.host_memory_bytes() < 0 || options.offload(), "host_memory_bytes (",
              options.host_memory_bytes(), ") bounds the offloaded copies: it needs offload");
  REMAT_CHECK(options.host_slots() >= 1 && options.host_slots() <= kMaxHostSlots, "host_slots (",
              options.host_slots(), ") must be from 1 to ", kMaxHostSlots);
}
// Offload needs the chain's link.
void check_link(const Chain& chain, const SolveOptions& options) {
  REMAT_CHECK(!options.offload() || chain.link, detail::chain_source(chain),
              " has no link to host memory, which offload needs: profile it on the device, or "
              "give the link's bandwidths and latency");
}
}  // namespace

std::int64_t store_all_peak(const Chain& chain) {
  return peak_of(chain, detail::store_all_sequence(chain.length()));
}

Solution solve(const Chain& chain, const SolveOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  chain.validate(detail::chain_source(chain));
  REMAT_CHECK(options.budget_bytes() >= 0, "the budget (", options.budget_bytes(),
              " bytes) must not be negative");
  check_options(options);
  check_link(chain, options);
  // Members of x_0 carried on, without gradient: solved as context, which the dynamic program
  // counts once (detail::pin_input_members); the same sequences, peaks and times.
  if (options.algorithm() == Algorithm::kOptimal && !options.reference_recurrence()) {
    if (const std::optional<Chain> pinned = detail::pin_input_members(chain)) {
      Solution out = solve(*pinned, options);
      if (out.ok()) {
        Simulation sim = simulate(chain, out.sequence, TimeModel{options.use_nograd_time()});
        REMAT_INTERNAL_ASSERT(sim.peak_bytes == out.peak_bytes &&
                                  sim.makespan_ms == out.simulation.makespan_ms,
                              "the sequence peaks at ", sim.peak_bytes, " bytes, not ",
                              out.peak_bytes, ", with x_0's members as context");
        out.simulation = std::move(sim);
      }
      out.solve_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      return out;
    }
  }
  const int length = chain.length();
  Solution out;
  out.algorithm = options.algorithm();
  out.budget_bytes = options.budget_bytes();
  out.store_all_makespan_ms = chain.store_all_ms();
  switch (options.algorithm()) {
    case Algorithm::kOptimal: {
      solve_optimal(chain, options, out);
      break;
    }
    case Algorithm::kStoreAll: {
      finish_heuristic(chain, options, detail::store_all_sequence(length), -1, out);
      break;
    }
    case Algorithm::kRecomputeAll: {
      finish_heuristic(chain, options, detail::revolve_sequence(length, 1), -1, out);
      break;
    }
    case Algorithm::kPeriodic: {
      const int segments = options.segments() == 0 ? default_segments(length) : options.segments();
      REMAT_CHECK(segments >= 1 && segments <= length, "segments (", segments,
                  ") must be between 1 and the number of stages (", length, ")");
      out.parameter = segments;
      finish_heuristic(chain, options, detail::periodic_sequence(length, segments), -1, out);
      break;
    }
    case Algorithm::kRevolve:
      solve_revolve(chain, options, out);
      break;
  }
  out.solve_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return out;
}

std::int64_t min_feasible_budget(const Chain& chain, const SolveOptions& options) {
  if (options.algorithm() == Algorithm::kOptimal) {
    chain.validate(detail::chain_source(chain));
    check_options(options);
    check_link(chain, options);
    // As solve() does.
    if (!options.reference_recurrence())
      if (const std::optional<Chain> pinned = detail::pin_input_members(chain))
        return min_feasible_budget(*pinned, options);
    // The least of the least budgets of the strategies solve() would run.
    std::int64_t least = std::numeric_limits<std::int64_t>::max();
    for (const auto& strategy : detail::optimal_strategies(chain, options))
      least = std::min(least, strategy->least_budget());
    return least;
  }
  SolveOptions copy = options;
  return solve(chain, copy.budget_bytes(0)).min_feasible_budget_bytes;
}

std::int64_t min_feasible_slots(const Chain& chain, const SolveOptions& options) {
  chain.validate(detail::chain_source(chain));
  check_options(options);
  check_link(chain, options);
  if (!options.reference_recurrence())
    if (const std::optional<Chain> pinned = detail::pin_input_members(chain))
      return min_feasible_slots(*pinned, options);
  detail::TableMemory(chain, options.threads(), options.offload())
      .check_fixed(detail::memory_limit(options.memory_limit_bytes()));
  return detail::min_slots(chain, detail::unit_model(options));
}

}  // namespace remat
