// SolveOptions::merge_carried_runs: the merged chain (solver/src/merge.cpp) against the chain
// itself, replayed by the simulator. Every sequence of the merged chain, expanded, must run on
// the chain in the merged chain's time, never above its peak (during any merged operation),
// with the same live memory after each merged operation; and solve() must then be at least as
// fast as the merged chain's solve, fit the budget, and never beat the best nested schedule.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "exhaustive_oracle.h"
#include "heuristics.h"
#include "merged_chain.h"
#include "min_memory_table.h"
#include "persistent_table.h"
#include "remat/solver/simulator.h"
#include "remat/solver/solver.h"
#include "remat/solver/tradeoff.h"
#include "strategies.h"
#include "test_chains.h"
#include "unit_chain.h"

namespace remat {
namespace {

bool same_time(double a, double b) {
  return std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(a));
}

Stage stage_of(const char* name, std::vector<Member> outputs, std::vector<int> saved_inputs,
               std::vector<int> saved_outputs, std::int64_t state, double fwd_ms) {
  Stage stage;
  stage.name = name;
  stage.outputs = std::move(outputs);
  stage.saved_inputs = std::move(saved_inputs);
  stage.saved_outputs = std::move(saved_outputs);
  stage.state_bytes = state;
  stage.fwd_ms = fwd_ms;
  stage.bwd_ms = 2 * fwd_ms;
  return stage;
}

Member carry(int from, std::int64_t bytes) {
  Member member{bytes, true};
  member.carried_from = from;
  return member;
}

// A residual block cut by layer: the block input `a` (100 bytes) is carried through conv1 and
// conv2 to the addition.
Chain residual_chain() {
  Chain chain;
  chain.name = "residual";
  chain.set_input(50, false);
  chain.stages.push_back(stage_of("stem", {Member{100, true}}, {0}, {}, 0, 1));
  Stage conv1 = stage_of("conv1", {Member{200, true}, carry(0, 100)}, {0}, {}, 10, 2);
  conv1.fwd_tmp_bytes = 5;
  conv1.bwd_tmp_bytes = 7;
  chain.stages.push_back(conv1);
  chain.stages.push_back(stage_of("conv2", {Member{200, true}, carry(1, 100)}, {0}, {}, 20, 3));
  chain.stages.push_back(stage_of("add", {Member{100, true}}, {}, {}, 0, 0.5));
  chain.stages.push_back(stage_of("head", {Member{10, true}}, {0}, {}, 0, 1));
  chain.validate("residual");
  return chain;
}

// Checks an expanded sequence against the merged chain's simulation, operation by operation;
// returns the most memory the chain takes during each merged operation's expansion.
std::vector<std::int64_t> check_expansion(const Chain& chain, const detail::MergedChain& merged,
                                          const Sequence& sequence) {
  INFO("merged sequence: " << collapsed_string(sequence));
  const Simulation coarse = simulate(merged.chain, sequence);
  const Sequence expanded = detail::expand_merged(sequence, merged.first);
  const Simulation fine = simulate(chain, expanded);
  CHECK(fine.peak_bytes <= coarse.peak_bytes);
  CHECK(same_time(fine.makespan_ms, coarse.makespan_ms));
  CHECK(fine.restarts == coarse.restarts);
  std::vector<std::int64_t> out;
  std::size_t next = 0;
  for (const OpRecord& op : coarse.trace) {
    const int count = op.op.kind == OpKind::kLoss
                          ? 1
                          : merged.first[static_cast<std::size_t>(op.op.stage) + 1] -
                                merged.first[static_cast<std::size_t>(op.op.stage)];
    std::int64_t most = 0;
    for (int k = 0; k < count; ++k) most = std::max(most, fine.trace[next + k].during.total());
    next += static_cast<std::size_t>(count);
    INFO("merged operation " << op.op.str());
    CHECK(most <= op.during.total());
    CHECK(fine.trace[next - 1].live_after_bytes == op.live_after_bytes);
    out.push_back(most);
  }
  CHECK(next == fine.trace.size());
  return out;
}

}  // namespace

