#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>

#include "detail.h"
#include "discretization.h"
#include "remat/solver/check.h"
#include "remat/solver/solver.h"
#include "storage_dp.h"

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

void add_warning(Solution& out, const std::string& warning) {
  out.warning += (out.warning.empty() ? "" : "; ") + warning;
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

// A budget so close to the least memory the chain can run in that no discretization the table
// allows reaches it: the sequence that needs the least memory (exact bytes), or the fastest
// heuristic sequence that fits, if one does. Feasible; its time is not optimized.
void fall_back_to_least_memory(const Chain& chain, const SolveOptions& options,
                               std::int64_t slots_tried, Solution& out) {
  const TimeModel time{options.use_nograd_time()};
  const int length = chain.length();
  const detail::UnitChain exact =
      detail::make_unit_chain(chain, 1, options.use_nograd_time(), false);
  Sequence best = detail::MinMemoryTable(exact).least_memory_sequence(exact);
  Simulation best_sim = simulate(chain, best, time);
  REMAT_INTERNAL_ASSERT(best_sim.peak_bytes <= options.budget_bytes(),
                        "the least-memory sequence peaks at ", best_sim.peak_bytes,
                        " bytes, above the budget ", options.budget_bytes());
  const auto consider = [&](Sequence candidate) {
    Simulation sim = simulate(chain, candidate, time);
    if (sim.peak_bytes <= options.budget_bytes() && sim.makespan_ms < best_sim.makespan_ms) {
      best = std::move(candidate);
      best_sim = std::move(sim);
    }
  };
  for (int segments = 1; segments <= length; ++segments)
    consider(detail::periodic_sequence(length, segments));
  const detail::RevolvePlanner planner(length, length);
  for (int snapshots = 1; snapshots <= length; ++snapshots) consider(planner.sequence(snapshots));
  out.discretization = Discretization{1, options.budget_bytes()};
  add_warning(
      out,
      detail::str_cat(
          "the budget is within the rounding of ", slots_tried,
          " memory slots of the least memory the chain can run in (", out.min_feasible_budget_bytes,
          " bytes): the sequence is the least-memory one or the fastest heuristic that "
          "fits, not the optimum; a slightly larger budget lets the dynamic program choose"));
  accept(std::move(best), std::move(best_sim), SolveStatus::kFeasible, out);
}

// The slots of an optimal solve with the reference's discretization (given slots, or automatic
// ones with the published recurrence), within the memory limit: automatic slots are coarsened
// (capacities at most the slot count, whatever the budget); given slots whose table would not
// fit are refused.
std::int64_t reference_slots(const Chain& chain, const SolveOptions& options,
                             const detail::TableMemory& memory, const detail::MemoryLimit& limit,
                             std::string& warning) {
  const std::int64_t slots = detail::slot_count(chain, options.slots());
  if (options.slots() == 0)
    return detail::slots_within_memory(memory, limit, std::numeric_limits<std::int64_t>::max(),
                                       slots, false, warning);
  memory.check_given_slots(
      slots,
      detail::discretize(std::max<std::int64_t>(options.budget_bytes(), 0), slots).capacity_units,
      limit);
  return slots;
}

// Whether the slots are remat's automatic ones with its own recurrence: the optimal solve
// that is exact in bytes, and the only one the refinements below apply to.
bool automatic_slots(const SolveOptions& options) {
  return options.slots() == 0 && !options.reference_recurrence();
}

// What refines an optimal solve's table, each where its option is on, the slots are automatic
// and the chain has what it needs (docs/algorithms.md, "Carried members"). solve() runs them
// and min_feasible_budget() takes their least budgets, from this one list.
struct Refinements {
  bool search_above_budget = false;  // larger capacities whose exact peak fits (carried members)
  bool merged_runs = false;          // the chain with its carried runs merged (carried members)
  bool storage_exact = false;        // the storage-exact table (where storage_dp_applies)
};

Refinements refinements(const Chain& chain, const SolveOptions& options) {
  const bool automatic = automatic_slots(options);
  const bool carried = chain.carried_bytes() > 0;
  return {automatic && options.search_above_budget() && carried,
          automatic && options.merge_carried_runs() && carried,
          automatic && options.exact_storages() && detail::storage_dp_applies(chain)};
}

void solve_optimal(const Chain& chain, const SolveOptions& options, Solution& out) {
  const std::int64_t budget = options.budget_bytes();
  out.solved_budget_bytes = budget;
  const bool automatic = automatic_slots(options);
  // The memory the solve will need is estimated before anything is allocated.
  const detail::MemoryLimit limit = detail::memory_limit(options.memory_limit_bytes());
  const detail::TableMemory memory(chain, options.threads());
  memory.check_fixed(limit);
  std::int64_t slots = 0;
  std::string coarsened;
  if (automatic) {
    slots = detail::slot_count(chain, 0);
    // Without --slots, a budget that holds every activation gets store-all, which no schedule
    // beats (every stage runs Fe and B once); the discretized table could miss it by rounding.
    // It needs no table; below it, a table that cannot fit is refused before the least budget
    // is searched for (which does not depend on automatic slots).
    const bool store_all = budget >= store_all_peak(chain);
    const std::int64_t fitting =
        store_all ? slots
                  : detail::slots_within_memory(memory, limit, budget, slots, true, coarsened);
    out.min_feasible_budget_bytes = detail::min_feasible_budget_for_slots(chain, options, slots);
    if (store_all) {
      Sequence sequence = detail::store_all_sequence(chain.length());
      Simulation sim = simulate(chain, sequence, TimeModel{options.use_nograd_time()});
      out.discretization = detail::discretize_filled(budget, slots);
      accept(std::move(sequence), std::move(sim), SolveStatus::kOptimal, out);
      return;
    }
    slots = fitting;
  } else {
    slots = reference_slots(chain, options, memory, limit, coarsened);
    out.min_feasible_budget_bytes = detail::min_feasible_budget_for_slots(chain, options, slots);
  }
  if (!coarsened.empty()) add_warning(out, coarsened);
  Discretization disc =
      automatic ? detail::discretize_filled(budget, slots) : detail::discretize(budget, slots);
  out.discretization = disc;
  auto units = std::make_unique<detail::UnitChain>(detail::make_unit_chain(
      chain, disc.unit_bytes, options.use_nograd_time(), options.reference_recurrence()));
  auto min_memory = std::make_unique<detail::MinMemoryTable>(*units, disc.capacity_units);
  if (!detail::fits(*units, *min_memory, disc.capacity_units)) {
    if (!automatic || budget < out.min_feasible_budget_bytes) {
      out.status = SolveStatus::kInfeasible;
      return;
    }
    // Rounding sizes up to whole units put the budget out of reach, although the chain fits
    // it in exact bytes: finer units, as far as the table's allowance goes.
    bool found = false;
    std::int64_t tried = slots;  // the finest slot count tried
    const std::int64_t finest = detail::refined_slot_limit(chain.length(), slots);
    for (std::int64_t finer = 2 * slots; !found && finer <= finest && disc.unit_bytes > 1;
         finer *= 2) {
      const Discretization candidate = detail::discretize_filled(budget, finer);
      if (memory.bytes(candidate.capacity_units) > static_cast<double>(limit.bytes)) break;
      disc = candidate;
      tried = finer;
      units = std::make_unique<detail::UnitChain>(
          detail::make_unit_chain(chain, disc.unit_bytes, options.use_nograd_time(), false));
      min_memory = std::make_unique<detail::MinMemoryTable>(*units, disc.capacity_units);
      found = detail::fits(*units, *min_memory, disc.capacity_units);
    }
    if (!found) {
      fall_back_to_least_memory(chain, options, tried, out);
      return;
    }
  }
  out.discretization = disc;
  const std::int64_t available = disc.capacity_units - units->context;
  const detail::PersistentTable table(*units, *min_memory, available, options.threads());
  Sequence sequence = table.rebuild(available);
  Simulation sim = simulate(chain, sequence, TimeModel{options.use_nograd_time()});
  const double predicted = table.value(0, chain.length(), available);
  REMAT_INTERNAL_ASSERT(std::fabs(sim.makespan_ms - predicted) <= 1e-9 * std::max(1.0, predicted),
                        "simulated makespan ", sim.makespan_ms, " differs from the table's ",
                        predicted);
  if (options.reference_recurrence()) {
    if (sim.peak_bytes > budget)
      out.warning = detail::str_cat("the reference recurrence's sequence peaks at ", sim.peak_bytes,
                                    " bytes, ", sim.peak_bytes - budget,
                                    " above the budget (its chain step counts y_{i+1} where "
                                    "y_{l+1} is live; see docs/algorithms.md)");
  } else {
    REMAT_INTERNAL_ASSERT(sim.peak_bytes <= budget, "simulated peak ", sim.peak_bytes,
                          " exceeds the budget ", budget);
  }
  accept(std::move(sequence), std::move(sim), SolveStatus::kOptimal, out);
}

std::int64_t peak_of(const Chain& chain, const Sequence& sequence) {
  return simulate(chain, sequence).peak_bytes;
}

// SolveOptions::search_above_budget after the DP's optimum `out` at the budget
// (detail::search_above_budget). One persistent table, built for the largest budget the search
// may try at its first probe, answers every probe (its top row holds the optimum for every
// capacity), with its unit: a rebuild and a simulation per probe.
void search_optimal_above_budget(const Chain& chain, const SolveOptions& options, Solution& out) {
  // Run only where refinements() lists it: the chain carries members (without, nothing to
  // search, and no store-all simulation either).
  if (!out.ok()) return;
  const std::int64_t budget = options.budget_bytes();
  const std::int64_t store_all = store_all_peak(chain);
  const std::int64_t largest = detail::search_ceiling(chain, budget, store_all);
  if (largest <= budget) return;
  std::string coarsened;
  Discretization disc;
  std::unique_ptr<detail::UnitChain> units;
  std::unique_ptr<detail::MinMemoryTable> min_memory;
  std::unique_ptr<detail::PersistentTable> table;
  bool built = false;
  const auto sequence_at = [&](std::int64_t bytes) {
    if (!built) {
      built = true;
      const detail::MemoryLimit limit = detail::memory_limit(options.memory_limit_bytes());
      const detail::TableMemory memory(chain, options.threads());
      const std::int64_t slots = detail::slots_within_memory(
          memory, limit, largest, detail::slot_count(chain, 0), true, coarsened);
      disc = detail::discretize_filled(largest, slots);
      units = std::make_unique<detail::UnitChain>(
          detail::make_unit_chain(chain, disc.unit_bytes, options.use_nograd_time(), false));
      min_memory = std::make_unique<detail::MinMemoryTable>(*units, disc.capacity_units);
      if (detail::fits(*units, *min_memory, disc.capacity_units))
        table = std::make_unique<detail::PersistentTable>(
            *units, *min_memory, disc.capacity_units - units->context, options.threads());
    }
    return table ? detail::table_sequence(*table, *units, disc, bytes) : Sequence{};
  };
  detail::search_above_budget(
      chain, budget, store_all, out.makespan_ms, TimeModel{options.use_nograd_time()}, sequence_at,
      [&](std::int64_t bytes, Sequence sequence, Simulation sim) {
        const std::int64_t units_used = std::min(disc.capacity_units, bytes / disc.unit_bytes);
        out.discretization = Discretization{disc.unit_bytes, units_used};
        out.solved_budget_bytes = bytes;
        out.warning = coarsened;
        accept(std::move(sequence), std::move(sim), SolveStatus::kOptimal, out);
      });
}

// SolveOptions::merge_carried_runs after the chain's own result `out`: the merged chain's
// sequence, expanded, where it is faster or `out` found none; the least budget is the smaller.
void solve_merged_runs(const Chain& chain, const SolveOptions& options, Solution& out) {
  // Run only where refinements() lists it: the chain carries members.
  const std::optional<detail::MergedChain> merged = detail::merge_carried_runs(chain);
  if (!merged) return;
  // Store-all needs no other candidate, nothing is faster: only the least budget.
  if (out.ok() && out.makespan_ms <= out.store_all_makespan_ms) {
    out.min_feasible_budget_bytes =
        std::min(out.min_feasible_budget_bytes, min_feasible_budget(merged->chain, options));
    return;
  }
  detail::MergedCandidate candidate = detail::merged_candidate(chain, *merged, options);
  out.min_feasible_budget_bytes =
      std::min(out.min_feasible_budget_bytes, candidate.solution.min_feasible_budget_bytes);
  if (!candidate.solution.ok() ||
      (out.ok() && !detail::faster(candidate.simulation.makespan_ms, out.makespan_ms)))
    return;
  out.discretization = candidate.solution.discretization;
  out.solved_budget_bytes = candidate.solution.solved_budget_bytes;
  out.warning = candidate.solution.warning;
  out.merged_stages = merged->chain.length();
  accept(std::move(candidate.sequence), std::move(candidate.simulation), candidate.solution.status,
         out);
}

// SolveOptions::exact_storages after the other candidates: the storage-exact table's sequence
// where it is faster, or where nothing else fits; its least budget is exact.
void solve_storage_exact(const Chain& chain, const SolveOptions& options, Solution& out) {
  // Run only where refinements() lists it: storage_dp_applies(chain).
  const std::int64_t least = detail::StorageDp::least_bytes(chain);
  out.min_feasible_budget_bytes = std::min(out.min_feasible_budget_bytes, least);
  const std::int64_t budget = options.budget_bytes();
  // Store-all is never beaten.
  if (budget < least || (out.ok() && out.makespan_ms <= out.store_all_makespan_ms)) return;
  const TimeModel time{options.use_nograd_time()};
  const detail::StorageTable storage = detail::storage_table(
      chain, budget, true, options.use_nograd_time(), options.memory_limit_bytes(),
      options.threads());
  const detail::StorageDp* table = storage.table.get();
  const Discretization disc = storage.discretization;
  Sequence sequence = table ? table->sequence_at(budget) : Sequence{};
  if (table) {
    out.exact_storages = true;
    if (!sequence.empty()) {
      const double predicted = table->value_at(budget);
      Simulation sim = simulate(chain, sequence, time);
      REMAT_INTERNAL_ASSERT(sim.peak_bytes <= budget, "the storage-exact sequence peaks at ",
                            sim.peak_bytes, " bytes, above the budget ", budget);
      REMAT_INTERNAL_ASSERT(std::fabs(sim.makespan_ms - predicted) <= 1e-9 * std::max(1.0, predicted),
                            "the storage-exact sequence takes ", sim.makespan_ms,
                            " ms, not its table's ", predicted);
      if (out.ok() && !detail::faster(sim.makespan_ms, out.makespan_ms)) return;
      out.discretization = disc;
      out.solved_budget_bytes = budget;
      out.merged_stages = 0;
      out.warning.clear();
      accept(std::move(sequence), std::move(sim), SolveStatus::kOptimal, out);
      return;
    }
  }
  if (out.ok()) return;
  // The budget fits a nested sequence, but not in whole units: the least-memory one.
  sequence = detail::StorageDp::least_sequence(chain);
  Simulation sim = simulate(chain, sequence, time);
  REMAT_INTERNAL_ASSERT(sim.peak_bytes == least, "the storage-exact least-memory sequence peaks at ",
                        sim.peak_bytes, " bytes, not ", least);
  out.discretization = Discretization{1, budget};
  out.solved_budget_bytes = budget;
  out.merged_stages = 0;
  out.warning = detail::str_cat(
      "the budget is within the rounding of the memory slots of the least memory the chain can "
      "run in (",
      least, " bytes): the sequence is the least-memory one, not the optimum; a slightly larger "
             "budget lets the dynamic program choose");
  accept(std::move(sequence), std::move(sim), SolveStatus::kFeasible, out);
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
      const Refinements refine = refinements(chain, options);
      if (refine.search_above_budget) search_optimal_above_budget(chain, options, out);
      if (refine.merged_runs) solve_merged_runs(chain, options, out);
      if (refine.storage_exact) solve_storage_exact(chain, options, out);
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
    // As solve() does.
    if (!options.reference_recurrence())
      if (const std::optional<Chain> pinned = detail::pin_input_members(chain))
        return min_feasible_budget(*pinned, options);
    const detail::MemoryLimit limit = detail::memory_limit(options.memory_limit_bytes());
    const detail::TableMemory memory(chain, options.threads());
    memory.check_fixed(limit);
    // Automatic slots (without the published recurrence) give the least memory in bytes,
    // whatever their number; the reference's discretization depends on it.
    std::int64_t slots = detail::slot_count(chain, options.slots());
    std::string ignored;
    if (options.reference_recurrence() && options.slots() == 0)
      slots = detail::slots_within_memory(memory, limit, std::numeric_limits<std::int64_t>::max(),
                                          slots, false, ignored);
    std::int64_t least = detail::min_feasible_budget_for_slots(chain, options, slots);
    // The least budgets of the refinements solve() would run (the search above the budget
    // starts from a feasible solve: it has no least budget of its own).
    const Refinements refine = refinements(chain, options);
    if (refine.merged_runs)
      if (const auto merged = detail::merge_carried_runs(chain))
        least = std::min(least, min_feasible_budget(merged->chain, options));
    if (refine.storage_exact) least = std::min(least, detail::StorageDp::least_bytes(chain));
    return least;
  }
  SolveOptions copy = options;
  return solve(chain, copy.budget_bytes(0)).min_feasible_budget_bytes;
}

