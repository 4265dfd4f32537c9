#include "discretization.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "min_memory_table.h"
#include "persistent_table.h"
#include "remat/base/check.h"
#include "remat/base/units.h"
#include "unit_chain.h"

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

// Bytes the optimal solver holds for every pair (i, l) of stages (the tables are square),
// whatever the slots. At most 88 at any one time: the minimum-memory table a solve keeps (16:
// fresh and taped, 8 bytes each) with the persistent table's row descriptors (64: 32 bytes,
// fresh and taped) and, in tradeoff(), revolve's counts (8); or, near the least memory, two
// minimum-memory tables (32), the least-memory search (24) and revolve's counts (8); or a
// minimum-memory table being built (40 with the copy it keeps). Counted as 120, for margin.
constexpr int kFixedBytesPerPair = 120;

// An estimate in messages, "up to 2.00 GiB" (it can exceed int64).
std::string up_to(double bytes) {
  if (bytes >= 0x1p62) return "more than 4096 PiB";
  return "up to " + format_bytes(static_cast<std::int64_t>(bytes));
}

// The largest size of the chain: from this unit on, every size is 0 or 1 unit.
std::int64_t largest_size(const Chain& chain) {
  std::int64_t largest =
      std::max<std::int64_t>({1, chain.input_bytes(), chain.loss_tmp_bytes, chain.context_bytes});
  for (const Stage& stage : chain.stages)
    largest = std::max({largest, stage.out_bytes(), stage.kept_bytes(), stage.fwd_tmp_bytes,
                        stage.nograd_tmp_bytes(), stage.bwd_tmp_bytes});
  return largest;
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

MemoryLimit memory_limit(std::int64_t requested) {
  MemoryLimit out;
  if (requested > 0) {
    out.bytes = requested;
    out.description = str_cat("the memory limit of ", format_bytes(requested));
    return out;
  }
  const std::int64_t available = available_memory_bytes();
  if (available > 0) {
    out.bytes = static_cast<std::int64_t>(0.8 * static_cast<double>(available));
    out.description = str_cat(format_bytes(out.bytes), ", 80% of the memory this process may use (",
                              format_bytes(available), ")");
  } else {
    out.bytes = std::int64_t{8} << 30;
    out.description = "8.00 GiB (this machine's memory is unknown)";
  }
  return out;
}

TableMemory::TableMemory(const Chain& chain, int threads, bool offload)
    : length_(chain.length()), threads_(threads), rows_(0), two_states_(false) {
  // Two states where the sizes differ in bytes: in units they can only coincide. (A chain
  // has at most kMaxStages stages: every figure here is far below 2^62.)
  const UnitChain exact = make_unit_chain(chain, 1, true, false, offload);
  for (int i = 0; i <= length_; ++i) {
    const bool two = exact.two_states(i);
    two_states_ = two_states_ || two;
    rows_ += (length_ + 1.0 - i) * (two ? 2.0 : 1.0);
  }
  const double pairs = (length_ + 1.0) * (length_ + 1.0);
  fixed_bytes_ = pairs * kFixedBytesPerPair;
}

double TableMemory::stored_bytes(std::int64_t capacity) const {
  const std::int64_t width = std::min(capacity, std::int64_t{1} << 62) + 1;
  const double row_bytes = static_cast<double>(width) * sizeof(double);
  const PersistentTable::Plan plan = PersistentTable::plan(length_, width, threads_);
  const double values = rows_ * row_bytes;
  // The arenas' unused memory: the end of each worker's last block (at most what it stored
  // before it, or a block of 32 MiB; at least the first block, 4 KiB), and less than a row at
  // the end of every earlier block (13 doubling ones, then one per 32 MiB) when rows are
  // smaller than blocks (larger rows get blocks of their own size).
  const double block_bytes = static_cast<double>(PersistentTable::kArenaBlockBytes);
  const double arena_slack =
      std::min(values, plan.workers * block_bytes) + plan.workers * 4096.0 +
      (row_bytes < block_bytes ? (values / block_bytes + 13.0 * plan.workers) * row_bytes : 0.0);
  return values + arena_slack;
}

double TableMemory::bytes(std::int64_t capacity) const {
  const std::int64_t width = std::min(capacity, std::int64_t{1} << 62) + 1;
  const double row_bytes = static_cast<double>(width) * sizeof(double);
  const PersistentTable::Plan plan = PersistentTable::plan(length_, width, threads_);
  const double states = two_states_ ? 2.0 : 1.0;
  // Per worker: the rows being computed and the prefix sums and forward memories of a block.
  const double per_worker =
      states * plan.block * plan.tile * row_bytes + plan.block * (length_ + 2.0) * 16.0;
  return fixed_bytes_ + stored_bytes(capacity) + plan.workers * per_worker;
}

std::int64_t TableMemory::largest_capacity(std::int64_t limit) const {
  const double most = static_cast<double>(limit);
  if (bytes(0) > most) return -1;
  // bytes() grows with the capacity but for the workers' buffers, which the plan keeps near
  // 4 MiB: the bisection returns a capacity that fits, the largest or close to it.
  std::int64_t lo = 0, hi = std::int64_t{1} << 62;
  if (bytes(hi) <= most) return hi;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (bytes(mid) <= most ? lo : hi) = mid;
  }
  return lo;
}