TEST_CASE("merge: a residual block cut by layer becomes one stage, its fields derived by hand",
          "[solver][merge]") {
  const Chain chain = residual_chain();
  const std::optional<detail::MergedChain> merged = detail::merge_carried_runs(chain);
  REQUIRE(merged);
  CHECK(merged->first == std::vector<int>{0, 1, 4, 5});
  REQUIRE(merged->chain.length() == 3);
  const Stage& block = merged->chain.stages[1];
  CHECK(block.name == "conv1+conv2+add");
  CHECK(block.fwd_ms == 5.5);
  CHECK(block.bwd_ms == 11);
  CHECK(block.nograd_ms() == 5.5);
  REQUIRE(block.outputs.size() == 1);
  CHECK(block.outputs[0].bytes == 100);
  CHECK(!block.outputs[0].carried());
  CHECK(block.saved_inputs == std::vector<int>{0});  // conv1 keeps a
  CHECK(block.saved_outputs.empty());
  // conv1's and conv2's states, and conv1's output, which conv2 keeps.
  CHECK(block.state_bytes == 10 + 20 + 200);
  // Forward: the addition, with conv2's output still a value: 30 + 200 + 200 + 100, less the
  // output and the state.
  CHECK(block.fwd_tmp_bytes == 530 - 100 - 230);
  // Without autograd: conv2 holds conv1's output and its own (400), less the output.
  CHECK(block.nograd_tmp_bytes() == 400 - 100);
  // Backward of conv2: the states (30 + 200), y_3 (200 and a's 100), y_2's new 200, less the
  // state and y_1 (a's gradient).
  CHECK(block.bwd_tmp_bytes == 730 - 230 - 100);
  CHECK(merged->chain.stages[0].name == "stem");
  CHECK(merged->chain.stages[2].name == "head");
  // The block's forward with autograd is exact: its peak is the addition's (680 = 50 + 100 +
  // 530 in store-all, 790 in recompute-all, where y_5 and x_0's gradient-free copy are live).
  // Its backward is not: the merged stage holds y_4 and what conv2 keeps until it is done.
  const Sequence store_all = detail::store_all_sequence(3);
  const std::vector<std::int64_t> store_all_most = check_expansion(chain, *merged, store_all);
  const Simulation merged_store_all = simulate(merged->chain, store_all);
  REQUIRE(collapsed_string(store_all) == "Fe_0..2 L B_2..0");
  CHECK(store_all_most[1] == 680);
  CHECK(merged_store_all.trace[1].during.total() == 680);
  CHECK(store_all_most[5] == 890);
  CHECK(merged_store_all.trace[5].during.total() == 990);
  const Sequence recompute = detail::revolve_sequence(3, 1);
  const std::vector<std::int64_t> recompute_most = check_expansion(chain, *merged, recompute);
  const Simulation merged_recompute = simulate(merged->chain, recompute);
  for (std::size_t k = 0; k < recompute.size(); ++k) {
    INFO(recompute[k].str());
    if (recompute[k].is_forward())
      CHECK(recompute_most[k] == merged_recompute.trace[k].during.total());
  }
}

TEST_CASE("merge: sequences expand stage by stage", "[solver][merge]") {
  const Sequence merged = parse_sequence("CF_0 Fn_1 Fe_2 L B_2 Fe_1 B_1 Fe_0 B_0", 3);
  CHECK(collapsed_string(detail::expand_merged(merged, {0, 1, 4, 5})) ==
        collapsed_string(parse_sequence(
            "CF_0 Fn_1 Fn_2 Fn_3 Fe_4 L B_4 Fe_1 Fe_2 Fe_3 B_3 B_2 B_1 Fe_0 B_0", 5)));
}

