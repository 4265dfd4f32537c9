// The optimal solver's strategies (strategies.h), and the pieces tradeoff() shares with them.
#include "strategies.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "discretization.h"
#include "heuristics.h"
#include "host_table.h"
#include "merged_chain.h"
#include "min_memory_table.h"
#include "persistent_table.h"
#include "remat/base/check.h"
#include "remat/base/units.h"
#include "storage_dp.h"
#include "unit_chain.h"

namespace remat {
namespace detail {
namespace {

constexpr std::int64_t kNoLeastBudget = std::numeric_limits<std::int64_t>::max();

Candidate candidate_of(Sequence sequence, Simulation simulation, Discretization discretization,
                       std::int64_t solved_budget_bytes,
                       SolveStatus status = SolveStatus::kOptimal) {
  Candidate out;
  out.status = status;
  out.sequence = std::move(sequence);
  out.simulation = std::move(simulation);
  out.discretization = discretization;
  out.solved_budget_bytes = solved_budget_bytes;
  return out;
}

std::string joined(const std::string& first, const std::string& second) {
  return first.empty() ? second : first + "; " + second;
}

// The persistent table of the chain (persistent_dp.cpp) at the budget, in the discretization
// the options ask for: automatic slots (filled, refined where rounding puts a budget the chain
// fits in exact bytes out of reach), or the reference's.
class PersistentTableStrategy final : public Strategy {
 public:
  PersistentTableStrategy(const Chain& chain, const SolveOptions& options)
      : chain_(chain),
        options_(options),
        automatic_(automatic_slots(options)),
        limit_(memory_limit(options.memory_limit_bytes())),
        memory_(chain, options.threads(), options.offload()) {
    // The memory the solve will need is estimated before anything is allocated.
    memory_.check_fixed(limit_);
  }

  std::int64_t least_budget() override {
    if (!least_) {
      // Automatic slots give the least memory in bytes, whatever their number; the
      // reference's discretization depends on it.
      std::string ignored;
      least_ = min_feasible_budget_for_slots(
          chain_, unit_model(options_),
          automatic_ ? slot_count(chain_, 0) : reference_slots(ignored), automatic_);
      if (options_.host_memory_bytes() >= 0 && *least_ >= 0)
        least_ = std::max(*least_, least_budget_under_host_bound());
    }
    return *least_;
  }

