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
// it is smaller than the slot count (then the problem is solved exactly).
Discretization discretize(std::int64_t budget, std::int64_t slots);

// Smallest budget for which the optimal solver with this slot count finds a schedule (with
// options.slots() == 0, store-all's peak also counts); -1 when no budget is feasible with
// this slot count (too few slots for the chain's structure).
std::int64_t min_feasible_budget_for_slots(const Chain& chain, const SolveOptions& options,
                                           std::int64_t slots);

// Throws std::invalid_argument when the table for `length` stages and `capacity` units could
// not fit in this machine's memory.
void check_table_fits_in_memory(int length, std::int64_t capacity);

}  // namespace detail
}  // namespace remat