TEST_CASE("merge: nothing to merge without members carried over an inner activation",
          "[solver][merge]") {
  CHECK(!detail::merge_carried_runs(test::uniform_chain(6)));
  // Carried into the output only: x_L is no inner activation.
  Chain chain = residual_chain();
  chain.stages.resize(2);
  CHECK(chain.carried_bytes() > 0);
  CHECK(!detail::merge_carried_runs(chain));
  // Merging past the chain's time limit: no merged chain, and solve() still answers.
  Chain slow = residual_chain();
  for (Stage& stage : slow.stages) stage.fwd_ms = stage.bwd_ms = kMaxStageMs;
  CHECK(!detail::merge_carried_runs(slow));
  CHECK(solve(slow, SolveOptions(store_all_peak(slow))).ok());
}

TEST_CASE(
    "merge: every nested sequence of the merged chain runs on the chain within its "
    "memory and in its time",
    "[solver][merge]") {
  int chains = 0, sequences = 0, strict = 0;
  for (std::uint64_t seed = 0; seed < 400; ++seed) {
    test::RandomChainSpec spec = test::carried_spec(7);
    spec.restarts = seed % 2 == 0;
    spec.gradient_sizes = seed % 3 == 0;  // the merged stage's gradients of the right sizes
    const Chain chain = test::random_chain(31000 + seed, spec);
    const std::optional<detail::MergedChain> merged = detail::merge_carried_runs(chain);
    if (!merged) continue;
    INFO(chain_to_json(chain));
    REQUIRE(merged->chain.length() < chain.length());
    if (merged->chain.length() > 5) continue;  // what the oracle enumerates quickly
    ++chains;
    for (const Sequence& sequence : test::ExhaustiveOracle(merged->chain).nested_sequences()) {
      check_expansion(chain, *merged, sequence);
      const Sequence expanded = detail::expand_merged(sequence, merged->first);
      if (simulate(chain, expanded).peak_bytes < simulate(merged->chain, sequence).peak_bytes)
        ++strict;
      ++sequences;
    }
  }
  CHECK(chains > 150);
  CHECK(sequences > 3000);
  // Where the block's input is let go early, the chain needs less than the merged chain says.
  CHECK(strict > 0);
}

TEST_CASE(
    "merge: solve() is as fast as the merged chain's solve, fits, and is never faster "
    "than the best nested schedule",
    "[solver][merge]") {
  int budgets = 0, merged_won = 0, below_own_least = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    test::RandomChainSpec spec = test::carried_spec(5);
    const Chain chain = test::random_chain(33000 + seed, spec);
    // solve() merges the chain with x_0's carried members without gradient as context.
    const std::optional<Chain> pinned = detail::pin_input_members(chain);
    const std::optional<detail::MergedChain> merged =
        detail::merge_carried_runs(pinned ? *pinned : chain);
    if (!merged) continue;
    INFO(chain_to_json(chain));
    const test::ExhaustiveOracle oracle(chain);
    std::vector<std::pair<std::int64_t, double>> nested;
    for (const Sequence& sequence : oracle.nested_sequences())
      nested.push_back(oracle.evaluate(sequence));
    // The storage-exact table off: this test is of the merged chain (storage_dp_test.cpp has
    // solve() with it).
    const SolveOptions unmerged = SolveOptions(0).merge_carried_runs(false).exact_storages(false);
    const SolveOptions merging = SolveOptions(0).exact_storages(false);
    const std::int64_t own_least = min_feasible_budget(chain, unmerged);
    const std::int64_t merged_least = min_feasible_budget(merged->chain, merging);
    const std::int64_t least = min_feasible_budget(chain, merging);
    CHECK(least == std::min(own_least, merged_least));
    if (least < own_least) ++below_own_least;
    const std::int64_t top = store_all_peak(chain);
    for (std::int64_t budget = least; budget <= top; ++budget) {
      INFO("budget " << budget);
      const Solution solution = solve(chain, SolveOptions(merging).budget_bytes(budget).threads(1));
      const Solution own = solve(chain, SolveOptions(unmerged).budget_bytes(budget).threads(1));
      const Solution coarse =
          solve(merged->chain, SolveOptions(merging).budget_bytes(budget).threads(1));
      REQUIRE(solution.ok());
      CHECK(solution.min_feasible_budget_bytes == least);
      ++budgets;
      const Simulation sim = simulate(chain, solution.sequence);
      CHECK(sim.peak_bytes <= budget);
      CHECK(sim.peak_bytes == solution.peak_bytes);
      CHECK(same_time(sim.makespan_ms, solution.makespan_ms));
      if (own.ok()) CHECK(solution.makespan_ms <= own.makespan_ms + 1e-9);
      if (coarse.ok()) CHECK(solution.makespan_ms <= coarse.makespan_ms + 1e-9);
      double best = test::ExhaustiveOracle::kInf;
      for (const auto& [peak, time] : nested)
        if (peak <= budget) best = std::min(best, time);
      CHECK(solution.makespan_ms >= best - 1e-9 * std::max(1.0, best));
      if (solution.merged_stages > 0) {
        CHECK(solution.merged_stages == merged->chain.length());
        CHECK((!own.ok() || solution.makespan_ms < own.makespan_ms));
        ++merged_won;
      } else {
        CHECK(solution.sequence == own.sequence);
      }
    }
  }
  CHECK(budgets > 500);
  // The merged chain must win somewhere, and reach below the chain's own least budget, or
  // these chains do not exercise it.
  CHECK(merged_won > 0);
  CHECK(below_own_least > 0);
  WARN("merged runs: " << budgets << " budgets, the merged chain's sequence chosen at "
                       << merged_won << "; a least budget below the chain's own on "
                       << below_own_least << " chains");
}

