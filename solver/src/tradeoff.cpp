// remat::tradeoff. The optimal points come from one persistent table built for the largest
// budget: its top row holds Opt(0, L, m) for every capacity m, so each budget of the grid
// costs one rebuild and one simulation. The table's unit is the largest budget's, coarser
// than a solve at a smaller budget would use; where that rounding makes a small budget
// infeasible, the point falls back to a solve of its own.
#include <algorithm>
#include <cmath>
#include <memory>

#include "detail.h"
#include "discretization.h"
#include "remat/solver/check.h"
#include "remat/solver/simulator.h"
#include "remat/solver/tradeoff.h"

namespace remat {

Tradeoff tradeoff(const Chain& chain, const TradeoffOptions& options) {
  chain.validate("chain");
  REMAT_CHECK(options.points() >= 2, "tradeoff: points must be at least 2 (got ",
              options.points(), ")");
  const TimeModel time{options.use_nograd_time()};
  const auto solve_options = [&](std::int64_t budget) {
    return SolveOptions(budget)
        .slots(options.slots())
        .use_nograd_time(options.use_nograd_time())
        .threads(options.threads());
  };
  Tradeoff out;
  out.store_all_peak_bytes = store_all_peak(chain);
  out.store_all_makespan_ms = chain.store_all_ms();
  out.min_feasible_budget_bytes = min_feasible_budget(chain, solve_options(0));
  const std::int64_t from =
      options.from_bytes() > 0 ? options.from_bytes() : out.min_feasible_budget_bytes;
  const std::int64_t to = options.to_bytes() > 0 ? options.to_bytes() : out.store_all_peak_bytes;
  REMAT_CHECK(from <= to, "tradeoff: the smallest budget (", from,
              " bytes) is above the largest (", to, " bytes)");
  for (int k = 0; k < options.points(); ++k) {
    const long double step = static_cast<long double>(to - from) / (options.points() - 1);
    const auto budget = static_cast<std::int64_t>(std::floor(from + step * k));
    if (out.budgets.empty() || budget > out.budgets.back()) out.budgets.push_back(budget);
  }
  out.budgets.back() = to;

  // Optimal: one table at the largest budget below the store-all peak.
  const std::int64_t largest = std::min(to, out.store_all_peak_bytes - 1);
  const std::int64_t slots = detail::slot_count(chain, options.slots());
  const Discretization disc = detail::discretize(std::max<std::int64_t>(largest, 1), slots);
  out.unit_bytes = disc.unit_bytes;
  const detail::UnitChain units =
      detail::make_unit_chain(chain, disc.unit_bytes, options.use_nograd_time(), false);
  const detail::MinMemoryTable min_memory(units, disc.capacity_units);
  std::unique_ptr<detail::PersistentTable> table;
  if (largest >= from && detail::fits(units, min_memory, disc.capacity_units)) {
    detail::check_table_fits_in_memory(chain.length(), disc.capacity_units - units.context);
    table = std::make_unique<detail::PersistentTable>(
        units, min_memory, disc.capacity_units - units.context, options.threads());
  }
  for (const std::int64_t budget : out.budgets) {
    TradeoffPoint point;
    point.budget_bytes = budget;
    Sequence sequence;
    if (budget >= out.store_all_peak_bytes) {
      sequence = detail::store_all_sequence(chain.length());
    } else if (table) {
      const std::int64_t capacity =
          std::min(disc.capacity_units, budget / disc.unit_bytes) - units.context;
      if (capacity - units.x[0] >= 0 &&
          table->value(0, chain.length(), capacity) < detail::kInfinity)
        sequence = table->rebuild(capacity);
    }
    if (sequence.empty()) {  // rounding at this unit: a solve of its own
      const Solution own = solve(chain, solve_options(budget));
      if (own.ok()) sequence = own.sequence;
    }
    if (!sequence.empty()) {
      const Simulation sim = simulate(chain, sequence, time);
      REMAT_INTERNAL_ASSERT(sim.peak_bytes <= budget, "tradeoff: peak ", sim.peak_bytes,
                            " above the budget ", budget);
      point.feasible = true;
      point.makespan_ms = sim.makespan_ms;
      point.peak_bytes = sim.peak_bytes;
    }
    out.optimal.push_back(point);
  }

  // Revolve: every checkpoint count simulated once; at each budget the most that fit.
  const int length = chain.length();
  const detail::RevolvePlanner planner(length, length);
  std::vector<TradeoffPoint> revolve_by_snapshots;
  for (int snapshots = 1; snapshots <= length; ++snapshots) {
    const Simulation sim = simulate(chain, planner.sequence(snapshots), time);
    revolve_by_snapshots.push_back({sim.peak_bytes, true, sim.makespan_ms, sim.peak_bytes, snapshots});
  }
  // Periodic: every segment count.
  for (int segments = 1; segments <= length; ++segments) {
    const Simulation sim = simulate(chain, detail::periodic_sequence(length, segments), time);
    out.periodic.push_back({sim.peak_bytes, true, sim.makespan_ms, sim.peak_bytes, segments});
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
