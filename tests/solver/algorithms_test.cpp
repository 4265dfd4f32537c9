// Every algorithm on random chains: the simulator accepts its sequence, the predicted
// makespan is the simulated one, the peak stays within the budget; optimal is never slower
// than a heuristic that fits; budgets behave as documented (monotone, store-all at the top,
// infeasible exactly below the reported minimum).
#include <catch2/catch.hpp>
#include <cmath>

#include "discretization.h"
#include "remat/solver.h"
#include "test_chains.h"

namespace remat {
namespace {

bool close(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(a)); }

std::vector<std::int64_t> budgets_between(std::int64_t lo, std::int64_t hi, int count) {
  std::vector<std::int64_t> out;
  for (int k = 0; k <= count; ++k) out.push_back(lo + (hi - lo) * k / count);
  return out;
}

}  // namespace

TEST_CASE("every algorithm returns a valid sequence within the budget", "[solver]") {
  for (std::uint64_t seed = 0; seed < 120; ++seed) {
    test::RandomChainSpec spec;
    spec.max_length = 8;
    spec.max_bytes = seed % 2 ? 20 : 1 << 20;  // exact bytes, and the automatic discretization
    const Chain chain = test::random_chain(seed, spec);
    const std::int64_t peak = store_all_peak(chain);
    for (const std::int64_t budget : budgets_between(peak / 5, peak + 3, 12)) {
      double best_heuristic = std::numeric_limits<double>::infinity();
      Solution optimal;
      for (const Algorithm algorithm : all_algorithms()) {
        INFO("seed " << seed << " budget " << budget << " " << algorithm_name(algorithm));
        const Solution solution = solve(chain, SolveOptions(budget).algorithm(algorithm));
        REQUIRE(solution.algorithm == algorithm);
        REQUIRE(solution.min_feasible_budget_bytes >= 0);
        REQUIRE(solution.ok() == (budget >= solution.min_feasible_budget_bytes));
        if (!solution.ok()) {
          REQUIRE(solution.sequence.empty());
          continue;
        }
        // optimal is optimal, except within rounding of its least budget (a warning says so).
        if (algorithm == Algorithm::kOptimal && solution.status == SolveStatus::kFeasible)
          REQUIRE_THAT(solution.warning, Catch::Contains("least memory the chain can run in"));
        else
          REQUIRE(solution.status == (algorithm == Algorithm::kOptimal ? SolveStatus::kOptimal
                                                                       : SolveStatus::kFeasible));
        const Simulation sim = simulate(chain, solution.sequence);
        REQUIRE(close(sim.makespan_ms, solution.makespan_ms));
        REQUIRE(sim.peak_bytes == solution.peak_bytes);
        REQUIRE(sim.peak_bytes <= budget);
        REQUIRE(solution.makespan_ms >= chain.store_all_ms() - 1e-9);
        if (algorithm == Algorithm::kOptimal) {
          optimal = solution;
        } else {
          best_heuristic = std::min(best_heuristic, solution.makespan_ms);
        }
      }
      // In exact bytes the optimum is never slower than a heuristic that fits.
      if (spec.max_bytes == 20 && std::isfinite(best_heuristic)) {
        INFO("seed " << seed << " budget " << budget);
        REQUIRE(optimal.ok());
        REQUIRE(optimal.makespan_ms <= best_heuristic + 1e-9);
      }
    }
  }
}

