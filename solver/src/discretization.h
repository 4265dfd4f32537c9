#pragma once
// How the optimal solver turns bytes into memory units (docs/algorithms.md).

#include <cstdint>

#include "remat/solver/chain.h"
#include "remat/solver/solver.h"

namespace remat {
namespace detail {

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
// options.slots() == 0, store-all's peak also counts); -1 when no budget is feasible with
// this slot count (too few slots for the chain's structure).
std::int64_t min_feasible_budget_for_slots(const Chain& chain, const SolveOptions& options,
                                           std::int64_t slots);

// The least memory in bytes (the context and x_0 included) in which the chain can be reversed
// under the model: what the optimal solver needs with automatic slots, whose discretization
// is refined, down to exact bytes, for budgets below the discretized minimum.
std::int64_t exact_min_budget(const Chain& chain, const SolveOptions& options);

// The finest slot count solve() tries for a budget below the discretized minimum of `slots`
// (automatic slots): up to 16 times as many, within twice the automatic table allowance.
std::int64_t refined_slot_limit(int length, std::int64_t slots);

// Throws std::invalid_argument when the table for `length` stages and `capacity` units could
// not fit in this machine's memory.
void check_table_fits_in_memory(int length, std::int64_t capacity);

}  // namespace detail
}  // namespace remat
