// remat::tradeoff. The optimal points come from one persistent table built for the largest
// budget: its top row holds Opt(0, L, m) for every capacity m, so each budget of the grid
// costs one rebuild and one simulation. The table's unit is the largest budget's, coarser
// than a solve at a smaller budget would use; where that rounding makes a small budget
// infeasible, the point falls back to a solve of its own. On a chain with carried members the
// table also answers solve()'s search above the budget (SolveOptions::search_above_budget):
// larger capacities whose sequence's exact peak fits the budget, the same bisection; and, as in
// solve(), the merged chain's sequence where it is faster (SolveOptions::merge_carried_runs).
#include "remat/solver/tradeoff.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "detail.h"
#include "discretization.h"
#include "remat/solver/check.h"
#include "remat/solver/simulator.h"
#include "storage_dp.h"

namespace remat {
namespace {

// The optimal point of a sequence at `budget`, checked against it.
TradeoffPoint point_of(const Chain& chain, const Sequence& sequence, const TimeModel& time,
                       std::int64_t budget) {
  const Simulation sim = simulate(chain, sequence, time);
  REMAT_INTERNAL_ASSERT(sim.peak_bytes <= budget, "tradeoff: peak ", sim.peak_bytes,
                        " above the budget ", budget);
  return TradeoffPoint{budget, true, sim.makespan_ms, sim.peak_bytes, 0};
}

}  // namespace

Tradeoff tradeoff(const Chain& chain, const TradeoffOptions& options) {
  chain.validate(detail::chain_source(chain));
  // As solve(): x_0's members carried on without gradient as context. Every sequence has the
  // same peak and time on both chains, so every point is the same.
  if (const std::optional<Chain> pinned = detail::pin_input_members(chain))
    return tradeoff(*pinned, options);
  REMAT_CHECK(options.points() >= 2, "tradeoff: points must be at least 2 (got ", options.points(),
              ")");
  REMAT_CHECK(options.points() <= kMaxTradeoffPoints, "tradeoff: points must be at most ",
              kMaxTradeoffPoints, " (got ", options.points(), ")");
  const TimeModel time{options.use_nograd_time()};
  const auto solve_options = [&](std::int64_t budget) {
    return SolveOptions(budget)
        .slots(options.slots())
        .use_nograd_time(options.use_nograd_time())
        .threads(options.threads())
        .memory_limit_bytes(options.memory_limit_bytes());
  };
  Tradeoff out;
  out.store_all_peak_bytes = store_all_peak(chain);
  out.store_all_makespan_ms = chain.store_all_ms();
  // Checks the options, and that the tables that do not depend on the slots fit.
  out.min_feasible_budget_bytes = min_feasible_budget(chain, solve_options(0));

  // Revolve: every checkpoint count simulated once; periodic: every segment count.
  const int length = chain.length();
  std::vector<TradeoffPoint> revolve_by_snapshots;
  {
    const detail::RevolvePlanner planner(length, length);
    for (int snapshots = 1; snapshots <= length; ++snapshots) {
      const Simulation sim = simulate(chain, planner.sequence(snapshots), time);
      revolve_by_snapshots.push_back(
          {sim.peak_bytes, true, sim.makespan_ms, sim.peak_bytes, snapshots});
    }
  }
  for (int segments = 1; segments <= length; ++segments) {
    const Simulation sim = simulate(chain, detail::periodic_sequence(length, segments), time);
    out.periodic.push_back({sim.peak_bytes, true, sim.makespan_ms, sim.peak_bytes, segments});
  }

  // The default grid runs from optimal's least budget to the store-all peak. With --slots,
  // optimal may need more than the store-all peak, or no budget may do: the grid then starts
  // at the least budget of revolve and periodic and, when optimal has a least budget, ends
  // there (above the store-all peak), so that the table shows where optimal starts.
  const std::int64_t optimal_least = out.min_feasible_budget_bytes;
  std::int64_t heuristic_least = out.store_all_peak_bytes;
  for (const TradeoffPoint& p : revolve_by_snapshots)
    heuristic_least = std::min(heuristic_least, p.peak_bytes);
  for (const TradeoffPoint& p : out.periodic)
    heuristic_least = std::min(heuristic_least, p.peak_bytes);
  const bool optimal_starts_below_store_all =
      optimal_least >= 0 && optimal_least <= out.store_all_peak_bytes;
  const std::int64_t from = options.from_bytes() > 0         ? options.from_bytes()
                            : optimal_starts_below_store_all ? optimal_least
                                                             : heuristic_least;
  const std::int64_t to = options.to_bytes() > 0
                              ? options.to_bytes()
                              : std::max(out.store_all_peak_bytes, optimal_least);
  // Only a given `to` can be below the default `from`: say where that one comes from.
  REMAT_CHECK(from <= to, "tradeoff: the smallest budget (", from, " bytes",
              options.from_bytes() > 0         ? ""
              : optimal_starts_below_store_all ? ", optimal's least budget"
                                               : ", the least budget of revolve and periodic",
              ") is above the largest (", to, " bytes)");
  for (int k = 0; k < options.points(); ++k) {
    const long double step = static_cast<long double>(to - from) / (options.points() - 1);
    // Rounding can put the last points a little above `to`, which may be int64's largest.
    const long double value = std::floor(from + step * k);
    const std::int64_t budget = value >= to ? to : static_cast<std::int64_t>(value);
    if (out.budgets.empty() || budget > out.budgets.back()) out.budgets.push_back(budget);
  }
  out.budgets.back() = to;

  // Optimal: one table at the largest budget (automatic slots: below the store-all peak, which
  // gets store-all as in solve()), its slots within the memory limit (automatic ones coarsened,
  // given ones refused if too many). With given slots every budget is the dynamic program's, as
  // solve() has it: none below optimal's least budget, even where the table's coarser unit would
  // find a sequence, and no store-all shortcut at or above the store-all peak.
  const bool given_slots = options.slots() > 0;
  const std::int64_t largest = given_slots ? to : std::min(to, out.store_all_peak_bytes - 1);
  std::vector<std::size_t> own_solves;  // points that need a solve of their own
  out.optimal.resize(out.budgets.size());
  {
    const detail::MemoryLimit limit = detail::memory_limit(options.memory_limit_bytes());
    const detail::TableMemory memory(chain, options.threads());
    std::int64_t slots = detail::slot_count(chain, options.slots());
    const std::int64_t table_budget = std::max<std::int64_t>(largest, 1);
    const bool table_needed = largest >= from && (!given_slots || optimal_least >= 0);
    if (table_needed) {
      if (!given_slots)
        slots = detail::slots_within_memory(memory, limit, std::numeric_limits<std::int64_t>::max(),
                                            slots, false, out.warning);
      else
        memory.check_given_slots(slots, detail::discretize(table_budget, slots).capacity_units,
                                 limit);
    }
    const Discretization disc = detail::discretize(table_budget, slots);
    out.unit_bytes = disc.unit_bytes;
    const detail::UnitChain units =
        detail::make_unit_chain(chain, disc.unit_bytes, options.use_nograd_time(), false);
    const detail::MinMemoryTable min_memory(units, disc.capacity_units);
    std::unique_ptr<detail::PersistentTable> table;
    if (table_needed && detail::fits(units, min_memory, disc.capacity_units))
      table = std::make_unique<detail::PersistentTable>(
          units, min_memory, disc.capacity_units - units.context, options.threads());
    for (std::size_t k = 0; k < out.budgets.size(); ++k) {
      const std::int64_t budget = out.budgets[k];
      if (given_slots && (optimal_least < 0 || budget < optimal_least)) {
        out.optimal[k] = TradeoffPoint{budget, false, 0, 0, 0};
        continue;
      }
      Sequence sequence;
      if (!given_slots && budget >= out.store_all_peak_bytes) {
        sequence = detail::store_all_sequence(chain.length());
      } else if (table) {
        sequence = detail::table_sequence(*table, units, disc, budget);
      }
      if (sequence.empty()) {
        own_solves.push_back(k);
        continue;
      }
      out.optimal[k] = point_of(chain, sequence, time, budget);
      // solve()'s search above the budget, on the table.
      if (given_slots || !table) continue;
      detail::search_above_budget(
          chain, budget, out.store_all_peak_bytes, out.optimal[k].makespan_ms, time,
          [&](std::int64_t bytes) { return detail::table_sequence(*table, units, disc, bytes); },
          [&](std::int64_t, const Sequence&, const Simulation& sim) {
            out.optimal[k] = TradeoffPoint{budget, true, sim.makespan_ms, sim.peak_bytes, 0};
          });
    }
  }
  // solve()'s merged runs (SolveOptions::merge_carried_runs) on the points the table answered,
  // once the table is freed: the merged chain's solve at the point's budget, expanded, where
  // it is faster (store-all is never beaten).
  if (!given_slots && chain.carried_bytes() > 0) {
    if (const std::optional<detail::MergedChain> merged = detail::merge_carried_runs(chain)) {
      std::vector<bool> own(out.budgets.size(), false);
      for (const std::size_t k : own_solves) own[k] = true;
      for (std::size_t k = 0; k < out.budgets.size(); ++k) {
        TradeoffPoint& point = out.optimal[k];
        if (own[k] || !point.feasible || point.makespan_ms <= out.store_all_makespan_ms) continue;
        const detail::MergedCandidate candidate =
            detail::merged_candidate(chain, *merged, solve_options(out.budgets[k]));
        if (candidate.solution.ok() &&
            detail::faster(candidate.simulation.makespan_ms, point.makespan_ms))
          point = point_of(chain, candidate.sequence, time, out.budgets[k]);
      }
    }
  }
  // solve()'s storage-exact table (SolveOptions::exact_storages), one for every point, at the
  // table's unit: its sequence where it is faster.
  if (!given_slots && detail::storage_dp_applies(chain) && largest >= from) {
    const detail::StorageTable storage =
        detail::storage_table(chain, std::max<std::int64_t>(largest, 1), false,
                              options.use_nograd_time(), options.memory_limit_bytes(),
                              options.threads());
    const detail::StorageDp* table = storage.table.get();
    std::vector<bool> own(out.budgets.size(), false);
    for (const std::size_t k : own_solves) own[k] = true;
    for (std::size_t k = 0; table && k < out.budgets.size(); ++k) {
      TradeoffPoint& point = out.optimal[k];
      const std::int64_t budget = out.budgets[k];
      if (own[k] || budget > largest || (point.feasible && point.makespan_ms <= out.store_all_makespan_ms))
        continue;
      const Sequence sequence = table->sequence_at(budget);
      if (sequence.empty()) continue;
      const TradeoffPoint candidate = point_of(chain, sequence, time, budget);
      if (!point.feasible || detail::faster(candidate.makespan_ms, point.makespan_ms))
        point = candidate;
    }
  }
  // Rounding at the table's unit: a solve of its own, once the table is freed (a solve
  // estimates its memory as if it were alone).
  for (const std::size_t k : own_solves) {
    const std::int64_t budget = out.budgets[k];
    const Solution own = solve(chain, solve_options(budget));
    out.optimal[k] = own.ok() ? point_of(chain, own.sequence, time, budget)
                              : TradeoffPoint{budget, false, 0, 0, 0};
  }

  for (const std::int64_t budget : out.budgets) {
    TradeoffPoint revolve{budget, false, 0, 0, 0};
    for (auto it = revolve_by_snapshots.rbegin(); it != revolve_by_snapshots.rend(); ++it) {
      if (it->peak_bytes <= budget) {
        revolve = *it;
        revolve.budget_bytes = budget;
        break;
      }
    }
    out.revolve.push_back(revolve);
    TradeoffPoint best{budget, false, 0, 0, 0};
    for (const TradeoffPoint& p : out.periodic) {
      if (p.peak_bytes <= budget && (!best.feasible || p.makespan_ms < best.makespan_ms)) {
        best = p;
        best.budget_bytes = budget;
      }
    }
    out.periodic_best.push_back(best);
  }
  return out;
}

}  // namespace remat