TEST_CASE("optimal never needs more memory than a heuristic, with automatic units", "[solver]") {
  // Rounding sizes up to whole units can put a budget that a heuristic meets out of the table's
  // reach; solve() then refines the units, and within a few bytes of the least memory takes
  // the least-memory sequence or the fastest heuristic that fits.
  int fallbacks = 0, refined = 0, plain = 0, compared = 0;
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    test::RandomChainSpec spec;
    spec.max_length = 6 + static_cast<int>(seed % 25);
    spec.max_bytes = 1 << 20;
    spec.partial_keeps = seed % 2 == 1;
    const Chain chain = test::random_chain(seed + 5000, spec);
    const std::int64_t slots = detail::slot_count(chain, 0);
    const std::int64_t least = min_feasible_budget(chain, SolveOptions(0));
    INFO("seed " << seed << " least " << least);
    REQUIRE_FALSE(solve(chain, SolveOptions(least - 1)).ok());
    std::vector<std::int64_t> budgets;
    for (int k = 0; k < 40; ++k) budgets.push_back(least + 37 * k);
    for (const Algorithm algorithm : all_algorithms()) {
      if (algorithm == Algorithm::kOptimal) continue;
      const Solution h = solve(chain, SolveOptions(0).algorithm(algorithm));
      INFO(algorithm_name(algorithm) << " needs " << h.min_feasible_budget_bytes);
      CHECK(least <= h.min_feasible_budget_bytes);
      budgets.push_back(h.min_feasible_budget_bytes);
    }
    for (const std::int64_t budget : budgets) {
      INFO("budget " << budget);
      const Solution optimal = solve(chain, SolveOptions(budget));
      REQUIRE(optimal.ok());
      REQUIRE(optimal.peak_bytes <= budget);
      ++compared;
      if (optimal.status == SolveStatus::kFeasible) {
        // The fallback is never slower than a heuristic that fits.
        ++fallbacks;
        for (const Algorithm algorithm : all_algorithms()) {
          const Solution h = solve(chain, SolveOptions(budget).algorithm(algorithm));
          if (algorithm != Algorithm::kOptimal && h.ok())
            CHECK(optimal.makespan_ms <= h.makespan_ms + 1e-9);
        }
      } else if (optimal.discretization.capacity_units >= 2 * slots) {
        ++refined;
      } else {
        ++plain;
      }
    }
  }
  CHECK(compared == 40 * 44);
  // Every regime is reached.
  CHECK(fallbacks > 10);
  CHECK(refined > 100);
  CHECK(plain > 100);
}

TEST_CASE("with a fixed memory unit the makespan never increases with the budget", "[solver]") {
  for (std::uint64_t seed = 0; seed < 100; ++seed) {
    const Chain chain = test::random_chain(seed + 300);
    const std::int64_t peak = store_all_peak(chain);
    double previous = std::numeric_limits<double>::infinity();
    bool was_feasible = false;
    // Budgets below the automatic slot count are solved in exact bytes (unit = 1).
    for (std::int64_t budget = 0; budget <= peak + 2; ++budget) {
      const Solution solution = solve(chain, SolveOptions(budget));
      INFO("seed " << seed << " budget " << budget);
      REQUIRE(solution.discretization.unit_bytes == 1);
      REQUIRE((solution.ok() || !was_feasible));  // feasibility never lost
      if (!solution.ok()) continue;
      was_feasible = true;
      REQUIRE(solution.makespan_ms <= previous + 1e-9);
      previous = solution.makespan_ms;
    }
    REQUIRE(close(previous, chain.store_all_ms()));
  }
}

TEST_CASE("with a budget at or above the store-all peak, optimal is store-all", "[solver]") {
  for (std::uint64_t seed = 0; seed < 100; ++seed) {
    test::RandomChainSpec spec;
    spec.max_bytes = 1 << 24;
    spec.max_length = 12;
    const Chain chain = test::random_chain(seed + 700, spec);
    const std::int64_t peak = store_all_peak(chain);
    const Solution all = solve(chain, SolveOptions(peak).algorithm(Algorithm::kStoreAll));
    for (const std::int64_t budget : {peak, peak + 1, 2 * peak}) {
      const Solution optimal = solve(chain, SolveOptions(budget));
      INFO("seed " << seed << " budget " << budget);
      REQUIRE(optimal.status == SolveStatus::kOptimal);
      REQUIRE(optimal.sequence == all.sequence);
      REQUIRE(optimal.makespan_ms == all.makespan_ms);
      REQUIRE(optimal.peak_bytes == peak);
    }
  }
}

