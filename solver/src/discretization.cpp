#include "discretization.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "detail.h"
#include "remat/solver/check.h"
#include "remat/solver/units.h"

namespace remat {
namespace detail {
namespace {

// Automatic slot count: the finest discretization whose table stays within a time and a
// memory allowance. Work grows as L^3 / 6 * slots and the dense table as L^2 / 2 * slots * 8
// bytes; the constants are set from bench/solver_bench (docs/performance.md) so that
// L = 300 solves in about 0.1 s and no automatic table exceeds 512 MiB, and never fewer than
// 500 slots (the reference's usual setting).
constexpr double kWorkAllowance = 1.5e9;  // slot-segment-choice evaluations
constexpr double kTableAllowanceBytes = 512.0 * 1024 * 1024;
constexpr std::int64_t kMinAutoSlots = 500;
constexpr std::int64_t kMaxAutoSlots = 1 << 16;

double table_bytes(int length, double capacity) {
  const double pairs = (length + 1.0) * (length + 2.0) / 2.0;
  return pairs * (capacity + 1.0) * sizeof(double);
}

}  // namespace

std::int64_t slot_count(const Chain& chain, std::int64_t requested) {
  if (requested > 0) return requested;
  const double length = chain.length();
  const double by_time = kWorkAllowance * 6.0 / (length * length * length);
  const double by_memory = kTableAllowanceBytes / table_bytes(chain.length(), 0);
  const double slots = std::min({by_time, by_memory, static_cast<double>(kMaxAutoSlots)});
  return std::max(kMinAutoSlots, static_cast<std::int64_t>(slots));
}

Discretization discretize(std::int64_t budget, std::int64_t slots) {
  Discretization out;
  if (budget < slots) {
    out.unit_bytes = 1;
    out.capacity_units = budget;
  } else {
    out.unit_bytes = budget / slots;
    out.capacity_units = slots;
  }
  return out;
}

Discretization discretize_filled(std::int64_t budget, std::int64_t slots) {
  Discretization out = discretize(budget, slots);
  out.capacity_units = budget / out.unit_bytes;
  return out;
}

void check_table_fits_in_memory(int length, std::int64_t capacity) {
  const double pages = static_cast<double>(sysconf(_SC_PHYS_PAGES));
  const double page_size = static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const double physical = pages > 0 && page_size > 0 ? pages * page_size : 8e9;
  const double needed = table_bytes(length, static_cast<double>(capacity));
  REMAT_CHECK(needed <= 0.8 * physical, "the dynamic program for ", length, " stages and ",
              capacity, " memory slots may need up to ",
              format_bytes(static_cast<std::int64_t>(needed)), ", more than this machine has (",
              format_bytes(static_cast<std::int64_t>(physical)), "): use fewer slots");
}

std::int64_t refined_slot_limit(int length, std::int64_t slots) {
  std::int64_t limit = slots;
  while (limit < 16 * slots &&
         table_bytes(length, static_cast<double>(2 * limit)) <= 2 * kTableAllowanceBytes)
    limit *= 2;
  return limit;
}

std::int64_t exact_min_budget(const Chain& chain, const SolveOptions& options) {
  const UnitChain exact =
      make_unit_chain(chain, 1, options.use_nograd_time(), options.reference_recurrence());
  const MinMemoryTable table(exact);
  return exact.context + std::max<std::int64_t>(exact.x[0] + 1, table.at(0, exact.length));
}

std::int64_t min_feasible_budget_for_slots(const Chain& chain, const SolveOptions& options,
                                           std::int64_t slots) {
  const bool nograd = options.use_nograd_time();
  const bool published = options.reference_recurrence();
  const std::int64_t exact_min = exact_min_budget(chain, options);
  // Automatic slots: below the discretized minimum solve() refines the units, down to the
  // least-memory sequence in exact bytes; store-all's peak is never below it.
  if (options.slots() == 0 && !published) return std::min(exact_min, store_all_peak(chain));
  // Below `slots` bytes the problem is solved in exact bytes.
  if (exact_min < slots) return exact_min;
  // From `slots` bytes on, feasibility depends on the unit u = floor(budget / slots) alone
  // and only improves as u grows (every size rounds to fewer units): search the least u.
  auto feasible = [&](std::int64_t unit) {
    const UnitChain units = make_unit_chain(chain, unit, nograd, published);
    return fits(units, MinMemoryTable(units, slots), slots);
  };
  std::int64_t largest =
      std::max<std::int64_t>({1, chain.input_bytes(), chain.loss_tmp_bytes, chain.context_bytes});
  for (const Stage& stage : chain.stages)
    largest = std::max({largest, stage.out_bytes(), stage.kept_bytes(), stage.fwd_tmp_bytes,
                        stage.nograd_tmp_bytes(), stage.bwd_tmp_bytes});
  // No unit below exact_min / slots can work; from `largest` on every size is 0 or 1 unit.
  std::int64_t lo = std::max<std::int64_t>(1, exact_min / slots);
  if (feasible(lo)) return lo * slots;
  if (!feasible(largest)) return -1;
  // Gallop up from lo, then bisect: feasible(hi), !feasible(lo).
  std::int64_t step = std::max<std::int64_t>(1, lo / 64);
  std::int64_t hi = std::min(largest, lo + step);
  while (!feasible(hi)) {
    lo = hi;
    step *= 2;
    hi = std::min(largest, lo + step);
  }
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (feasible(mid) ? hi : lo) = mid;
  }
  return hi * slots;
}

}  // namespace detail
}  // namespace remat
