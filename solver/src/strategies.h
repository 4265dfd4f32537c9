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
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "discretization.h"
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
// already pinned): the persistent table always, the others with automatic slots
// (options.slots() == 0, remat's recurrence) where their option is on and the chain has what
// they need. The strategies refer to `chain` and `options`, which must outlive them.
std::vector<std::unique_ptr<Strategy>> optimal_strategies(const Chain& chain,
                                                          const SolveOptions& options);

}  // namespace detail
}  // namespace remat
