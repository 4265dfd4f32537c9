#include <catch2/catch.hpp>
#include <limits>

#include "remat/solver.h"
#include "test_chains.h"

using remat::Algorithm;
using remat::SolveOptions;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

TEST_CASE("tradeoff: optimal points equal a solve at each budget, in exact bytes",
          "[solver][tradeoff]") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const remat::Chain chain = remat::test::random_chain(seed);
    // Slots above every budget: the table works in exact bytes, as solve() then does.
    const std::int64_t slots = 4 * remat::store_all_peak(chain) + 16;
    const remat::Tradeoff t = remat::tradeoff(chain, remat::TradeoffOptions().points(9).slots(slots));
    INFO("seed " << seed);
    REQUIRE(t.unit_bytes == 1);
    REQUIRE(t.budgets.size() == t.optimal.size());
    CHECK(t.budgets.front() == t.min_feasible_budget_bytes);
    CHECK(t.budgets.back() == t.store_all_peak_bytes);
    CHECK(t.min_feasible_budget_bytes ==
          remat::min_feasible_budget(chain, SolveOptions(0).slots(slots)));
    double previous = kInf;
    for (std::size_t k = 0; k < t.budgets.size(); ++k) {
      const remat::TradeoffPoint& p = t.optimal[k];
      const remat::Solution s = remat::solve(chain, SolveOptions(t.budgets[k]).slots(slots));
      REQUIRE(p.feasible);
      REQUIRE(s.ok());
      CHECK(p.makespan_ms == Approx(s.makespan_ms).epsilon(1e-12));
      CHECK(p.peak_bytes <= t.budgets[k]);
      CHECK(p.makespan_ms <= previous * (1 + 1e-12));  // more memory never costs time
      previous = p.makespan_ms;
      // Optimal is never slower than the heuristics that fit.
      if (t.revolve[k].feasible) CHECK(p.makespan_ms <= t.revolve[k].makespan_ms + 1e-9);
      if (t.periodic_best[k].feasible) CHECK(p.makespan_ms <= t.periodic_best[k].makespan_ms + 1e-9);
    }
    CHECK(t.optimal.back().makespan_ms == Approx(t.store_all_makespan_ms));
  }
}

TEST_CASE("tradeoff: with carried members, optimal points are solve()'s, its search included",
          "[solver][tradeoff]") {
  // Automatic slots on small chains (exact bytes): the table answers solve()'s search above
  // the budget (SolveOptions::search_above_budget) with the same probes.
  int faster = 0;
  for (std::uint64_t seed = 0; seed < 60; ++seed) {
    remat::test::RandomChainSpec spec;
    spec.max_length = 5;
    spec.max_bytes = 12;
    spec.partial_keeps = true;
    spec.carried = true;
    const remat::Chain chain = remat::test::random_chain(600 + seed, spec);
    if (chain.carried_bytes() == 0) continue;
    INFO(remat::chain_to_json(chain));
    const remat::Tradeoff t = remat::tradeoff(chain, remat::TradeoffOptions().points(9).threads(1));
    REQUIRE(t.unit_bytes == 1);
    for (std::size_t k = 0; k < t.budgets.size(); ++k) {
      INFO("budget " << t.budgets[k]);
      const remat::TradeoffPoint& p = t.optimal[k];
      const remat::Solution s = remat::solve(chain, SolveOptions(t.budgets[k]).threads(1));
      REQUIRE(p.feasible == s.ok());
      if (!s.ok()) continue;
      CHECK(p.makespan_ms == Approx(s.makespan_ms).epsilon(1e-12));
      CHECK(p.peak_bytes <= t.budgets[k]);
      const remat::Solution alone = remat::solve(
          chain,
          SolveOptions(t.budgets[k]).threads(1).search_above_budget(false).exact_storages(false));
      if (p.makespan_ms < alone.makespan_ms * (1 - 1e-12)) ++faster;
    }
  }
  CHECK(faster > 0);  // the search matters on these chains
}