std::int64_t min_feasible_slots(const Chain& chain, const SolveOptions& options) {
  chain.validate(detail::chain_source(chain));
  check_options(options);
  if (!options.reference_recurrence())
    if (const std::optional<Chain> pinned = detail::pin_input_members(chain))
      return min_feasible_slots(*pinned, options);
  detail::TableMemory(chain, options.threads())
      .check_fixed(detail::memory_limit(options.memory_limit_bytes()));
  return detail::min_slots(chain, options);
}

namespace detail {

Sequence table_sequence(const PersistentTable& table, const UnitChain& chain,
                        const Discretization& disc, std::int64_t bytes) {
  const std::int64_t capacity =
      std::min(disc.capacity_units, bytes / disc.unit_bytes) - chain.context;
  if (capacity - chain.x[0] >= 0 && table.value(0, chain.length, capacity) < kInfinity)
    return table.rebuild(capacity);
  return {};
}

// The DP's sequence for a larger budget B' is as fast or faster (more memory never makes the
// optimum slower), and its exact peak grows with B' as the model's does, give or take what the
// model counts more than once. That excess is at most twice the carried bytes (each carried
// storage once more in each activation holding it, and in its gradient's), so beyond the
// budget plus that, the DP's sequences that fit the budget exactly are all sequences the DP
// finds at the budget plus that excess: the search stops there, or at the store-all peak.
// Below the store-all peak, which is at most kMaxChainTotalBytes, nothing overflows.
std::int64_t search_ceiling(const Chain& chain, std::int64_t budget, std::int64_t store_all_bytes) {
  const std::int64_t carried = chain.carried_bytes();
  if (carried == 0 || budget >= store_all_bytes) return budget;
  return std::min(store_all_bytes, budget + 2 * carried);
}

MergedCandidate merged_candidate(const Chain& chain, const MergedChain& merged,
                                 const SolveOptions& options) {
  MergedCandidate out;
  out.solution = solve(merged.chain, options);
  if (!out.solution.ok()) return out;
  out.sequence = expand_merged(out.solution.sequence, merged.first);
  out.simulation = simulate(chain, out.sequence, TimeModel{options.use_nograd_time()});
  // What the merged stages' fields promise (merge.cpp).
  REMAT_INTERNAL_ASSERT(out.simulation.peak_bytes <= out.solution.peak_bytes,
                        "the merged chain's sequence peaks at ", out.simulation.peak_bytes,
                        " bytes on the chain, above its merged peak ", out.solution.peak_bytes);
  REMAT_INTERNAL_ASSERT(std::fabs(out.simulation.makespan_ms - out.solution.makespan_ms) <=
                            1e-9 * std::max(1.0, out.solution.makespan_ms),
                        "the merged chain's sequence takes ", out.simulation.makespan_ms,
                        " ms on the chain, not its merged makespan ", out.solution.makespan_ms);
  return out;
}

bool faster(double candidate_ms, double current_ms) {
  return candidate_ms < current_ms * (1 - 1e-12);
}

void search_above_budget(const Chain& chain, std::int64_t budget, std::int64_t store_all_bytes,
                         double best_ms, const TimeModel& time,
                         const std::function<Sequence(std::int64_t)>& sequence_at,
                         const std::function<void(std::int64_t, Sequence, Simulation)>& improve) {
  std::int64_t lo = budget;
  std::int64_t hi = search_ceiling(chain, budget, store_all_bytes);
  if (hi <= lo) return;
  const double store_all_ms = chain.store_all_ms();
  const std::int64_t tolerance = std::max<std::int64_t>(1, budget / 1024);
  while (hi - lo > tolerance && best_ms > store_all_ms) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    Sequence sequence = sequence_at(mid);
    Simulation sim = sequence.empty() ? Simulation{} : simulate(chain, sequence, time);
    if (sequence.empty() || sim.peak_bytes > budget) {
      hi = mid;
      continue;
    }
    lo = mid;
    if (sim.makespan_ms < best_ms) {
      best_ms = sim.makespan_ms;
      improve(mid, std::move(sequence), std::move(sim));
    }
  }
}

}  // namespace detail
}  // namespace remat
