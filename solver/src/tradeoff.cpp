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

#include "discretization.h"
#include "heuristics.h"
#include "merged_chain.h"
#include "min_memory_table.h"
#include "persistent_table.h"
#include "remat/base/check.h"
#include "remat/solver/simulator.h"
#include "storage_dp.h"
#include "strategies.h"
#include "unit_chain.h"

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

// One tradeoff() call: the chain and options, and the result filled in step by step.
class TradeoffRun {
 public:
  TradeoffRun(const Chain& chain, const TradeoffOptions& options)
      : chain_(chain), options_(options), time_{options.use_nograd_time()} {
    out_.store_all_peak_bytes = store_all_peak(chain);
    out_.store_all_makespan_ms = chain.store_all_ms();
    // Checks the options, and that the tables that do not depend on the slots fit.
    out_.min_feasible_budget_bytes = min_feasible_budget(chain, solve_options(0));
  }

  Tradeoff run() {
    heuristics();
    budget_grid();
    table_points();
    merged_points();
    storage_points();
    own_solves();
    offload_points();
    heuristics_at_budgets();
    return std::move(out_);
  }

 private:
  SolveOptions solve_options(std::int64_t budget) const {
    return SolveOptions(budget)
        .slots(options_.slots())
        .use_nograd_time(options_.use_nograd_time())
        .threads(options_.threads())
        .memory_limit_bytes(options_.memory_limit_bytes());
  }
  // Automatic slots (discretization.h): solve()'s refining strategies apply.
  bool automatic() const { return detail::automatic_slots(solve_options(0)); }

  // Revolve: every checkpoint count simulated once; periodic: every segment count.
  void heuristics() {
    const int length = chain_.length();
    const detail::RevolvePlanner planner(length, length);
    for (int snapshots = 1; snapshots <= length; ++snapshots) {
      const Simulation sim = simulate(chain_, planner.sequence(snapshots), time_);
      revolve_by_snapshots_.push_back(
          {sim.peak_bytes, true, sim.makespan_ms, sim.peak_bytes, snapshots});
    }
    for (int segments = 1; segments <= length; ++segments) {
      const Simulation sim = simulate(chain_, detail::periodic_sequence(length, segments), time_);
      out_.periodic.push_back({sim.peak_bytes, true, sim.makespan_ms, sim.peak_bytes, segments});
    }
  }

  // The default grid runs from optimal's least budget to the store-all peak. With --slots,
  // optimal may need more than the store-all peak, or no budget may do: the grid then starts
  // at the least budget of revolve and periodic and, when optimal has a least budget, ends
  // there (above the store-all peak), so that the table shows where optimal starts.
  void budget_grid() {
    const std::int64_t optimal_least = out_.min_feasible_budget_bytes;
    std::int64_t heuristic_least = out_.store_all_peak_bytes;
    for (const TradeoffPoint& p : revolve_by_snapshots_)
      heuristic_least = std::min(heuristic_least, p.peak_bytes);
    for (const TradeoffPoint& p : out_.periodic)
      heuristic_least = std::min(heuristic_least, p.peak_bytes);
    const bool optimal_starts_below_store_all =
        optimal_least >= 0 && optimal_least <= out_.store_all_peak_bytes;
    from_ = options_.from_bytes() > 0         ? options_.from_bytes()
            : optimal_starts_below_store_all ? optimal_least
                                             : heuristic_least;
    const std::int64_t to = options_.to_bytes() > 0
                                ? options_.to_bytes()
                                : std::max(out_.store_all_peak_bytes, optimal_least);
    // Only a given `to` can be below the default `from`: say where that one comes from.
    REMAT_CHECK(from_ <= to, "tradeoff: the smallest budget (", from_, " bytes",
                options_.from_bytes() > 0         ? ""
                : optimal_starts_below_store_all ? ", optimal's least budget"
                                                 : ", the least budget of revolve and periodic",
                ") is above the largest (", to, " bytes)");
    for (int k = 0; k < options_.points(); ++k) {
      const long double step = static_cast<long double>(to - from_) / (options_.points() - 1);
      // Rounding can put the last points a little above `to`, which may be int64's largest.
      const long double value = std::floor(from_ + step * k);
      const std::int64_t budget = value >= to ? to : static_cast<std::int64_t>(value);
      if (out_.budgets.empty() || budget > out_.budgets.back()) out_.budgets.push_back(budget);
    }
    out_.budgets.back() = to;
    // The optimal table's budget (automatic slots: below the store-all peak, which gets
    // store-all as in solve()).
    largest_ = automatic() ? std::min(to, out_.store_all_peak_bytes - 1) : to;
    out_.optimal.resize(out_.budgets.size());
    own_.assign(out_.budgets.size(), false);
  }