void TableMemory::check_fixed(const MemoryLimit& limit) const {
  REMAT_CHECK(fixed_bytes_ <= static_cast<double>(limit.bytes), "the optimal solver's tables for ",
              length_, " stages need at least ",
              format_bytes(static_cast<std::int64_t>(fixed_bytes_)), " (", kFixedBytesPerPair,
              " bytes for every pair of stages, before any memory slot), more than ",
              limit.description,
              ": group layers into fewer stages, or use a heuristic (periodic or revolve)");
}

void TableMemory::check_given_slots(std::int64_t slots, std::int64_t capacity,
                                    const MemoryLimit& limit) const {
  const double needed = bytes(capacity);
  if (needed <= static_cast<double>(limit.bytes)) return;
  const std::int64_t fitting = largest_capacity(limit.bytes);
  REMAT_CHECK(false, "the optimal solver's table for ", length_, " stages and ", slots,
              " memory slots may need ", up_to(needed), ", more than ", limit.description,
              fitting >= 1 ? str_cat(": use at most ", fitting, " slots")
                           : std::string(": use fewer stages or a heuristic"));
}

std::int64_t slots_within_memory(const TableMemory& memory, const MemoryLimit& limit,
                                 std::int64_t budget, std::int64_t slots, bool filled,
                                 std::string& warning) {
  const auto capacity_of = [&](std::int64_t count) {
    return (filled ? discretize_filled(budget, count) : discretize(budget, count)).capacity_units;
  };
  const auto fits = [&](std::int64_t count) {
    return memory.bytes(capacity_of(count)) <= static_cast<double>(limit.bytes);
  };
  if (fits(slots)) return slots;
  // The capacity grows with the slot count: bisect for the most slots that fit.
  std::int64_t lo = 0, hi = slots;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  REMAT_CHECK(lo >= kMinCoarseSlots, "the optimal solver's table for ", memory.length(),
              " stages with the automatic ", slots, " memory slots may need ",
              up_to(memory.bytes(capacity_of(slots))), ", more than ", limit.description, "; only ",
              lo, " slots would fit, fewer than ", kMinCoarseSlots,
              " (too coarse to be worth solving): give the slots explicitly, group layers into "
              "fewer stages, or use a heuristic (periodic or revolve)");
  warning =
      str_cat("the table was coarsened to ", lo, " memory slots (the automatic choice was ", slots,
              ") to fit in ", limit.description, "; finer units might give a faster schedule");
  return lo;
}

std::int64_t min_slots(const Chain& chain, const UnitModel& model) {
  // With a unit of the largest size every size that is not zero is one unit: the least the
  // chain can take in units, whatever the budget.
  const UnitChain units = make_unit_chain(chain, largest_size(chain), model.use_nograd_time,
                                          model.published_chain_step, model.offload);
  const MinMemoryTable table(units);
  return units.context + std::max<std::int64_t>(units.x[0] + 1, table.at(0, units.length));
}

std::int64_t refined_slot_limit(int length, std::int64_t slots) {
  std::int64_t limit = slots;
  while (limit < 16 * slots &&
         table_bytes(length, static_cast<double>(2 * limit)) <= 2 * kTableAllowanceBytes)
    limit *= 2;
  return limit;
}

std::int64_t exact_min_budget(const Chain& chain, const UnitModel& model) {
  const UnitChain exact =
      make_unit_chain(chain, 1, model.use_nograd_time, model.published_chain_step, model.offload);
  const MinMemoryTable table(exact);
  return exact.context + std::max<std::int64_t>(exact.x[0] + 1, table.at(0, exact.length));
}

std::int64_t min_feasible_budget_for_slots(const Chain& chain, const UnitModel& model,
                                           std::int64_t slots, bool automatic) {
  const bool nograd = model.use_nograd_time;
  const bool published = model.published_chain_step;
  const std::int64_t exact_min = exact_min_budget(chain, model);
  // Automatic slots: below the discretized minimum solve() refines the units, down to the
  // least-memory sequence in exact bytes; store-all's peak is never below it.
  if (automatic) return std::min(exact_min, store_all_peak(chain));
  // Below `slots` bytes the problem is solved in exact bytes.
  if (exact_min < slots) return exact_min;
  // From `slots` bytes on, feasibility depends on the unit u = floor(budget / slots) alone
  // and only improves as u grows (every size rounds to fewer units): search the least u.
  auto feasible = [&](std::int64_t unit) {
    const UnitChain units = make_unit_chain(chain, unit, nograd, published, model.offload);
    return fits(units, MinMemoryTable(units, slots), slots);
  };
  const std::int64_t largest = largest_size(chain);
  // The budget of a unit: unit * slots, -1 (none) beyond int64.
  const auto budget_of = [slots](std::int64_t unit) {
    return unit > std::numeric_limits<std::int64_t>::max() / slots ? std::int64_t{-1}
                                                                   : unit * slots;
  };
  // No unit below exact_min / slots can work; from `largest` on every size is 0 or 1 unit.
  std::int64_t lo = std::max<std::int64_t>(1, exact_min / slots);
  if (feasible(lo)) return budget_of(lo);
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
  return budget_of(hi);
}

}  // namespace detail
}  // namespace remat