  Outcome run(const Candidate*) override {
    const std::int64_t budget = options_.budget_bytes();
    Outcome out;
    std::int64_t slots = 0;
    if (automatic_) {
      slots = slot_count(chain_, 0);
      // A budget that holds every activation gets store-all, which no schedule beats (every
      // stage runs Fe and B once); the discretized table could miss it by rounding. It needs
      // no table; below it, a table that cannot fit is refused before the least budget is
      // searched for.
      if (budget >= store_all_peak(chain_)) {
        least_budget();
        Sequence sequence = store_all_sequence(chain_.length());
        Simulation sim = simulate(chain_, sequence, TimeModel{options_.use_nograd_time()});
        out.candidate = candidate_of(std::move(sequence), std::move(sim),
                                     discretize_filled(budget, slots), budget);
        return out;
      }
      slots = slots_within_memory(memory_, limit_, budget, slots, true, out.warning);
    } else {
      slots = reference_slots(out.warning);
      if (options_.slots() > 0)  // given slots whose table would not fit are refused
        memory_.check_given_slots(
            slots, discretize(std::max<std::int64_t>(budget, 0), slots).capacity_units, limit_);
    }
    least_budget();
    out.discretization = automatic_ ? discretize_filled(budget, slots) : discretize(budget, slots);
    Discretization disc = out.discretization;
    auto units = std::make_unique<UnitChain>(
        make_unit_chain(chain_, disc.unit_bytes, options_.use_nograd_time(),
                        options_.reference_recurrence(), options_.offload()));
    auto min_memory = std::make_unique<MinMemoryTable>(*units, disc.capacity_units);
    if (!fits(*units, *min_memory, disc.capacity_units)) {
      if (!automatic_ || budget < *least_) return out;
      // Rounding sizes up to whole units put the budget out of reach, although the chain fits
      // it in exact bytes: finer units, as far as the table's allowance goes.
      bool found = false;
      std::int64_t tried = slots;  // the finest slot count tried
      const std::int64_t finest = refined_slot_limit(chain_.length(), slots);
      for (std::int64_t finer = 2 * slots; !found && finer <= finest && disc.unit_bytes > 1;
           finer *= 2) {
        const Discretization candidate = discretize_filled(budget, finer);
        if (memory_.bytes(candidate.capacity_units) > static_cast<double>(limit_.bytes)) break;
        disc = candidate;
        tried = finer;
        units = std::make_unique<UnitChain>(
            make_unit_chain(chain_, disc.unit_bytes, options_.use_nograd_time(), false,
                            options_.offload()));
        min_memory = std::make_unique<MinMemoryTable>(*units, disc.capacity_units);
        found = fits(*units, *min_memory, disc.capacity_units);
      }
      if (!found) {
        out.candidate = least_memory_candidate(tried, out.warning);
        return out;
      }
    }
    const std::int64_t available = disc.capacity_units - units->context;
    const PersistentTable table(*units, *min_memory, available, options_.threads());
    Sequence sequence = table.rebuild(available);
    Simulation sim = simulate(chain_, sequence, TimeModel{options_.use_nograd_time()});
    const double predicted = table.value(0, chain_.length(), available);
    REMAT_INTERNAL_ASSERT(std::fabs(sim.makespan_ms - predicted) <= 1e-9 * std::max(1.0, predicted),
                          "simulated makespan ", sim.makespan_ms, " differs from the table's ",
                          predicted);
    std::string warning = out.warning;
    if (options_.reference_recurrence()) {
      if (sim.peak_bytes > budget)
        warning = str_cat("the reference recurrence's sequence peaks at ", sim.peak_bytes,
                          " bytes, ", sim.peak_bytes - budget,
                          " above the budget (its chain step counts y_{i+1} where "
                          "y_{l+1} is live; see docs/algorithms.md)");
    } else {
      REMAT_INTERNAL_ASSERT(sim.peak_bytes <= budget, "simulated peak ", sim.peak_bytes,
                            " exceeds the budget ", budget);
    }
    if (options_.host_memory_bytes() >= 0 && sim.host_peak_bytes > options_.host_memory_bytes()) {
      // An optimum that offloads less, where one ties: within the bound, it is the optimum
      // under it too. Else the table under the bound.
      Sequence fewer = table.rebuild(available, true);
      Simulation fewer_sim = simulate(chain_, fewer, TimeModel{options_.use_nograd_time()});
      if (fewer_sim.host_peak_bytes > options_.host_memory_bytes()) {
        out.candidate = host_bounded_candidate(*units, disc, available, warning);
        return out;
      }
      REMAT_INTERNAL_ASSERT(
          fewer_sim.makespan_ms == sim.makespan_ms && fewer_sim.peak_bytes <= budget,
          "the optimum with the fewest copies takes ", fewer_sim.makespan_ms, " ms and peaks at ",
          fewer_sim.peak_bytes, " bytes, not ", sim.makespan_ms, " ms within ", budget);
      sequence = std::move(fewer);
      sim = std::move(fewer_sim);
    }
    out.candidate = candidate_of(std::move(sequence), std::move(sim), disc, budget);
    out.candidate->warning = std::move(warning);
    return out;
  }

 private:
  // The slots of the reference's discretization (given slots, or automatic ones with the
  // published recurrence), within the memory limit: automatic slots are coarsened
  // (capacities at most the slot count, whatever the budget), with `warning` saying so.
  std::int64_t reference_slots(std::string& warning) const {
    const std::int64_t slots = slot_count(chain_, options_.slots());
    if (options_.slots() > 0) return slots;
    return slots_within_memory(memory_, limit_, std::numeric_limits<std::int64_t>::max(), slots,
                               false, warning);
  }

