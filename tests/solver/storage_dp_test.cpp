// The storage-exact dynamic program (solver/src/storage_dp.cpp) against the exhaustive oracle's
// nested sequences on chains with carried members, and against the persistent table on chains
// without (where the two recurrences must agree at every memory).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "exhaustive_oracle.h"
#include "min_memory_table.h"
#include "persistent_table.h"
#include "remat/solver/simulator.h"
#include "remat/solver/solver.h"
#include "remat/solver/tradeoff.h"
#include "storage_dp.h"
#include "test_chains.h"
#include "unit_chain.h"

namespace remat {
namespace {

bool same_time(double a, double b) {
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(a));
}

using test::carried_spec;

// The peak and time of every nested sequence of a chain, by the oracle's bookkeeping.
struct Nested {
  std::vector<std::pair<std::int64_t, double>> points;
  std::int64_t least = std::numeric_limits<std::int64_t>::max();  // the least peak

  explicit Nested(const Chain& chain) {
    const test::ExhaustiveOracle oracle(chain);
    for (const Sequence& sequence : oracle.nested_sequences()) {
      points.push_back(oracle.evaluate(sequence));
      least = std::min(least, points.back().first);
    }
  }
  // The fastest time among those that fit `budget`; +inf if none does.
  double best(std::int64_t budget) const {
    double out = test::ExhaustiveOracle::kInf;
    for (const auto& [peak, time] : points)
      if (peak <= budget) out = std::min(out, time);
    return out;
  }
};

// At every budget from below the least nested peak to the store-all peak, in bytes: the
// table's value is the best nested sequence's time, and its sequence fits with that time.
// Returns the number of budgets checked.
int check_against_oracle(const Chain& chain) {
  INFO(chain_to_json(chain));
  const Nested nested(chain);
  const std::int64_t least = nested.least;
  CHECK(detail::StorageDp::least_bytes(chain) == least);
  const std::int64_t top = store_all_peak(chain);
  const auto dp = detail::StorageDp::build(chain, 1, top, true, std::int64_t{1} << 30, 1e12);
  REQUIRE(dp);
  int budgets = 0;
  for (std::int64_t budget = std::max<std::int64_t>(0, least - 2); budget <= top; ++budget) {
    INFO("budget " << budget);
    const double best = nested.best(budget);
    const double value = dp->value_at(budget);
    CHECK(same_time(value, best));
    const Sequence sequence = dp->sequence_at(budget);
    CHECK(sequence.empty() == std::isinf(value));
    if (!sequence.empty()) {
      INFO(collapsed_string(sequence));
      const Simulation sim = simulate(chain, sequence);
      CHECK(sim.peak_bytes <= budget);
      CHECK(same_time(sim.makespan_ms, value));
    }
    ++budgets;
  }
  return budgets;
}

TEST_CASE("storage dp: with carried members, the best nested sequence at every budget",
          "[solver][storage_dp][oracle]") {
  int budgets = 0, chains = 0;
  for (std::uint64_t seed = 0; seed < 300; ++seed) {
    test::RandomChainSpec spec = carried_spec(5);
    spec.restarts = seed % 2 == 0;
    spec.gradient_sizes = seed % 3 == 0;  // gradients larger or smaller than their members
    const Chain chain = test::random_chain(41000 + seed, spec);
    if (chain.carried_bytes() == 0) continue;
    ++chains;
    budgets += check_against_oracle(chain);
  }
  CHECK(chains > 150);
  CHECK(budgets > 3000);
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// Without carried members every storage is in one activation, and the two recurrences are the
// same: the persistent table's value at every memory, in bytes, and its least memory.
TEST_CASE("storage dp: without carried members, the persistent table's values",
          "[solver][storage_dp]") {
  int chains = 0, memories = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    test::RandomChainSpec spec;
    spec.max_length = 9;
    spec.partial_keeps = seed % 3 != 0;  // two states at some starts; model v1 otherwise
    spec.restarts = seed % 2 == 0;
    const Chain chain = test::random_chain(43000 + seed, spec);
    REQUIRE(chain.carried_bytes() == 0);
    INFO(chain_to_json(chain));
    const detail::UnitChain units = detail::make_unit_chain(chain, 1, true);
    const std::int64_t top = store_all_peak(chain) + 3;
    const detail::MinMemoryTable min_memory(units);
    const std::int64_t frame = top - units.context;
    const detail::PersistentTable table(units, min_memory, frame, 1);
    const auto dp = detail::StorageDp::build(chain, 1, top, true, std::int64_t{1} << 30, 1e12);
    REQUIRE(dp);
    CHECK(detail::StorageDp::least_bytes(chain) == min_feasible_budget(chain, SolveOptions(0)));
    for (std::int64_t budget = 0; budget <= top; ++budget) {
      INFO("budget " << budget);
      const double expected =
          budget - units.context - units.x[0] < 0 ? test::ExhaustiveOracle::kInf
                                                  : table.value(0, chain.length(), budget - units.context);
      CHECK(same_time(dp->value_at(budget), expected));
      ++memories;
    }
    ++chains;
  }
  CHECK(memories > 5000);
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// solve() with its defaults on chains with carried members: at every budget, the fastest nested
// sequence that fits (the oracle's), its least budget the least nested peak; tradeoff's points
// the same.
TEST_CASE("storage dp: solve() is the best nested sequence at every budget, carried members too",
          "[solver][storage_dp][oracle]") {
  int budgets = 0, beyond_merged = 0;
  for (std::uint64_t seed = 0; seed < 120; ++seed) {
    test::RandomChainSpec spec = carried_spec(5);
    spec.restarts = seed % 2 == 1;
    spec.gradient_sizes = seed % 3 == 0;
    const Chain chain = test::random_chain(45000 + seed, spec);
    if (chain.carried_bytes() == 0) continue;
    INFO(chain_to_json(chain));
    const Nested nested(chain);
    const std::int64_t least = nested.least;
    CHECK(min_feasible_budget(chain, SolveOptions(0)) == least);
    const std::int64_t top = store_all_peak(chain);
    const Tradeoff t = tradeoff(chain, TradeoffOptions().points(7).threads(1));
    CHECK(t.min_feasible_budget_bytes == least);
    for (std::int64_t budget = least - 1; budget <= top; ++budget) {
      INFO("budget " << budget);
      const double best = nested.best(budget);
      const Solution s = solve(chain, SolveOptions(budget).threads(1));
      CHECK(s.min_feasible_budget_bytes == least);
      REQUIRE(s.ok() == (budget >= least));
      if (!s.ok()) continue;
      CHECK(same_time(s.makespan_ms, best));
      CHECK(s.peak_bytes <= budget);
      CHECK(simulate(chain, s.sequence).peak_bytes == s.peak_bytes);
      const Solution without =
          solve(chain, SolveOptions(budget).threads(1).exact_storages(false));
      if (!without.ok() || s.makespan_ms < without.makespan_ms * (1 - 1e-12)) ++beyond_merged;
      ++budgets;
    }
    for (std::size_t k = 0; k < t.budgets.size(); ++k) {
      INFO("tradeoff budget " << t.budgets[k]);
      REQUIRE(t.optimal[k].feasible);
      CHECK(same_time(t.optimal[k].makespan_ms, nested.best(t.budgets[k])));
    }
  }
  CHECK(budgets > 1000);
  // Where the search and the merged chain do not reach the optimum, this does.
  CHECK(beyond_merged > 100);
  WARN("storage-exact: " << budgets << " budgets, faster than the search and the merged chain at "
                         << beyond_merged);
}

// A chain whose sizes are large enough that a budget at the least nested peak is within the
// rounding of the table's unit: solve() still finds a sequence (the least-memory one).
TEST_CASE("storage dp: the least budget is feasible whatever the unit", "[solver][storage_dp]") {
  int rounded = 0;
  for (std::uint64_t seed = 0; seed < 60; ++seed) {
    Chain chain = test::random_chain(47000 + seed, carried_spec(6));
    if (chain.carried_bytes() == 0) continue;
    const auto scale = [](std::int64_t& bytes) { bytes = bytes * 1000003 + 7; };
    for (Member& member : chain.inputs) scale(member.bytes);
    for (Stage& stage : chain.stages) {
      for (Member& member : stage.outputs) scale(member.bytes);
      scale(stage.state_bytes);
      scale(stage.fwd_tmp_bytes);
      scale(stage.bwd_tmp_bytes);
      stage.fwd_nograd_tmp_bytes.reset();
    }
    // Carried members repeat their source's bytes (Chain::validate).
    for (std::size_t i = 0; i < chain.stages.size(); ++i)
      for (Member& member : chain.stages[i].outputs)
        if (member.carried())
          member.bytes =
              chain.members(static_cast<int>(i))[static_cast<std::size_t>(member.carried_from)].bytes;
    INFO(chain_to_json(chain));
    chain.validate();
    const std::int64_t least = min_feasible_budget(chain, SolveOptions(0));
    CHECK(least == detail::StorageDp::least_bytes(chain));
    const Solution s = solve(chain, SolveOptions(least));
    REQUIRE(s.ok());
    CHECK(s.peak_bytes <= least);
    if (s.status == SolveStatus::kFeasible) ++rounded;
    CHECK(!solve(chain, SolveOptions(least - 1)).ok());
  }
  CHECK(rounded > 0);
}

// The rows of one segment length are computed by several workers: the table must not depend on
// how many. Longer chains than the oracle's, so that each length has many rows, in units of 7
// bytes (rounded sets).
TEST_CASE("storage dp: the same table whatever the number of threads", "[solver][storage_dp]") {
  int rows = 0;
  for (std::uint64_t seed = 0; seed < 12; ++seed) {
    test::RandomChainSpec spec = carried_spec(40);
    spec.min_length = 25;
    spec.max_bytes = 300;
    spec.restarts = true;
    const Chain chain = test::random_chain(47000 + seed, spec);
    if (chain.carried_bytes() == 0) continue;
    INFO(chain_to_json(chain));
    const std::int64_t unit = 7;
    const std::int64_t capacity = store_all_peak(chain) / unit + 2;
    const auto one = detail::StorageDp::build(chain, unit, capacity, true, std::int64_t{1} << 30,
                                              1e12, 1);
    const auto four = detail::StorageDp::build(chain, unit, capacity, true,
                                               std::int64_t{1} << 30, 1e12, 4);
    REQUIRE(one);
    REQUIRE(four);
    for (std::int64_t m = 0; m <= capacity; ++m) {
      INFO("memory " << m);
      const double value = one->value_at(m * unit);
      CHECK(four->value_at(m * unit) == value);
      if (std::isinf(value)) continue;
      CHECK(collapsed_string(four->sequence_at(m * unit)) ==
            collapsed_string(one->sequence_at(m * unit)));
      ++rows;
    }
  }
  CHECK(rows > 1000);
}

}  // namespace
}  // namespace remat
