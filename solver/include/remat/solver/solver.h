#pragma once
/// Scheduling algorithms behind one interface, selected by name: `optimal` (the persistent
/// dynamic program of Beaumont et al., hal-02352969), `store-all`, `recompute-all`,
/// `periodic` and `revolve`. docs/algorithms.md explains each.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "remat/base/arg.h"
#include "remat/base/cores.h"
#include "remat/solver/chain.h"
#include "remat/solver/sequence.h"
#include "remat/solver/simulator.h"

namespace remat {

enum class Algorithm { kOptimal, kStoreAll, kRecomputeAll, kPeriodic, kRevolve };

/// `optimal`, `store-all`, `recompute-all`, `periodic`, `revolve`.
std::string_view algorithm_name(Algorithm algorithm);
/// Inverse of algorithm_name; throws std::invalid_argument listing the valid names.
Algorithm parse_algorithm(std::string_view name);
/// Every algorithm, in the order above.
const std::vector<Algorithm>& all_algorithms();

/// Most worker threads a solve may be given (SolveOptions::threads). More threads than
/// cores only add contention, and each worker holds its own buffers (docs/algorithms.md).
inline constexpr int kMaxThreads = 1024;


/// Options of solve(). The budget is required; the rest have defaults.
/// Example: `solve(chain, SolveOptions(700LL << 20).slots(500))`.
struct SolveOptions {
  /// Activation memory available in bytes, the input x_0 and its gradient included.
  explicit SolveOptions(std::int64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  REMAT_ARG(std::int64_t, budget_bytes);
  /// Which algorithm computes the sequence.
  REMAT_ARG(Algorithm, algorithm) = Algorithm::kOptimal;
  /// `optimal` only (another algorithm refuses it, as it does `segments` and
  /// `reference_recurrence` where they do not apply): memory slots of the discretization. 0 picks
  /// the finest number that keeps the solve fast (docs/algorithms.md); N > 0 reproduces the
  /// reference rotor: the unit is floor(budget / N) bytes, sizes are rounded up to whole units, the
  /// capacity is N units.
  REMAT_ARG(std::int64_t, slots) = 0;
  /// `periodic` only: the number of segments K, 1 <= K <= L; 0 means round(sqrt(L)).
  REMAT_ARG(int, segments) = 0;
  /// Cost `Fn`/`CF` with `fwd_nograd_ms` (the reference always uses `fwd_ms`).
  REMAT_ARG(bool, use_nograd_time) = true;
  /// Worker threads of the dynamic program, at most kMaxThreads; 0 means one per available
  /// core (available_cores()) for large problems, the calling thread alone for small ones.
  REMAT_ARG(int, threads) = 0;
  /// `optimal` only: the most memory, in bytes, the dynamic program's tables may take; 0 means
  /// 80% of the memory this process may use (available_memory_bytes()). The memory a solve
  /// needs is estimated before anything is allocated (docs/algorithms.md, "Limits"): above the
  /// limit, automatic slots are coarsened (with a warning; never below 100 slots) and a solve
  /// that still does not fit, or whose `slots` were given, is refused with
  /// std::invalid_argument saying how much it would need.
  REMAT_ARG(std::int64_t, memory_limit_bytes) = 0;
  /// `optimal` only: check the chain step's memory as the published recurrence does, to
  /// reproduce the reference's numbers exactly. With fwd_tmp_bytes > 0 that recurrence can
  /// return a sequence that exceeds the budget (reported in Solution::warning) or miss one that
  /// fits; docs/algorithms.md explains. Off by default.
  REMAT_ARG(bool, reference_recurrence) = false;
  /// `optimal` with automatic slots, on a chain with carried members: the dynamic program counts
  /// a carried storage in every activation it is in, so that its sequence can peak well below
  /// the budget. Then the DP also solves for larger budgets (a bisection, up to the store-all
  /// peak), and the fastest of its sequences whose exact (simulated) peak fits the budget is
  /// the result (Solution::solved_budget_bytes says for which budget). Never slower than the
  /// DP at the budget itself; false turns it off. docs/algorithms.md, "Carried members".
  REMAT_ARG(bool, search_above_budget) = true;
  /// `optimal` with automatic slots, on a chain whose inner activations carry members over
  /// several stages (a skip that a run of stages carries to the stage that adds it back): the
  /// dynamic program counts such a storage in every activation it is in. Then the chain with
  /// each such run merged into one stage, in which every storage counts once, is solved too,
  /// and its sequence, expanded to the chain's stages, is the result where it is faster and its
  /// exact peak fits (Solution::merged_stages). A finer cut of a network is then never slower
  /// than its cut at the runs' ends (a ResNet cut by layer against the same cut by residual
  /// block), and the least budget is the smaller of the two; false turns it off.
  /// docs/algorithms.md, "Carried members".
  REMAT_ARG(bool, merge_carried_runs) = true;
  /// `optimal` with automatic slots, on a chain with carried members: also solve the
  /// storage-exact dynamic program, rotor's recurrence over sets of storages, in which every
  /// storage counts once: its optimum is the fastest nested sequence that fits (in its
  /// discretization's unit), and its least budget the least of any nested sequence, in bytes.
  /// Its sequence is the result where it is faster (Solution::exact_storages). It runs where its
  /// table is small enough (at most kStorageDpMaxStages stages, and a bounded work and memory:
  /// docs/algorithms.md, "The storage-exact dynamic program"); false turns it off.
  REMAT_ARG(bool, exact_storages) = true;
  /// `optimal` only: a leaf of the schedule may also offload its checkpoint x_i over the
  /// chain's link (Chain::link; required): copy it to host memory while the leaf's forwards run,
  /// free it on the device while the rest of the chain is reversed, and copy it back during the
  /// last backward before it is read again. The dynamic program chooses, for each checkpoint,
  /// keeping, offloading or recomputing, and its time counts the waits for copies that do not
  /// overlap (docs/cost-model.md, "Offload"). Budgets below the least of recomputation alone
  /// may become feasible. Off by default.
  REMAT_ARG(bool, offload) = false;
  /// `offload` only: the most host memory, in bytes, the offloaded copies may hold at once
  /// (Simulation::host_peak_bytes); -1, the default, sets no bound. Where the fastest schedule
  /// without a bound holds more, the dynamic program is solved again with the host memory as
  /// one more dimension, in `host_slots` units (docs/algorithms.md, "A bound on host memory").
  REMAT_ARG(std::int64_t, host_memory_bytes) = -1;
  /// The units a host bound is divided into: each copy's size is rounded up to whole units of
  /// ceil(host_memory_bytes / host_slots) bytes, so a schedule never exceeds the bound, and the
  /// table under the bound takes up to host_slots + 1 times the work and memory of the one
  /// without (fewer where the memory limit requires, with a warning). 1 to kMaxHostSlots.
  REMAT_ARG(std::int64_t, host_slots) = 32;
};

/// Most units a host bound may be divided into (SolveOptions::host_slots).
inline constexpr std::int64_t kMaxHostSlots = 4096;

/// The most stages a chain may have for SolveOptions::exact_storages to apply: beyond, even its
/// coarsest table (500 slots) would pass its work allowance (kStorageDpWork) on the chains
/// measured (torchvision's resnet152 by operation, 303 stages, about 5 x 10^9), and finding its
/// reachable rows alone takes a third of a second.
inline constexpr int kStorageDpMaxStages = 300;

/// How a solve ended: `optimal` (the dynamic program's optimum for its discretization),
/// `feasible` (a heuristic's sequence within the budget), `infeasible` (nothing fits).
enum class SolveStatus { kOptimal, kFeasible, kInfeasible };
std::string_view status_name(SolveStatus status);

/// The memory discretization of one optimal solve.
struct Discretization {
  /// Bytes per unit (1 when the budget is solved in exact bytes).
  std::int64_t unit_bytes = 1;
  /// Units available for the whole chain, x_0 included.
  std::int64_t capacity_units = 0;
  /// Size in whole units, rounded up (without overflow, whatever the unit).
  std::int64_t units(std::int64_t bytes) const {
    return bytes / unit_bytes + (bytes % unit_bytes != 0 ? 1 : 0);
  }
};

/// The result of solve(). A budget that cannot be met is a status, not an exception.
struct Solution {
  SolveStatus status = SolveStatus::kInfeasible;
  Algorithm algorithm = Algorithm::kOptimal;
  std::int64_t budget_bytes = 0;
  /// The schedule (empty when infeasible), checked by the simulator.
  Sequence sequence;
  /// Predicted time of the sequence (the simulator's; equals the DP value for `optimal`).
  double makespan_ms = 0;
  /// Time of store-all, the fastest possible schedule.
  double store_all_makespan_ms = 0;
  /// Exact simulated peak of the sequence in bytes (0 when infeasible).
  std::int64_t peak_bytes = 0;
  /// Smallest budget at which this algorithm, with these options, finds a sequence; -1 when
  /// none does (`optimal` with too few slots).
  std::int64_t min_feasible_budget_bytes = 0;
  /// `optimal` only: the discretization used.
  Discretization discretization;
  /// `optimal` only: the budget the dynamic program solved for. The budget, or more on a chain
  /// with carried members (SolveOptions::search_above_budget), whose sequence's exact peak
  /// still fits the budget.
  std::int64_t solved_budget_bytes = 0;
  /// `optimal` only: the number of stages of the merged chain (SolveOptions::merge_carried_runs)
  /// whose sequence, expanded, this is; 0 when it is the chain's own. The discretization and
  /// the solved budget are then the merged chain's solve's.
  int merged_stages = 0;
  /// `optimal` only: whether the storage-exact dynamic program (SolveOptions::exact_storages)
  /// was solved at this budget: the result is then at least as fast as the fastest nested
  /// sequence in its discretization, carried members counted once.
  bool exact_storages = false;
  /// `periodic`: segments used; `revolve`: checkpoints used (x_0 included); else 0.
  int parameter = 0;
  double solve_seconds = 0;
  /// The simulation of the sequence (trace included).
  Simulation simulation;
  /// Non-empty when the result deserves a caution (e.g. the reference recurrence overran).
  std::string warning;

  bool ok() const { return status != SolveStatus::kInfeasible; }
};

/// Computes a schedule for `chain` within `options.budget_bytes()`. Throws
/// std::invalid_argument for bad options (e.g. segments out of range) and ChainError for an
/// invalid chain; an unmeetable budget is a result with status `infeasible`.
Solution solve(const Chain& chain, const SolveOptions& options);

/// The smallest budget in bytes for which solve(chain, options) is not infeasible; the
/// options' budget is ignored. Same as solve(...).min_feasible_budget_bytes. -1 when no budget
/// up to 2^63 - 1 bytes works (`optimal` with too few slots: see min_feasible_slots()).
std::int64_t min_feasible_budget(const Chain& chain, const SolveOptions& options);

/// The fewest slots N with which `optimal` with `slots(N)` finds a schedule at some budget
/// (the options' budget and slots are ignored): with fewer, the chain cannot fit in N units
/// even when every size that is not zero takes only one. Example: `remat schedule --slots 1`
/// says how many slots the chain needs.
std::int64_t min_feasible_slots(const Chain& chain, const SolveOptions& options);

/// Exact simulated peak of store-all (every activation kept), in bytes.
std::int64_t store_all_peak(const Chain& chain);

}  // namespace remat