  // The table under the bound on host memory (host_table.h), in the device units of the
  // table without it: its sequence, or none where nothing fits both bounds in these units. The
  // host units are coarsened where the table would pass the memory limit.
  std::optional<Candidate> host_bounded_candidate(const UnitChain& units,
                                                  const Discretization& disc,
                                                  std::int64_t available,
                                                  std::string warning) const {
    const std::int64_t bound = options_.host_memory_bytes();
    const int length = chain_.length();
    for (std::int64_t slots = options_.host_slots();; slots /= 2) {
      const HostUnits host = host_units(chain_, bound, slots);
      const HostLevels levels(units, host);
      const HostMinMemory least(units, levels);
      if (least.at(0, length, false, host.capacity) > available) return std::nullopt;
      const double needed = HostBoundedTable::bytes_needed(units, levels, least, available);
      if (needed > static_cast<double>(limit_.bytes)) {
        REMAT_CHECK(slots > 1, "the optimal solver's table under the host memory bound for ",
                    length, " stages and ", disc.capacity_units, " memory slots may need ",
                    format_bytes(static_cast<std::int64_t>(needed)),
                    " even with one host unit, more than ", limit_.description,
                    ": use fewer memory slots or stages");
        continue;
      }
      if (slots < options_.host_slots())
        warning = joined(warning, str_cat("the host memory bound divided into ", slots,
                                          " units instead of ", options_.host_slots(),
                                          " for its table to fit in ", limit_.description));
      const HostBoundedTable table(units, levels, least, available, options_.threads());
      Sequence sequence = table.rebuild(available);
      Simulation sim = simulate(chain_, sequence, TimeModel{options_.use_nograd_time()});
      const double predicted = table.value(0, length, available, false, host.capacity);
      REMAT_INTERNAL_ASSERT(
          std::fabs(sim.makespan_ms - predicted) <= 1e-9 * std::max(1.0, predicted),
          "simulated makespan ", sim.makespan_ms, " differs from the host-bounded table's ",
          predicted);
      REMAT_INTERNAL_ASSERT(sim.peak_bytes <= options_.budget_bytes(), "simulated peak ",
                            sim.peak_bytes, " exceeds the budget ", options_.budget_bytes());
      REMAT_INTERNAL_ASSERT(sim.host_peak_bytes <= bound, "simulated host peak ",
                            sim.host_peak_bytes, " exceeds the host memory bound ", bound);
      Candidate out =
          candidate_of(std::move(sequence), std::move(sim), disc, options_.budget_bytes());
      out.warning = std::move(warning);
      return out;
    }
  }

  // The least budget under the bound on host memory, in exact bytes (in the host units the
  // solve uses): the least-memory sequence's where it holds no more than the bound on the host.
  std::int64_t least_budget_under_host_bound() const {
    const UnitChain exact = make_unit_chain(chain_, 1, options_.use_nograd_time(), false, true);
    const Simulation unbounded =
        simulate(chain_, MinMemoryTable(exact).least_memory_sequence(exact));
    if (unbounded.host_peak_bytes <= options_.host_memory_bytes()) return 0;
    const HostUnits host = host_units(chain_, options_.host_memory_bytes(), options_.host_slots());
    const HostLevels levels(exact, host);
    const std::int64_t least =
        exact.context +
        std::max<std::int64_t>(
            exact.x[0] + 1, HostMinMemory(exact, levels).at(0, exact.length, false, host.capacity));
    return automatic_ ? std::min(least, store_all_peak(chain_)) : least;
  }

  // A budget so close to the least memory the chain can run in that no discretization the
  // table allows reaches it: the sequence that needs the least memory (exact bytes), or the
  // fastest heuristic sequence that fits, if one does. Feasible; its time is not optimized.
  Candidate least_memory_candidate(std::int64_t slots_tried, const std::string& warning) const {
    const TimeModel time{options_.use_nograd_time()};
    const std::int64_t budget = options_.budget_bytes();
    const int length = chain_.length();
    const UnitChain exact =
        make_unit_chain(chain_, 1, options_.use_nograd_time(), false, options_.offload());
    Sequence best = MinMemoryTable(exact).least_memory_sequence(exact);
    Simulation best_sim = simulate(chain_, best, time);
    REMAT_INTERNAL_ASSERT(best_sim.peak_bytes <= budget, "the least-memory sequence peaks at ",
                          best_sim.peak_bytes, " bytes, above the budget ", budget);
    const auto consider = [&](Sequence candidate) {
      Simulation sim = simulate(chain_, candidate, time);
      if (sim.peak_bytes <= budget && sim.makespan_ms < best_sim.makespan_ms) {
        best = std::move(candidate);
        best_sim = std::move(sim);
      }
    };
    for (int segments = 1; segments <= length; ++segments)
      consider(periodic_sequence(length, segments));
    const RevolvePlanner planner(length, length);
    for (int snapshots = 1; snapshots <= length; ++snapshots) consider(planner.sequence(snapshots));
    Candidate out = candidate_of(std::move(best), std::move(best_sim), Discretization{1, budget},
                                 budget, SolveStatus::kFeasible);
    out.warning = joined(
        warning,
        str_cat("the budget is within the rounding of ", slots_tried,
                " memory slots of the least memory the chain can run in (", *least_,
                " bytes): the sequence is the least-memory one or the fastest heuristic that "
                "fits, not the optimum; a slightly larger budget lets the dynamic program "
                "choose"));
    return out;
  }