TEST_CASE("infeasible exactly below the reported minimum budget", "[solver]") {
  for (std::uint64_t seed = 0; seed < 60; ++seed) {
    test::RandomChainSpec spec;
    spec.max_bytes = seed % 3 == 0 ? 30 : 1 << 22;
    spec.max_length = 10;
    const Chain chain = test::random_chain(seed + 1100, spec);
    for (const Algorithm algorithm : all_algorithms()) {
      for (const std::int64_t slots : {std::int64_t{0}, std::int64_t{37}, std::int64_t{500}}) {
        if (slots > 0 && algorithm != Algorithm::kOptimal) continue;
        SolveOptions options = SolveOptions(0).algorithm(algorithm).slots(slots);
        const std::int64_t minimum = min_feasible_budget(chain, options);
        INFO("seed " << seed << " " << algorithm_name(algorithm) << " slots " << slots
                     << " minimum " << minimum);
        REQUIRE(minimum > 0);
        const Solution at = solve(chain, options.budget_bytes(minimum));
        const Solution below = solve(chain, options.budget_bytes(minimum - 1));
        REQUIRE(at.ok());
        REQUIRE_FALSE(below.ok());
        REQUIRE(below.min_feasible_budget_bytes == minimum);
        REQUIRE(at.peak_bytes <= minimum);
      }
    }
  }
}

TEST_CASE("bad options are refused by solve and by min_feasible_budget alike", "[solver]") {
  const Chain chain = test::random_chain(7, test::RandomChainSpec());
  for (const Algorithm algorithm : all_algorithms()) {
    INFO(algorithm_name(algorithm));
    CHECK_THROWS_WITH(solve(chain, SolveOptions(-1).algorithm(algorithm)),
                      Catch::Contains("budget (-1 bytes) must not be negative"));
    for (const SolveOptions& bad : {SolveOptions(1000).algorithm(algorithm).slots(-3),
                                    SolveOptions(1000).algorithm(algorithm).threads(-2)}) {
      const std::string what = bad.slots() < 0 ? "slots (-3)" : "threads (-2)";
      CHECK_THROWS_AS(solve(chain, bad), std::invalid_argument);
      CHECK_THROWS_WITH(solve(chain, bad), Catch::Contains(what));
      CHECK_THROWS_WITH(min_feasible_budget(chain, bad), Catch::Contains(what));
    }
  }
}

TEST_CASE("with N slots, rounding can make a larger budget slower; measured", "[solver]") {
  // With --slots N the unit is floor(budget / N): it grows with the budget, and sizes rounded
  // up to whole units can then need more units. docs/algorithms.md quotes these figures.
  int pairs = 0, increases = 0;
  double worst = 0;
  for (std::uint64_t seed = 0; seed < 60; ++seed) {
    test::RandomChainSpec spec;
    spec.max_bytes = 1 << 20;
    spec.max_length = 10;
    const Chain chain = test::random_chain(seed + 1700, spec);
    const std::int64_t peak = store_all_peak(chain);
    double previous = -1;
    for (const std::int64_t budget : budgets_between(peak / 3, peak, 60)) {
      const Solution solution = solve(chain, SolveOptions(budget).slots(50));
      if (!solution.ok()) {
        previous = -1;
        continue;
      }
      REQUIRE(solution.peak_bytes <= budget);
      if (previous > 0) {
        ++pairs;
        if (solution.makespan_ms > previous + 1e-9) {
          ++increases;
          worst = std::max(worst, solution.makespan_ms / previous - 1);
        }
      }
      previous = solution.makespan_ms;
    }
  }
  WARN("--slots 50: makespan increased in " << increases << " of " << pairs
                                            << " budget steps, by at most " << 100 * worst << "%");
  CHECK(pairs > 1000);
}

}  // namespace remat
