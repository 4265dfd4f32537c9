#pragma once
/// Predicted makespan against budget, for choosing a budget: `optimal` at evenly spaced
/// budgets (all from one dynamic-programming table), `revolve` at the same budgets, and
/// `periodic` for every segment count.
///
///   remat::Tradeoff t = remat::tradeoff(chain, remat::TradeoffOptions().points(30));
///   for (const auto& p : t.optimal) std::printf("%lld %f\n", p.budget_bytes, p.makespan_ms);

#include <cstdint>
#include <string>
#include <vector>

#include "remat/solver/chain.h"
#include "remat/solver/solver.h"

namespace remat {

/// The most budgets a tradeoff table has: each is a solve of every algorithm, and the table
/// is kept whole; a larger count is refused before any work.
inline constexpr int kMaxTradeoffPoints = 10000;

struct TradeoffOptions {
  /// Smallest budget of the grid; 0: the optimal solver's minimum feasible budget or, when
  /// that is above the store-all peak or there is none (too few slots given), the least
  /// budget of revolve and periodic.
  REMAT_ARG(std::int64_t, from_bytes) = 0;
  /// Largest budget of the grid; 0: the store-all peak, or the optimal solver's minimum
  /// feasible budget when the slots given put it above the peak.
  REMAT_ARG(std::int64_t, to_bytes) = 0;
  /// Budgets in the grid, evenly spaced from `from` to `to` (both included), 2 to
  /// kMaxTradeoffPoints.
  REMAT_ARG(int, points) = 25;
  /// Memory slots of the one table (0: automatic, as SolveOptions::slots). Given slots make
  /// every optimal point's feasibility solve()'s at its budget: none below the minimum
  /// feasible budget, and no store-all at or above the store-all peak (automatic slots only).
  REMAT_ARG(std::int64_t, slots) = 0;
  REMAT_ARG(bool, use_nograd_time) = true;
  /// As SolveOptions::threads.
  REMAT_ARG(int, threads) = 0;
  /// As SolveOptions::memory_limit_bytes, for the one table and every solve.
  REMAT_ARG(std::int64_t, memory_limit_bytes) = 0;
  /// Also optimal with offload over the chain's link (SolveOptions::offload; the chain must have
  /// a link) at every budget of the grid, in Tradeoff::offloading: each point a solve() of its
  /// own.
  REMAT_ARG(bool, offload) = false;
  /// With offload: SolveOptions::host_memory_bytes for each of those solves (-1: no bound).
  REMAT_ARG(std::int64_t, host_memory_bytes) = -1;
};

struct TradeoffPoint {
  /// The budget (for `periodic`: the peak of its sequence, the least budget it needs).
  std::int64_t budget_bytes = 0;
  bool feasible = false;
  double makespan_ms = 0;
  /// Exact simulated peak of the sequence (<= budget_bytes).
  std::int64_t peak_bytes = 0;
  /// `revolve`: checkpoints; `periodic`: segments; `offloading`: checkpoints offloaded; else 0.
  int parameter = 0;
};

struct Tradeoff {
  std::int64_t store_all_peak_bytes = 0;
  double store_all_makespan_ms = 0;
  /// Least budget for which the optimal solver finds a schedule (with few slots given, it
  /// can be above the store-all peak); -1 when none does with the slots given
  /// (min_feasible_slots() says how many it needs), and then no optimal point is feasible.
  std::int64_t min_feasible_budget_bytes = 0;
  /// Unit of the table the optimal points come from (1: exact bytes).
  std::int64_t unit_bytes = 1;
  /// Budgets of the grid, ascending.
  std::vector<std::int64_t> budgets;
  /// One point per budget of the grid.
  std::vector<TradeoffPoint> optimal, revolve;
  /// With TradeoffOptions::offload, optimal with offload at each budget of the grid; else empty.
  std::vector<TradeoffPoint> offloading;
  /// The fastest periodic schedule within each budget of the grid (parameter: segments).
  std::vector<TradeoffPoint> periodic_best;
  /// One point per segment count K = 1..L, budget_bytes = its peak.
  std::vector<TradeoffPoint> periodic;
  /// Non-empty when the optimal points deserve a caution (automatic slots coarsened to fit
  /// the memory limit).
  std::string warning;
};

/// Throws std::invalid_argument for bad options (points outside 2..kMaxTradeoffPoints, from > to).
Tradeoff tradeoff(const Chain& chain, const TradeoffOptions& options = TradeoffOptions());

}  // namespace remat