  const Chain& chain_;
  const SolveOptions& options_;
  const bool automatic_;
  const MemoryLimit limit_;
  const TableMemory memory_;
  std::optional<std::int64_t> least_;
};

// SolveOptions::search_above_budget after a sequence that fits (search_above_budget): one
// persistent table, built for the largest budget the search may try at its first probe,
// answers every probe (its top row holds the optimum for every capacity), with its unit: a
// rebuild and a simulation per probe. It starts from a sequence that fits: it has no least
// budget of its own.
class SearchAboveBudgetStrategy final : public Strategy {
 public:
  SearchAboveBudgetStrategy(const Chain& chain, const SolveOptions& options)
      : chain_(chain), options_(options) {}

  // With automatic slots, where its option is on and the chain carries a member (which the
  // dynamic program counts more than once: larger capacities may still fit exactly).
  static bool applies(const Chain& chain, const SolveOptions& options) {
    return automatic_slots(options) && options.search_above_budget() && chain.carried_bytes() > 0;
  }

  std::int64_t least_budget() override { return kNoLeastBudget; }

  Outcome run(const Candidate* best) override {
    Outcome out;
    if (best == nullptr) return out;
    const std::int64_t budget = options_.budget_bytes();
    const std::int64_t store_all = store_all_peak(chain_);
    const std::int64_t largest = search_ceiling(chain_, budget, store_all);
    if (largest <= budget) return out;
    std::string coarsened;
    Discretization disc;
    std::unique_ptr<UnitChain> units;
    std::unique_ptr<MinMemoryTable> min_memory;
    std::unique_ptr<PersistentTable> table;
    bool built = false;
    const auto sequence_at = [&](std::int64_t bytes) {
      if (!built) {
        built = true;
        const MemoryLimit limit = memory_limit(options_.memory_limit_bytes());
        const TableMemory memory(chain_, options_.threads(), options_.offload());
        const std::int64_t slots =
            slots_within_memory(memory, limit, largest, slot_count(chain_, 0), true, coarsened);
        disc = discretize_filled(largest, slots);
        units = std::make_unique<UnitChain>(
            make_unit_chain(chain_, disc.unit_bytes, options_.use_nograd_time(), false,
                            options_.offload()));
        min_memory = std::make_unique<MinMemoryTable>(*units, disc.capacity_units);
        if (fits(*units, *min_memory, disc.capacity_units))
          table = std::make_unique<PersistentTable>(
              *units, *min_memory, disc.capacity_units - units->context, options_.threads());
      }
      return table ? table_sequence(*table, *units, disc, bytes) : Sequence{};
    };
    search_above_budget(
        chain_, budget, store_all, best->simulation.makespan_ms,
        TimeModel{options_.use_nograd_time()}, sequence_at,
        [&](std::int64_t bytes, Sequence sequence, Simulation sim) {
          const std::int64_t units_used = std::min(disc.capacity_units, bytes / disc.unit_bytes);
          out.candidate = candidate_of(std::move(sequence), std::move(sim),
                                       Discretization{disc.unit_bytes, units_used}, bytes);
          out.candidate->warning = coarsened;
        });
    return out;
  }

 private:
  const Chain& chain_;
  const SolveOptions& options_;
};

// SolveOptions::merge_carried_runs: the merged chain's sequence, expanded (merge.cpp).
class MergedRunsStrategy final : public Strategy {
 public:
  MergedRunsStrategy(const Chain& chain, const SolveOptions& options, MergedChain merged)
      : chain_(chain), options_(options), merged_(std::move(merged)) {}