  // Optimal: one table at the largest budget, its slots within the memory limit (automatic
  // ones coarsened, given ones refused if too many). With given slots every budget is the
  // dynamic program's, as solve() has it: none below optimal's least budget, even where the
  // table's coarser unit would find a sequence, and no store-all shortcut at or above the
  // store-all peak. A point the table's unit rounds out gets a solve of its own (own_).
  void table_points() {
    const std::int64_t optimal_least = out_.min_feasible_budget_bytes;
    const detail::MemoryLimit limit = detail::memory_limit(options_.memory_limit_bytes());
    const detail::TableMemory memory(chain_, options_.threads());
    std::int64_t slots = detail::slot_count(chain_, options_.slots());
    const std::int64_t table_budget = std::max<std::int64_t>(largest_, 1);
    const bool table_needed = largest_ >= from_ && (automatic() || optimal_least >= 0);
    if (table_needed) {
      if (automatic())
        slots = detail::slots_within_memory(memory, limit, std::numeric_limits<std::int64_t>::max(),
                                            slots, false, out_.warning);
      else
        memory.check_given_slots(slots, detail::discretize(table_budget, slots).capacity_units,
                                 limit);
    }
    const Discretization disc = detail::discretize(table_budget, slots);
    out_.unit_bytes = disc.unit_bytes;
    const detail::UnitChain units =
        detail::make_unit_chain(chain_, disc.unit_bytes, options_.use_nograd_time(), false);
    const detail::MinMemoryTable min_memory(units, disc.capacity_units);
    std::unique_ptr<detail::PersistentTable> table;
    if (table_needed && detail::fits(units, min_memory, disc.capacity_units))
      table = std::make_unique<detail::PersistentTable>(
          units, min_memory, disc.capacity_units - units.context, options_.threads());
    for (std::size_t k = 0; k < out_.budgets.size(); ++k) {
      const std::int64_t budget = out_.budgets[k];
      if (!automatic() && (optimal_least < 0 || budget < optimal_least)) {
        out_.optimal[k] = TradeoffPoint{budget, false, 0, 0, 0};
        continue;
      }
      Sequence sequence;
      if (automatic() && budget >= out_.store_all_peak_bytes) {
        sequence = detail::store_all_sequence(chain_.length());
      } else if (table) {
        sequence = detail::table_sequence(*table, units, disc, budget);
      }
      if (sequence.empty()) {
        own_[k] = true;
        continue;
      }
      out_.optimal[k] = point_of(chain_, sequence, time_, budget);
      // solve()'s search above the budget, on the table.
      if (!automatic() || !table) continue;
      detail::search_above_budget(
          chain_, budget, out_.store_all_peak_bytes, out_.optimal[k].makespan_ms, time_,
          [&](std::int64_t bytes) { return detail::table_sequence(*table, units, disc, bytes); },
          [&](std::int64_t, const Sequence&, const Simulation& sim) {
            out_.optimal[k] = TradeoffPoint{budget, true, sim.makespan_ms, sim.peak_bytes, 0};
          });
    }
  }

  // solve()'s merged runs (SolveOptions::merge_carried_runs) on the points the table answered,
  // once the table is freed: the merged chain's solve at the point's budget, expanded, where
  // it is faster (store-all is never beaten).
  void merged_points() {
    if (!automatic() || chain_.carried_bytes() == 0) return;
    const std::optional<detail::MergedChain> merged = detail::merge_carried_runs(chain_);
    if (!merged) return;
    for (std::size_t k = 0; k < out_.budgets.size(); ++k) {
      TradeoffPoint& point = out_.optimal[k];
      if (own_[k] || !point.feasible || point.makespan_ms <= out_.store_all_makespan_ms) continue;
      const detail::MergedCandidate candidate =
          detail::merged_candidate(chain_, *merged, solve_options(out_.budgets[k]));
      if (candidate.solution.ok() &&
          detail::faster(candidate.simulation.makespan_ms, point.makespan_ms))
        point = point_of(chain_, candidate.sequence, time_, out_.budgets[k]);
    }
  }