TEST_CASE("tradeoff: revolve and periodic points are those of solve()", "[solver][tradeoff]") {
  for (std::uint64_t seed = 50; seed <= 60; ++seed) {
    const remat::Chain chain = remat::test::random_chain(seed);
    const remat::Tradeoff t = remat::tradeoff(chain, remat::TradeoffOptions().points(6));
    INFO("seed " << seed);
    REQUIRE(static_cast<int>(t.periodic.size()) == chain.length());
    for (const remat::TradeoffPoint& p : t.periodic) {
      const remat::Solution s = remat::solve(
          chain, SolveOptions(1LL << 50).algorithm(Algorithm::kPeriodic).segments(p.parameter));
      CHECK(p.peak_bytes == s.peak_bytes);
      CHECK(p.makespan_ms == Approx(s.makespan_ms));
    }
    for (std::size_t k = 0; k < t.budgets.size(); ++k) {
      const remat::Solution s =
          remat::solve(chain, SolveOptions(t.budgets[k]).algorithm(Algorithm::kRevolve));
      CHECK(t.revolve[k].feasible == s.ok());
      if (s.ok()) {
        CHECK(t.revolve[k].parameter == s.parameter);
        CHECK(t.revolve[k].makespan_ms == Approx(s.makespan_ms));
      }
      // periodic_best: the fastest segment count within the budget, by brute force.
      double best = kInf;
      for (const remat::TradeoffPoint& p : t.periodic)
        if (p.peak_bytes <= t.budgets[k]) best = std::min(best, p.makespan_ms);
      CHECK(t.periodic_best[k].feasible == (best < kInf));
      if (t.periodic_best[k].feasible) CHECK(t.periodic_best[k].makespan_ms == best);
    }
    // Automatic slots: every optimal point fits its budget.
    for (std::size_t k = 0; k < t.budgets.size(); ++k)
      if (t.optimal[k].feasible) CHECK(t.optimal[k].peak_bytes <= t.budgets[k]);
  }
}

TEST_CASE("tradeoff: bad options are errors", "[solver][tradeoff]") {
  const remat::Chain chain = remat::test::uniform_chain(5);
  CHECK_THROWS_WITH(remat::tradeoff(chain, remat::TradeoffOptions().points(1)),
                    Catch::Contains("points must be at least 2"));
  CHECK_THROWS_WITH(remat::tradeoff(chain, remat::TradeoffOptions().from_bytes(500).to_bytes(400)),
                    Catch::Contains("is above the largest"));
}

TEST_CASE("tradeoff: too few slots for optimal at any budget still gives revolve and periodic",
          "[solver][tradeoff]") {
  const remat::Chain chain = remat::test::uniform_chain(10, 1000);
  const std::int64_t needed = remat::min_feasible_slots(chain, SolveOptions(0));
  REQUIRE(needed > 1);
  for (const std::int64_t slots : {std::int64_t{1}, needed - 1}) {
    const remat::Tradeoff t =
        remat::tradeoff(chain, remat::TradeoffOptions().points(6).slots(slots));
    CHECK(t.min_feasible_budget_bytes == -1);
    // The grid starts at the least budget of the heuristics: revolve's with one checkpoint.
    REQUIRE(t.budgets.size() == 6);
    CHECK(t.budgets.front() ==
          remat::solve(chain, SolveOptions(0).algorithm(Algorithm::kRecomputeAll))
              .min_feasible_budget_bytes);
    CHECK(t.budgets.back() == t.store_all_peak_bytes);
    CHECK(t.revolve.front().feasible);
    // Not even at the store-all peak: solve() with these slots finds nothing there either.
    for (std::size_t k = 0; k < t.budgets.size(); ++k) CHECK_FALSE(t.optimal[k].feasible);
    CHECK_FALSE(remat::solve(chain, SolveOptions(t.store_all_peak_bytes).slots(slots)).ok());
  }
  CHECK(remat::tradeoff(chain, remat::TradeoffOptions().slots(needed)).min_feasible_budget_bytes >
        0);
}