  // With automatic slots, where its option is on and the chain has runs of stages carrying a
  // member to merge (docs/algorithms.md, "Carried members"): the strategy, else null.
  static std::unique_ptr<Strategy> where_it_applies(const Chain& chain,
                                                    const SolveOptions& options) {
    if (!automatic_slots(options) || !options.merge_carried_runs() || chain.carried_bytes() == 0)
      return nullptr;
    std::optional<MergedChain> merged = merge_carried_runs(chain);
    if (!merged) return nullptr;
    return std::make_unique<MergedRunsStrategy>(chain, options, std::move(*merged));
  }

  std::int64_t least_budget() override {
    if (!least_) least_ = min_feasible_budget(merged_.chain, options_);
    return *least_;
  }

  Outcome run(const Candidate*) override {
    MergedCandidate merged = merged_candidate(chain_, merged_, options_);
    least_ = merged.solution.min_feasible_budget_bytes;
    Outcome out;
    if (!merged.solution.ok()) return out;
    const Solution& solution = merged.solution;
    out.candidate =
        candidate_of(std::move(merged.sequence), std::move(merged.simulation),
                     solution.discretization, solution.solved_budget_bytes, solution.status);
    out.candidate->merged_stages = merged_.chain.length();
    out.candidate->warning = solution.warning;
    return out;
  }

 private:
  const Chain& chain_;
  const SolveOptions& options_;
  const MergedChain merged_;
  std::optional<std::int64_t> least_;
};

// SolveOptions::exact_storages: the storage-exact table's sequence (storage_dp.cpp), or, where
// nothing else fits, its least-memory sequence; its least budget is exact.
class StorageExactStrategy final : public Strategy {
 public:
  StorageExactStrategy(const Chain& chain, const SolveOptions& options)
      : chain_(chain), options_(options) {}

  // With automatic slots, where its option is on and the table models the chain
  // (storage_dp_applies).
  static bool applies(const Chain& chain, const SolveOptions& options) {
    return automatic_slots(options) && options.exact_storages() && storage_dp_applies(chain);
  }

  std::int64_t least_budget() override {
    if (!least_) least_ = StorageDp::least_bytes(chain_);
    return *least_;
  }

  Outcome run(const Candidate* best) override {
    Outcome out;
    const std::int64_t budget = options_.budget_bytes();
    if (budget < least_budget()) return out;
    const TimeModel time{options_.use_nograd_time()};
    const StorageTable storage = storage_table(chain_, budget, true, options_.use_nograd_time(),
                                               options_.memory_limit_bytes(), options_.threads());
    if (const StorageDp* table = storage.table.get()) {
      out.exact_storages = true;
      Sequence sequence = table->sequence_at(budget);
      if (!sequence.empty()) {
        const double predicted = table->value_at(budget);
        Simulation sim = simulate(chain_, sequence, time);
        REMAT_INTERNAL_ASSERT(sim.peak_bytes <= budget, "the storage-exact sequence peaks at ",
                              sim.peak_bytes, " bytes, above the budget ", budget);
        REMAT_INTERNAL_ASSERT(
            std::fabs(sim.makespan_ms - predicted) <= 1e-9 * std::max(1.0, predicted),
            "the storage-exact sequence takes ", sim.makespan_ms, " ms, not its table's ",
            predicted);
        out.candidate =
            candidate_of(std::move(sequence), std::move(sim), storage.discretization, budget);
        return out;
      }
    }
    if (best != nullptr) return out;
    // The budget fits a nested sequence, but not in whole units: the least-memory one.
    Sequence sequence = StorageDp::least_sequence(chain_);
    Simulation sim = simulate(chain_, sequence, time);
    REMAT_INTERNAL_ASSERT(sim.peak_bytes == *least_,
                          "the storage-exact least-memory sequence peaks at ", sim.peak_bytes,
                          " bytes, not ", *least_);
    out.candidate = candidate_of(std::move(sequence), std::move(sim), Discretization{1, budget},
                                 budget, SolveStatus::kFeasible);
    out.candidate->warning = str_cat(
        "the budget is within the rounding of the memory slots of the least memory the chain "
        "can run in (",
        *least_,
        " bytes): the sequence is the least-memory one, not the optimum; a slightly "
        "larger budget lets the dynamic program choose");
    return out;
  }

