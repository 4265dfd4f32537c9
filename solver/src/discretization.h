#pragma once
// How the optimal solver turns bytes into memory units (docs/algorithms.md).

#include <cstdint>
#include <string>

#include "remat/solver/chain.h"
#include "remat/solver/solver.h"

namespace remat {
namespace detail {

// Whether `options` ask for remat's automatic slots with its own recurrence: the optimal solve
// that is exact in bytes (its units refined down to bytes near the least memory), and the only
// one the refining strategies (strategies.h) apply to.
inline bool automatic_slots(const SolveOptions& options) {
  return options.slots() == 0 && !options.reference_recurrence();
}

// What the optimal solver's tables model besides the chain and the unit (from SolveOptions):
// whether forwards without autograd take their own time, and whether the chain step is checked
// as the published recurrence checks it.
struct UnitModel {
  bool use_nograd_time = true;
  bool published_chain_step = false;
  bool offload = false;
};
inline UnitModel unit_model(const SolveOptions& options) {
  return {options.use_nograd_time(), options.reference_recurrence(), options.offload()};
}

// The slots used for a chain: `requested` if positive, else the automatic choice.
std::int64_t slot_count(const Chain& chain, std::int64_t requested);

// unit = max(1, floor(budget / slots)); capacity = slots units, or the budget in bytes when
// it is smaller than the slot count (then the problem is solved exactly): the reference's
// discretization, for an explicit slot count.
Discretization discretize(std::int64_t budget, std::int64_t slots);

// The same unit, with the capacity floor(budget / unit): all of the budget but less than one
// unit (the automatic slot count; a whole unit count of slots would lose up to `slots` bytes).
Discretization discretize_filled(std::int64_t budget, std::int64_t slots);

// Smallest budget for which the optimal solver with this slot count finds a schedule (with
// automatic slots, whose units are refined down to bytes, store-all's peak also counts); -1
// when no budget is feasible with this slot count (too few slots for the chain's structure).
std::int64_t min_feasible_budget_for_slots(const Chain& chain, const UnitModel& model,
                                           std::int64_t slots, bool automatic);

// The least memory in bytes (the context and x_0 included) in which the chain can be reversed
// under the model: what the optimal solver needs with automatic slots, whose discretization
// is refined, down to exact bytes, for budgets below the discretized minimum.
std::int64_t exact_min_budget(const Chain& chain, const UnitModel& model);

// The finest slot count solve() tries for a budget below the discretized minimum of `slots`
// (automatic slots): up to 16 times as many, within twice the automatic table allowance.
std::int64_t refined_slot_limit(int length, std::int64_t slots);

// How much memory the optimal solver may take (docs/algorithms.md, "Limits"): `bytes`, and
// words for messages saying where the figure comes from.
struct MemoryLimit {
  std::int64_t bytes = 0;
  std::string description;
};
// `requested` bytes if positive (SolveOptions::memory_limit_bytes), else 80% of the memory this
// process may use (available_memory_bytes(): its cgroup's and ulimit's limits included).
MemoryLimit memory_limit(std::int64_t requested);

// Fewest slots automatic coarsening goes down to; below, the solve is refused.
inline constexpr std::int64_t kMinCoarseSlots = 100;

// The memory the optimal solver may allocate for a chain, estimated before allocating: the
// tables that grow with the square of the length (the minimum-memory tables, the persistent
// table's row descriptors, the least-memory search), and the persistent table's values at its
// worst (every row over every memory, a second row for every segment start with two states),
// with the workers' buffers.
class TableMemory {
 public:
  TableMemory(const Chain& chain, int threads, bool offload = false);
  int length() const { return length_; }
  // Bytes of the tables that do not depend on the memory axis.
  double fixed_bytes() const { return fixed_bytes_; }
  // The most the table's rows of `capacity` units can hold (PersistentTable::stored_bytes()).
  double stored_bytes(std::int64_t capacity) const;
  // The whole estimate for a table of `capacity` units: the fixed tables, the rows, and the
  // workers' buffers.
  double bytes(std::int64_t capacity) const;
  // The largest capacity whose estimate is within `limit` bytes; -1 if none.
  std::int64_t largest_capacity(std::int64_t limit) const;

  // Throws std::invalid_argument when the fixed tables alone exceed the limit.
  void check_fixed(const MemoryLimit& limit) const;
  // Throws std::invalid_argument, saying how much it would need, when a table of `capacity`
  // units (with `slots` given by the caller) exceeds the limit.
  void check_given_slots(std::int64_t slots, std::int64_t capacity, const MemoryLimit& limit) const;

 private:
  int length_;
  int threads_;
  double rows_;  // rows of the persistent table: segments (i <= l), per state of their start
  bool two_states_;
  double fixed_bytes_;
};

// Automatic slots (SolveOptions::slots() == 0) limited to the memory limit: `slots` if its
// table fits, else the most slots whose table does (capacities as discretize_filled makes
// them for `budget` when `filled`, else as discretize makes them, at most the slot count),
// with `warning` saying so. Throws std::invalid_argument when fewer than kMinCoarseSlots fit.
std::int64_t slots_within_memory(const TableMemory& memory, const MemoryLimit& limit,
                                 std::int64_t budget, std::int64_t slots, bool filled,
                                 std::string& warning);

// The fewest slots with which some budget is feasible (min_feasible_slots()).
std::int64_t min_slots(const Chain& chain, const UnitModel& model);

}  // namespace detail
}  // namespace remat
