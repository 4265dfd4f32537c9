#pragma once
// The optimal solver as a choice among strategies (docs/architecture.md, "An algorithm").
//
// Each strategy is one way to a sequence within the budget: the persistent table of the
// chain, the same table at larger budgets whose exact peak still fits, the chain with its
// carried runs merged, the storage-exact table. optimal_strategies() lists those that apply
// to a chain and options, in the order solve() runs them; solve() keeps the fastest candidate
// (a tie keeps the earlier), and both solve() and min_feasible_budget() take the least of
// their least budgets, so that the two cannot disagree.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "discretization.h"
#include "merged_chain.h"
#include "persistent_table.h"
#include "remat/solver/chain.h"
#include "remat/solver/sequence.h"
#include "remat/solver/simulator.h"
#include "remat/solver/solver.h"

namespace remat {
namespace detail {

// A sequence a strategy found within the budget, with what Solution reports of how.
struct Candidate {
  SolveStatus status = SolveStatus::kOptimal;  // kFeasible: fits, its time not optimized
  Sequence sequence;
  Simulation simulation;
  Discretization discretization;
  std::int64_t solved_budget_bytes = 0;
  int merged_stages = 0;  // Solution::merged_stages
  std::string warning;
};

// What a strategy's run gives: a candidate where it found one (it may be slower than the best
// so far: solve() compares), and what Solution reports of it whatever solve() keeps.
struct Outcome {
  std::optional<Candidate> candidate;
  bool exact_storages = false;  // Solution::exact_storages: the storage-exact table was solved
  // Where no strategy finds a sequence, the result reports the first strategy's discretization
  // tried and its warning (slots coarsened to fit the memory limit).
  Discretization discretization;
  std::string warning;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  // The least budget at which this strategy finds a sequence: -1 where none does at any budget
  // (too few given slots), INT64_MAX where it has none of its own (it refines another's).
  // After run(), what that run found out, not computed again.
  virtual std::int64_t least_budget() = 0;
  // Its candidate at the options' budget, given the fastest one so far (null where there is
  // none yet). Called at most once, in optimal_strategies()' order, and not at all once the
  // best is store-all's time, which nothing beats.
  virtual Outcome run(const Candidate* best) = 0;
};

// The strategies that apply to `chain` with `options` (algorithm optimal, x_0's members
// already pinned), each as it says itself (its `applies`): the persistent table always, the
// others with automatic slots (automatic_slots(options)) where their option is on and the
// chain has what they need. The strategies refer to `chain` and `options`, which must outlive
// them.
std::vector<std::unique_ptr<Strategy>> optimal_strategies(const Chain& chain,
                                                          const SolveOptions& options);

// Pieces tradeoff() shares with the strategies.

// The largest budget SolveOptions::search_above_budget tries above `budget`: the budget plus
// twice the carried bytes, or the store-all peak `store_all_bytes` where that is smaller;
// `budget` itself where there is nothing to search (no carried members, or a budget at or
// above store-all, where the sum could overflow: the budget may be int64's largest).
std::int64_t search_ceiling(const Chain& chain, std::int64_t budget, std::int64_t store_all_bytes);

// SolveOptions::search_above_budget on a chain with carried members, for solve() and
// tradeoff() (solve.cpp says why it works): a bisection on budgets above `budget`, up to
// search_ceiling, to 1/1024 of the budget, over `sequence_at(bytes)` (empty where there is none),
// while the best is slower than store-all. Calls `improve(bytes, sequence, simulation)` for each
// sequence whose exact peak fits `budget` and that is faster than the best so far, starting from
// `best_ms`. Does nothing without carried members, or when the range is within the tolerance (then
// `sequence_at` is never called).
void search_above_budget(const Chain& chain, std::int64_t budget, std::int64_t store_all_bytes,
                         double best_ms, const TimeModel& time,
                         const std::function<Sequence(std::int64_t)>& sequence_at,
                         const std::function<void(std::int64_t, Sequence, Simulation)>& improve);

// solve() of the merged chain at the options' budget and, where it finds a sequence, that
// sequence expanded and simulated on the chain (its peak and time checked against the merged
// chain's: never above, the same).
struct MergedCandidate {
  Solution solution;
  Sequence sequence;
  Simulation simulation;
};
MergedCandidate merged_candidate(const Chain& chain, const MergedChain& merged,
                                 const SolveOptions& options);
// Whether a candidate's time beats the current result's by more than rounding: a tie keeps the
// current one.
bool faster(double candidate_ms, double current_ms);

}  // namespace detail
}  // namespace remat