 private:
  const Chain& chain_;
  const SolveOptions& options_;
  std::optional<std::int64_t> least_;
};

}  // namespace

std::vector<std::unique_ptr<Strategy>> optimal_strategies(const Chain& chain,
                                                          const SolveOptions& options) {
  // Each strategy says where it applies; the persistent table always does.
  std::vector<std::unique_ptr<Strategy>> out;
  out.push_back(std::make_unique<PersistentTableStrategy>(chain, options));
  if (SearchAboveBudgetStrategy::applies(chain, options))
    out.push_back(std::make_unique<SearchAboveBudgetStrategy>(chain, options));
  if (std::unique_ptr<Strategy> merged = MergedRunsStrategy::where_it_applies(chain, options))
    out.push_back(std::move(merged));
  if (StorageExactStrategy::applies(chain, options))
    out.push_back(std::make_unique<StorageExactStrategy>(chain, options));
  return out;
}

Sequence table_sequence(const PersistentTable& table, const UnitChain& chain,
                        const Discretization& disc, std::int64_t bytes) {
  const std::int64_t capacity =
      std::min(disc.capacity_units, bytes / disc.unit_bytes) - chain.context;
  if (capacity - chain.x[0] >= 0 && table.value(0, chain.length, capacity) < kInfinity)
    return table.rebuild(capacity);
  return {};
}

// The DP's sequence for a larger budget B' is as fast or faster (more memory never makes the
// optimum slower), and its exact peak grows with B' as the model's does, give or take what the
// model counts more than once. That excess is at most twice the carried bytes (each carried
// storage once more in each activation holding it, and in its gradient's), so beyond the
// budget plus that, the DP's sequences that fit the budget exactly are all sequences the DP
// finds at the budget plus that excess: the search stops there, or at the store-all peak.
// Below the store-all peak, which is at most kMaxChainTotalBytes, nothing overflows.
std::int64_t search_ceiling(const Chain& chain, std::int64_t budget, std::int64_t store_all_bytes) {
  const std::int64_t carried = chain.carried_bytes();
  if (carried == 0 || budget >= store_all_bytes) return budget;
  return std::min(store_all_bytes, budget + 2 * carried);
}

MergedCandidate merged_candidate(const Chain& chain, const MergedChain& merged,
                                 const SolveOptions& options) {
  MergedCandidate out;
  out.solution = solve(merged.chain, options);
  if (!out.solution.ok()) return out;
  out.sequence = expand_merged(out.solution.sequence, merged.first);
  out.simulation = simulate(chain, out.sequence, TimeModel{options.use_nograd_time()});
  // What the merged stages' fields promise (merge.cpp).
  REMAT_INTERNAL_ASSERT(out.simulation.peak_bytes <= out.solution.peak_bytes,
                        "the merged chain's sequence peaks at ", out.simulation.peak_bytes,
                        " bytes on the chain, above its merged peak ", out.solution.peak_bytes);
  REMAT_INTERNAL_ASSERT(std::fabs(out.simulation.makespan_ms - out.solution.makespan_ms) <=
                            1e-9 * std::max(1.0, out.solution.makespan_ms),
                        "the merged chain's sequence takes ", out.simulation.makespan_ms,
                        " ms on the chain, not its merged makespan ", out.solution.makespan_ms);
  return out;
}

bool faster(double candidate_ms, double current_ms) {
  return candidate_ms < current_ms * (1 - 1e-12);
}

void search_above_budget(const Chain& chain, std::int64_t budget, std::int64_t store_all_bytes,
                         double best_ms, const TimeModel& time,
                         const std::function<Sequence(std::int64_t)>& sequence_at,
                         const std::function<void(std::int64_t, Sequence, Simulation)>& improve) {
  std::int64_t lo = budget;
  std::int64_t hi = search_ceiling(chain, budget, store_all_bytes);
  if (hi <= lo) return;
  const double store_all_ms = chain.store_all_ms();
  const std::int64_t tolerance = std::max<std::int64_t>(1, budget / 1024);
  while (hi - lo > tolerance && best_ms > store_all_ms) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    Sequence sequence = sequence_at(mid);
    Simulation sim = sequence.empty() ? Simulation{} : simulate(chain, sequence, time);
    if (sequence.empty() || sim.peak_bytes > budget) {
      hi = mid;
      continue;
    }
    lo = mid;
    if (sim.makespan_ms < best_ms) {
      best_ms = sim.makespan_ms;
      improve(mid, std::move(sequence), std::move(sim));
    }
  }
}

}  // namespace detail
}  // namespace remat