TEST_CASE("tradeoff: a grid up to int64's largest budget", "[solver][tradeoff]") {
  const remat::Chain chain = remat::test::uniform_chain(6, 1000);
  constexpr std::int64_t kLargest = std::numeric_limits<std::int64_t>::max();
  for (const int points : {2, 7, 1000}) {
    const remat::Tradeoff t =
        remat::tradeoff(chain, remat::TradeoffOptions().points(points).to_bytes(kLargest));
    REQUIRE(t.budgets.back() == kLargest);
    for (std::size_t k = 1; k < t.budgets.size(); ++k) CHECK(t.budgets[k] > t.budgets[k - 1]);
    CHECK(t.optimal.back().feasible);
    CHECK(t.optimal.back().makespan_ms == t.store_all_makespan_ms);
  }
}

TEST_CASE("tradeoff with given slots agrees with solve() at every budget, store-all's included",
          "[solver][tradeoff]") {
  int above_store_all = 0, none = 0, below = 0;
  for (std::uint64_t seed = 70; seed <= 85; ++seed) {
    const remat::Chain chain = remat::test::random_chain(seed);
    const std::int64_t needed = remat::min_feasible_slots(chain, SolveOptions(0));
    for (const std::int64_t slots : {needed - 1, needed, needed + 1, needed + 3, 2 * needed + 5}) {
      if (slots < 1) continue;
      INFO("seed " << seed << ", " << slots << " slots");
      // The default range never fails, whatever the slots.
      const remat::Tradeoff t =
          remat::tradeoff(chain, remat::TradeoffOptions().points(7).slots(slots));
      const std::int64_t least = remat::min_feasible_budget(chain, SolveOptions(0).slots(slots));
      REQUIRE(t.min_feasible_budget_bytes == least);
      REQUIRE(!t.budgets.empty());
      // The least budget of revolve and periodic, from solve().
      std::int64_t heuristic_least =
          remat::solve(chain, SolveOptions(0).algorithm(Algorithm::kRevolve))
              .min_feasible_budget_bytes;
      for (int segments = 1; segments <= chain.length(); ++segments)
        heuristic_least = std::min(
            heuristic_least,
            remat::solve(chain, SolveOptions(0).algorithm(Algorithm::kPeriodic).segments(segments))
                .min_feasible_budget_bytes);
      if (least < 0) {
        ++none;
        CHECK(t.budgets.front() == heuristic_least);
        CHECK(t.budgets.back() == t.store_all_peak_bytes);
      } else if (least > t.store_all_peak_bytes) {
        // Optimal with these slots needs more than store-all: the grid reaches its least budget.
        ++above_store_all;
        CHECK(t.budgets.front() == heuristic_least);
        CHECK(t.budgets.back() == least);
      } else {
        ++below;
        CHECK(t.budgets.front() == least);
        CHECK(t.budgets.back() == t.store_all_peak_bytes);
      }
      for (std::size_t k = 0; k < t.budgets.size(); ++k) {
        const remat::Solution s = remat::solve(chain, SolveOptions(t.budgets[k]).slots(slots));
        INFO("budget " << t.budgets[k]);
        CHECK(t.optimal[k].feasible == s.ok());
        if (t.optimal[k].feasible) CHECK(t.optimal[k].peak_bytes <= t.budgets[k]);
      }
      // At the largest budget the table's unit is solve()'s: the same schedule.
      if (t.optimal.back().feasible)
        CHECK(t.optimal.back().makespan_ms ==
              Approx(remat::solve(chain, SolveOptions(t.budgets.back()).slots(slots)).makespan_ms)
                  .epsilon(1e-12));
    }
  }
  // Every case was met.
  CHECK(above_store_all > 0);
  CHECK(none > 0);
  CHECK(below > 0);
}