  // solve()'s storage-exact table (SolveOptions::exact_storages), one for every point, at the
  // table's unit: its sequence where it is faster.
  void storage_points() {
    if (!automatic() || !detail::storage_dp_applies(chain_) || largest_ < from_) return;
    const detail::StorageTable storage =
        detail::storage_table(chain_, std::max<std::int64_t>(largest_, 1), false,
                              options_.use_nograd_time(), options_.memory_limit_bytes(),
                              options_.threads());
    const detail::StorageDp* table = storage.table.get();
    for (std::size_t k = 0; table && k < out_.budgets.size(); ++k) {
      TradeoffPoint& point = out_.optimal[k];
      const std::int64_t budget = out_.budgets[k];
      if (own_[k] || budget > largest_ ||
          (point.feasible && point.makespan_ms <= out_.store_all_makespan_ms))
        continue;
      const Sequence sequence = table->sequence_at(budget);
      if (sequence.empty()) continue;
      const TradeoffPoint candidate = point_of(chain_, sequence, time_, budget);
      if (!point.feasible || detail::faster(candidate.makespan_ms, point.makespan_ms))
        point = candidate;
    }
  }

  // Rounding at the table's unit: a solve of its own, once the table is freed (a solve
  // estimates its memory as if it were alone).
  void own_solves() {
    for (std::size_t k = 0; k < out_.budgets.size(); ++k) {
      if (!own_[k]) continue;
      const std::int64_t budget = out_.budgets[k];
      const Solution own = solve(chain_, solve_options(budget));
      out_.optimal[k] = own.ok() ? point_of(chain_, own.sequence, time_, budget)
                                 : TradeoffPoint{budget, false, 0, 0, 0};
    }
  }

  // With offload, solve() at every budget of the grid (parameter: the checkpoints offloaded).
  void offload_points() {
    if (!options_.offload()) return;
    for (const std::int64_t budget : out_.budgets) {
      const Solution own = solve(chain_, solve_options(budget).offload(true).host_memory_bytes(
                                             options_.host_memory_bytes()));
      TradeoffPoint point{budget, false, 0, 0, 0};
      if (own.ok()) {
        point = point_of(chain_, own.sequence, time_, budget);
        point.parameter = static_cast<int>(own.simulation.offloads);
      }
      out_.offloading.push_back(point);
    }
  }

  // Revolve's point at each budget: the most checkpoints that fit; periodic's: the fastest
  // segment count that fits.
  void heuristics_at_budgets() {
    for (const std::int64_t budget : out_.budgets) {
      TradeoffPoint revolve{budget, false, 0, 0, 0};
      for (auto it = revolve_by_snapshots_.rbegin(); it != revolve_by_snapshots_.rend(); ++it) {
        if (it->peak_bytes <= budget) {
          revolve = *it;
          revolve.budget_bytes = budget;
          break;
        }
      }
      out_.revolve.push_back(revolve);
      TradeoffPoint best{budget, false, 0, 0, 0};
      for (const TradeoffPoint& p : out_.periodic) {
        if (p.peak_bytes <= budget && (!best.feasible || p.makespan_ms < best.makespan_ms)) {
          best = p;
          best.budget_bytes = budget;
        }
      }
      out_.periodic_best.push_back(best);
    }
  }

  const Chain& chain_;
  const TradeoffOptions& options_;
  const TimeModel time_;
  Tradeoff out_;
  std::vector<TradeoffPoint> revolve_by_snapshots_;
  std::int64_t from_ = 0;     // the grid's smallest budget
  std::int64_t largest_ = 0;  // the optimal table's budget
  std::vector<bool> own_;     // points that need a solve of their own
};

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
  REMAT_CHECK(!options.offload() || chain.link, "tradeoff: ", detail::chain_source(chain),
              " has no link to host memory, which offload needs");
  return TradeoffRun(chain, options).run();
}

}  // namespace remat