TEST_CASE("merge: tradeoff's optimal points are solve()'s, merged runs included",
          "[solver][merge][tradeoff]") {
  int merged_points = 0;
  for (std::uint64_t seed = 0; seed < 60; ++seed) {
    test::RandomChainSpec spec = test::carried_spec(6);
    const Chain chain = test::random_chain(35000 + seed, spec);
    if (!detail::merge_carried_runs(chain)) continue;
    INFO(chain_to_json(chain));
    const Tradeoff t = tradeoff(chain, TradeoffOptions().points(9).threads(1));
    CHECK(t.min_feasible_budget_bytes == min_feasible_budget(chain, SolveOptions(0)));
    for (std::size_t k = 0; k < t.budgets.size(); ++k) {
      INFO("budget " << t.budgets[k]);
      const Solution s = solve(chain, SolveOptions(t.budgets[k]).threads(1));
      REQUIRE(t.optimal[k].feasible == s.ok());
      if (!s.ok()) continue;
      CHECK(t.optimal[k].makespan_ms == Approx(s.makespan_ms).epsilon(1e-12));
      CHECK(t.optimal[k].peak_bytes <= t.budgets[k]);
      if (s.merged_stages > 0) ++merged_points;
    }
  }
  CHECK(merged_points > 0);
}

}  // namespace remat

