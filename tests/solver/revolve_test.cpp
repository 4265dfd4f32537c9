// Revolve against Griewank's closed form, itself checked against the plain recursion.
#include <catch2/catch.hpp>
#include <map>

#include "heuristics.h"
#include "remat/solver.h"
#include "test_chains.h"

namespace remat {
namespace {

// t(l, s) = min_{1<=k<l} k + t(l-k, s-1) + t(k, s); t(1, s) = 0; t(l > 1, 0) impossible.
std::int64_t brute_force(int steps, int snapshots,
                         std::map<std::pair<int, int>, std::int64_t>& memo) {
  if (steps <= 1) return 0;
  if (snapshots == 0) return -1;
  const auto key = std::make_pair(steps, snapshots);
  if (const auto found = memo.find(key); found != memo.end()) return found->second;
  std::int64_t best = -1;
  for (int k = 1; k < steps; ++k) {
    const std::int64_t right = brute_force(steps - k, snapshots - 1, memo);
    if (right < 0) continue;
    const std::int64_t total = k + right + brute_force(k, snapshots, memo);
    if (best < 0 || total < best) best = total;
  }
  memo[key] = best;
  return best;
}

}  // namespace

TEST_CASE("Griewank's closed form equals the binomial recursion", "[solver]") {
  std::map<std::pair<int, int>, std::int64_t> memo;
  for (int steps = 1; steps <= 60; ++steps) {
    for (int snapshots = 1; snapshots <= 8; ++snapshots) {
      INFO("steps " << steps << " snapshots " << snapshots);
      REQUIRE(detail::revolve_forward_count(steps, snapshots) ==
              brute_force(steps, snapshots, memo));
    }
  }
  // Known values: one snapshot is recompute-all, l(l-1)/2; enough snapshots need l-1.
  CHECK(detail::revolve_forward_count(10, 1) == 45);
  CHECK(detail::revolve_forward_count(10, 9) == 9);
}

TEST_CASE("revolve's sequence performs Griewank's minimal number of forward steps", "[solver]") {
  for (const int length : {1, 2, 3, 7, 16, 33, 100}) {
    const Chain chain = test::uniform_chain(length);
    std::int64_t previous_peak = 0;
    for (int snapshots = 1; snapshots <= std::min(length, 12); ++snapshots) {
      const Sequence sequence = detail::revolve_sequence(length, snapshots);
      const Simulation sim = simulate(chain, sequence);  // throws if invalid
      INFO("L " << length << " snapshots " << snapshots);
      // Each stage is taped once (Fe) right before its backward; every other forward is an
      // advance, which Griewank counts.
      REQUIRE(sim.grad_forwards == length);
      REQUIRE(sim.nograd_forwards == detail::revolve_forward_count(length, snapshots));
      // More snapshots never need less memory on a homogeneous chain.
      REQUIRE(sim.peak_bytes >= previous_peak);
      previous_peak = sim.peak_bytes;
    }
  }
}

TEST_CASE("revolve picks the most checkpoints that fit the budget", "[solver]") {
  const Chain chain = test::uniform_chain(20, 100);
  const Solution least = solve(chain, SolveOptions(0).algorithm(Algorithm::kRevolve));
  REQUIRE_FALSE(least.ok());
  const std::int64_t minimum = least.min_feasible_budget_bytes;
  REQUIRE(minimum == simulate(chain, detail::revolve_sequence(20, 1)).peak_bytes);
  std::int64_t previous_snapshots = 0;
  for (std::int64_t budget = minimum; budget <= minimum + 2000; budget += 100) {
    const Solution solution = solve(chain, SolveOptions(budget).algorithm(Algorithm::kRevolve));
    REQUIRE(solution.ok());
    REQUIRE(solution.peak_bytes <= budget);
    REQUIRE(solution.parameter >= previous_snapshots);
    if (solution.parameter < 20) {
      // One more checkpoint would not have fit.
      const Simulation more = simulate(chain, detail::revolve_sequence(20, solution.parameter + 1));
      REQUIRE(more.peak_bytes > budget);
    }
    previous_snapshots = solution.parameter;
  }
  CHECK(previous_snapshots > 5);
}

TEST_CASE("recompute-all is revolve with one checkpoint and needs least memory", "[solver]") {
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    const Chain chain = test::random_chain(seed + 40, {});
    const Solution all = solve(chain, SolveOptions(1LL << 40).algorithm(Algorithm::kRecomputeAll));
    REQUIRE(all.ok());
    REQUIRE(all.sequence == detail::revolve_sequence(chain.length(), 1));
    REQUIRE(all.simulation.grad_forwards == chain.length());
    const int l = chain.length();
    REQUIRE(all.simulation.nograd_forwards == static_cast<std::int64_t>(l) * (l - 1) / 2);
  }
}

TEST_CASE("periodic matches checkpoint_sequential's segments", "[solver]") {
  // L = 10, K = 3: segments of floor(10 / 3) = 3 stages, the last one takes the rest.
  CHECK(collapsed_string(detail::periodic_sequence(10, 3)) ==
        "CF_0 Fn_1..2 CF_3 Fn_4..5 Fe_6..9 L B_9..6 Fe_3..5 B_5..3 Fe_0..2 B_2..0");
  CHECK(detail::periodic_sequence(5, 1) == detail::store_all_sequence(5));
  const Chain chain = test::uniform_chain(16);
  const Solution solution = solve(chain, SolveOptions(1 << 20).algorithm(Algorithm::kPeriodic));
  CHECK(solution.parameter == 4);  // round(sqrt(16))
  CHECK_THROWS_WITH(
      solve(chain, SolveOptions(1 << 20).algorithm(Algorithm::kPeriodic).segments(17)),
      Catch::Contains("segments (17) must be between 1 and the number of stages (16)"));
}

}  // namespace remat