namespace remat {
namespace {

// A random chain without carried members, then a mask (x_0's, without gradient) that the
// first `through` stages carry on, some of them keeping it for their backward.
Chain with_carried_mask(std::uint64_t seed, int through) {
  test::RandomChainSpec spec;
  spec.max_length = 5;
  spec.max_bytes = 12;
  spec.partial_keeps = true;
  Chain chain = test::random_chain(seed, spec);
  through = std::min(through, chain.length());
  const int mask = static_cast<int>(chain.inputs.size());
  chain.inputs.push_back(Member{static_cast<std::int64_t>(3 + seed % 9), false});
  int index = mask;  // the mask's index in x_k
  for (int i = 0; i < through; ++i) {
    Stage& stage = chain.stages[static_cast<std::size_t>(i)];
    if ((seed >> i) % 2 == 0) stage.saved_inputs.push_back(index);
    stage.outputs.push_back(carry(index, 0));
    stage.outputs.back().bytes = chain.inputs.back().bytes;
    stage.outputs.back().grad = false;
    index = static_cast<int>(stage.outputs.size()) - 1;
  }
  chain.validate("with_carried_mask");
  return chain;
}

}  // namespace

TEST_CASE("pin: a mask of x_0 carried on becomes context, every sequence the same",
          "[solver][merge]") {
  int chains = 0;
  for (std::uint64_t seed = 0; seed < 120; ++seed) {
    const Chain chain = with_carried_mask(37000 + seed, 1 + static_cast<int>(seed % 5));
    INFO(chain_to_json(chain));
    const std::optional<Chain> pinned = detail::pin_input_members(chain);
    REQUIRE(pinned);
    ++chains;
    CHECK(pinned->carried_bytes() == 0);
    CHECK(pinned->context_bytes == chain.context_bytes + chain.inputs.back().bytes);
    CHECK(pinned->inputs.size() + 1 == chain.inputs.size());
    CHECK(!detail::pin_input_members(*pinned));
    for (const Sequence& sequence : test::ExhaustiveOracle(chain).nested_sequences()) {
      INFO(collapsed_string(sequence));
      const Simulation a = simulate(chain, sequence), b = simulate(*pinned, sequence);
      CHECK(a.peak_bytes == b.peak_bytes);
      CHECK(a.makespan_ms == b.makespan_ms);
      REQUIRE(a.trace.size() == b.trace.size());
      for (std::size_t k = 0; k < a.trace.size(); ++k) {
        CHECK(a.trace[k].during.total() == b.trace[k].during.total());
        CHECK(a.trace[k].live_after_bytes == b.trace[k].live_after_bytes);
      }
    }
  }
  CHECK(chains == 120);
  // Nothing to move: a member with a gradient, or one no stage carries.
  Chain graded = with_carried_mask(37000, 3);
  graded.inputs.back().grad = true;
  for (Stage& stage : graded.stages)
    for (Member& member : stage.outputs)
      if (member.carried()) member.grad = true;
  graded.validate("graded");
  CHECK(!detail::pin_input_members(graded));
  CHECK(!detail::pin_input_members(residual_chain()));
}

TEST_CASE(
    "pin: with only x_0's mask carried, solve() is the best nested schedule at every "
    "budget, as without carried members",
    "[solver][merge][oracle]") {
  int budgets = 0, below_unpinned_dp = 0;
  for (std::uint64_t seed = 0; seed < 120; ++seed) {
    const Chain chain = with_carried_mask(38000 + seed, 1 + static_cast<int>(seed % 5));
    INFO(chain_to_json(chain));
    const test::ExhaustiveOracle oracle(chain);
    std::vector<std::pair<std::int64_t, double>> nested;
    for (const Sequence& sequence : oracle.nested_sequences())
      nested.push_back(oracle.evaluate(sequence));
    std::int64_t least = nested.front().first;
    for (const auto& entry : nested) least = std::min(least, entry.first);
    CHECK(min_feasible_budget(chain, SolveOptions(0)) == least);
    const std::int64_t top = store_all_peak(chain);
    for (std::int64_t budget = least; budget <= top; ++budget) {
      INFO("budget " << budget);
      double best = test::ExhaustiveOracle::kInf;
      for (const auto& [peak, time] : nested)
        if (peak <= budget) best = std::min(best, time);
      // The dynamic program alone, no search, no merged chain: exact.
      const Solution solution = solve(
          chain,
          SolveOptions(budget).threads(1).search_above_budget(false).merge_carried_runs(false));
      REQUIRE(solution.ok());
      ++budgets;
      CHECK(same_time(solution.makespan_ms, best));
      CHECK(solution.peak_bytes <= budget);
      CHECK(simulate(chain, solution.sequence).peak_bytes == solution.peak_bytes);
      // The same dynamic program on the chain as it is counts the mask in every activation.
      const detail::UnitChain units = detail::make_unit_chain(chain, 1, true);
      const detail::MinMemoryTable min_memory(units, budget);
      if (!detail::fits(units, min_memory, budget)) {
        ++below_unpinned_dp;
        continue;
      }
      const std::int64_t frame = budget - units.context;
      const detail::PersistentTable table(units, min_memory, frame, 1);
      if (table.value(0, chain.length(), frame) > best * (1 + 1e-9)) ++below_unpinned_dp;
    }
  }
  CHECK(budgets > 1000);
  CHECK(below_unpinned_dp > 0);  // the mask counted more than once mattered on these chains
}

}  // namespace remat
