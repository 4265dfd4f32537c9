#pragma once
// Internals of remat_solver shared by its .cpp files: the chain in memory units, the
// minimum-memory table, the persistent dynamic program and a small worker pool.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "remat/solver/chain.h"
#include "remat/solver/sequence.h"
#include "remat/solver/solver.h"
#include "relax.h"

namespace remat {
namespace detail {

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();

// How errors name a chain the caller built: `chain 'NAME'`, or `chain` when it has no name.
inline std::string chain_source(const Chain& chain) {
  return chain.name.empty() ? std::string("chain") : "chain '" + chain.name + "'";
}

// The chain as the dynamic program sees it, in memory units (sizes rounded up), with the loss
// as a pseudo-stage L. Activations x_0..x_{L+1} (x[L+1] = g[L+1] = 0), stages 0..L:
//   x[k]   size of the activation x_k (every member; a carried one counted again here, which
//          can only overstate memory), g[k] size of its gradient y_k;
//   sv[i]  what stage i's autograd state holds besides its input and x_{i+1};
//   gk[i]  its autograd state with the kept members of x_{i+1} (state_bytes + saved outputs);
//   hf[i]  what remains of x_i after its forward with autograd when x_i was made by a forward
//          without autograd ("fresh"): the members stage i keeps. hf[0] = x[0] (the caller
//          holds the input), hf[L] = x[L] (the loss reads its input while it runs);
//   ht[i]  the same when x_i came from Fe_{i-1} ("taped"): stage i-1 also keeps its kept
//          outputs, so the members either stage keeps remain;
//   ft[i], nt[i], bt[i] temporaries of the forward with and without autograd and of the
//          backward (bt[L]: the loss);
//   fw, bw, nf times (forward with autograd, backward, forward without), 0 for the loss.
// A chain of model v1 (every stage keeps its input and output) has hf = ht = x and
// gk = the stage's saved_bytes: the reference's `xb`.
struct UnitChain {
  int length = 0;
  std::vector<std::int64_t> x, g;            // 0..L+1
  std::vector<std::int64_t> sv, gk, hf, ht;  // 0..L
  std::vector<std::int64_t> ft, nt, bt;      // 0..L
  std::vector<double> fw, bw, nf;            // 0..L
  double restart = 0;                        // Chain::restart_ms
  // The restart of a leaf j: its left part starts right after B_j, unless j = L (the right
  // part is the loss alone).
  double restart_after(int j) const { return j < length ? restart : 0.0; }
  // Context tensors: held by the caller for the whole step.
  std::int64_t context = 0;
  // The chain's output x_L, held by the caller from the loss to the step's end
  // (Chain::output_held): every operation after the loss also holds `tail` = x[L], except
  // that B_{L-1} right after the loss (the chain step of a segment (L-1, L)) finds the part its
  // autograd state keeps already counted: `tail_shared`, rounded down. A segment (i, l) with
  // l < L runs wholly after the loss: it has `tail` less of its memory for itself. 0 and 0
  // when the output is let go, and in the published recurrence (the reference does not model
  // it).
  std::int64_t tail = 0, tail_shared = 0;
  // Check the chain step as the published recurrence does (docs/algorithms.md).
  bool published_chain_step = false;

  // Whether segments starting at i differ between the two states (fresh, taped).
  bool two_states(int i) const {
    return hf[static_cast<std::size_t>(i)] != ht[static_cast<std::size_t>(i)];
  }
  std::int64_t held(int i, bool taped) const {
    return taped ? ht[static_cast<std::size_t>(i)] : hf[static_cast<std::size_t>(i)];
  }
  // Memory of the chain step of segment (i, l) (x_i included):
  //   Fe_i: x[i] + g[l+1] + x[i+1] + sv[i] + ft[i]    (y_{l+1} is live; published: y_{i+1})
  //   B_i:  held(i) + gk[i] + g[i+1] + g[i] + bt[i]
  std::int64_t forward_memory(int i, int l) const {
    const auto a = static_cast<std::size_t>(i);
    const std::int64_t live_gradient =
        published_chain_step ? g[a + 1] : g[static_cast<std::size_t>(l) + 1];
    return x[a] + live_gradient + x[a + 1] + sv[a] + ft[a];
  }
  std::int64_t backward_memory(int i, bool taped) const {
    const auto a = static_cast<std::size_t>(i);
    return held(i, taped) + gk[a] + g[a + 1] + g[a] + bt[a];
  }
  // The memory of the chain step of segment (i, l): B_i runs after the loss when l = L.
  std::int64_t chain_step_memory(int i, int l, bool taped) const {
    const std::int64_t forward = forward_memory(i, l);
    std::int64_t backward = backward_memory(i, taped);
    if (l == length) backward += tail - (i + 1 == length ? tail_shared : 0);
    return forward > backward ? forward : backward;
  }
  // What the caller's x_L takes from the memory of the left part (i, j-1) of a leaf of
  // segment (i, l): all of it after the loss, i.e. when l = L.
  std::int64_t left_shift(int l) const { return l == length ? tail : 0; }
  // What the chain step keeps outside the rest of the segment: the remains of x_i and the
  // autograd state (x_{i+1} belongs to the rest).
  std::int64_t chain_shift(int i, bool taped) const {
    return held(i, taped) + sv[static_cast<std::size_t>(i)];
  }
};
UnitChain make_unit_chain(const Chain& chain, std::int64_t unit_bytes, bool use_nograd_time,
                          bool published_chain_step = false);

// MinMem(i, l, state): the least memory (units, x_i and y_{l+1} included) with which stages
// i..l can be reversed under the persistent model: the first finite entry of each row of the
// dynamic program. docs/algorithms.md writes out its recurrence.
class MinMemoryTable {
 public:
  // at(i, l, taped) is exact up to exact_up_to; a larger MinMem reads as some value above it
  // (which is all the dynamic program and fits() need to know of it).
  explicit MinMemoryTable(const UnitChain& chain,
                          std::int64_t exact_up_to = std::numeric_limits<std::int64_t>::max());
  std::int64_t at(int i, int l, bool taped = false) const {
    const std::size_t k = static_cast<std::size_t>(i) * stride_ + static_cast<std::size_t>(l);
    return taped && !taped_.empty() ? taped_[k] : mm_[k];
  }
  // The fastest sequence that reverses the whole chain in at(0, L) units (of the choices that
  // reach each segment's MinMem, the fastest). The table must be exact (the default
  // exact_up_to) and `chain` the one it was built from.
  Sequence least_memory_sequence(const UnitChain& chain) const;

 private:
  class LeastMemory;
  template <class T>
  void build(const UnitChain& chain, std::int64_t limit);
  std::size_t stride_;
  std::vector<std::int64_t> mm_;     // fresh: mm_[i * stride + l]
  std::vector<std::int64_t> taped_;  // taped (empty when no segment start has two states)
};

// Whether the chain fits in `capacity_units` (x_0 and the context included).
bool fits(const UnitChain& chain, const MinMemoryTable& table, std::int64_t capacity_units);

// A pool of worker threads; run() executes body(index, worker) for every index in
// [0, count) and returns when all are done. The calling thread works as worker 0.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  int size() const { return static_cast<int>(workers_.size()) + 1; }
  void run(std::int64_t count, const std::function<void(std::int64_t, int)>& body);

 private:
  void work(int worker);
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  const std::function<void(std::int64_t, int)>* body_ = nullptr;
  std::int64_t count_ = 0;
  std::atomic<std::int64_t> next_{0};
  int busy_ = 0;
  std::exception_ptr error_;
};

// The work of a dynamic program's table, counted rather than timed (a count is not noisy):
// tests/solver/work_test.cpp compares it with committed figures, bench/solver_bench prints it.
// It depends on the chain, the capacity and the order of the candidates (the table's blocks and
// tiles), not on the number of threads.
struct TableStats {
  std::int64_t candidates = 0;  // candidates (leaves and chain steps) offered to a row
  std::int64_t values = 0;      // their values computed or written, after pruning
  TableStats& operator+=(const TableStats& other) {
    candidates += other.candidates;
    values += other.values;
    return *this;
  }
};

// The persistent dynamic program over memory 0..capacity units for every segment (i, l) and
// both states of its start (docs/algorithms.md). Rows are stored compressed: +inf below their
// minimum memory, constant above the memory where they saturate.
class PersistentTable {
 public:
  // capacity: the memory of the whole chain, x_0 included, the context excluded. threads: the
  // number of workers (at most one per block of segment starts); 0 chooses, one per available
  // core or the calling thread alone for small problems.
  PersistentTable(const UnitChain& chain, const MinMemoryTable& min_memory, std::int64_t capacity,
                  int threads);
  // Opt(i, l, m, state): least time to reverse stages i..l with m units (x_i and y_{l+1}
  // included); +inf if impossible.
  double value(int i, int l, std::int64_t m, bool taped = false) const {
    return row(i, l, taped).at(m);
  }
  // The sequence achieving value(0, L, m), ties broken as the reference does.
  Sequence rebuild(std::int64_t m) const;
  // Bytes held by the table's rows.
  std::int64_t stored_bytes() const { return stored_bytes_; }
  // The work it took to compute the table.
  const TableStats& stats() const { return stats_; }

  // How a table of `length` stages with rows of `width` memories is computed: `block`
  // segment starts at a time, `tile` segment ends at a time, by `workers` threads (`threads`
  // as the constructor takes it). Each worker holds block * tile rows being computed per state
  // of a segment start, and allocates the rows it stores in arena blocks of up to
  // kArenaBlockBytes.
  struct Plan {
    int block = 1, tile = 1, workers = 1;
  };
  static Plan plan(int length, std::int64_t width, int threads);
  static constexpr std::int64_t kArenaBlockBytes = std::int64_t{32} << 20;

 private:
  using Row = RowView;
  std::size_t index(int i, int l) const {
    return static_cast<std::size_t>(i) * stride_ + static_cast<std::size_t>(l);
  }
  const Row& row(int i, int l, bool taped = false) const {
    return taped && chain_.two_states(i) ? taped_rows_[index(i, l)] : rows_[index(i, l)];
  }
  Row& row(int i, int l, bool taped = false) {
    return taped && chain_.two_states(i) ? taped_rows_[index(i, l)] : rows_[index(i, l)];
  }
  // A row being computed: best[k] is Opt(i, l, lo + k) so far (the least of the candidates
  // added, non-increasing in k).
  struct Pending {
    double* best = nullptr;
    std::int64_t lo = 0;
    bool active = false;
  };
  void run_block(int start, int end, int tile, int worker, double* scratch, std::int64_t width,
                 const std::atomic<int>* above, std::atomic<int>& done,
                 const std::atomic<bool>& failed, TableStats& stats);
  void single_row(int i, int worker);
  void begin_row(int i, int l, bool taped, Pending& p);
  // Leaf j of a row (i, l): left is Opt(i, j-1, ., state), right Opt(j, l, ., fresh), shifted
  // by x[i], left by `tail` (UnitChain::left_shift); the leaf's own forwards need `forward_lo`.
  void add_leaf(std::int64_t shift, std::int64_t tail, std::int64_t forward_lo, double prefix,
                const Row& left, const Row& right, Pending& p, TableStats& stats);
  void finish_row(int i, int l, bool taped, int worker, Pending& p, TableStats& stats);
  double* allocate(int worker, std::int64_t count);
  void rebuild(int i, int l, std::int64_t m, bool taped, Sequence& out) const;

  const UnitChain& chain_;
  const MinMemoryTable& min_memory_;
  std::int64_t capacity_;
  std::size_t stride_;
  std::vector<Row> rows_, taped_rows_;
  struct FreeBlock {
    void operator()(double* block) const { std::free(block); }
  };
  using Block = std::unique_ptr<double, FreeBlock>;
  static Block allocate_block(std::int64_t count);
  struct Arena {
    std::vector<Block> blocks;
    std::int64_t used = 0, size = 0;
    std::int64_t bytes = 0;
  };
  std::vector<Arena> arenas_;
  std::int64_t stored_bytes_ = 0;
  TableStats stats_;
};

// The table's sequence for a budget of `bytes` (its capacity at most, in its unit, the context
// left out), or an empty one where it finds none.
Sequence table_sequence(const PersistentTable& table, const UnitChain& chain,
                        const Discretization& disc, std::int64_t bytes);

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

// The chain with the members of x_0 that have no gradient and that stage 0 carries on moved into
// the context, from every activation that carries them (merge.cpp): the caller holds x_0 for the whole step, so such a storage
// is live from start to end either way, counted once, as the context is. Every sequence has the same
// peak, time and live memory on both chains; the dynamic program, which counts a carried member
// in every activation it is in, counts these once. None when nothing is to move, or when an
// activation would be left without a member.
std::optional<Chain> pin_input_members(const Chain& chain);
// SolveOptions::merge_carried_runs (merge.cpp): the chain with every run of stages that carry a
// member over their inner activations merged into one stage. first[c] is the chain's first
// stage in merged stage c, first.back() = L. A merged stage runs its stages in order (Fe, or
// CF then Fn, or Fn), its backwards in reverse; its fields are such that an expanded sequence
// runs on the chain in the merged chain's time, never above its peak, and with the same live
// memory after each merged operation.
struct MergedChain {
  Chain chain;
  std::vector<int> first;
};
// No merged chain when no run has two stages (nothing is carried over an inner activation), or
// when merging would pass the chain limits (sums of times or sizes).
std::optional<MergedChain> merge_carried_runs(const Chain& chain);
// A sequence of the merged chain as a sequence of the chain.
Sequence expand_merged(const Sequence& merged, const std::vector<int>& first);
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

// Pieces of rotor's nested form, shared by the sequences the tables rebuild: a segment (i, i)
// (the loss at the chain's end, else Fe_i B_i), and a leaf's forwards CF_i Fn_{i+1} .. Fn_{j-1}.
inline void append_single_stage(int i, int length, Sequence& out) {
  if (i == length) {
    out.push_back(loss(length));
  } else {
    out.push_back(fe(i));
    out.push_back(bwd(i));
  }
}
inline void append_leaf_forwards(int i, int j, Sequence& out) {
  out.push_back(cf(i));
  for (int k = i + 1; k < j; ++k) out.push_back(fn(k));
}

// Sequences of the heuristics (docs/algorithms.md).
Sequence store_all_sequence(int length);
// Griewank's binomial reversal with `snapshots` checkpoints, x_0 included (>= 1).
Sequence revolve_sequence(int length, int snapshots);

// Revolve for one chain length and every number of snapshots up to a maximum: Griewank's
// minimal forward counts t(l, s) tabulated for l <= length, s <= max_snapshots.
class RevolvePlanner {
 public:
  static constexpr std::int64_t kImpossible = std::int64_t{1} << 62;
  RevolvePlanner(int length, int max_snapshots);
  // t(steps, snapshots); kImpossible when snapshots == 0 and steps > 1.
  std::int64_t count(int steps, int snapshots) const;
  Sequence sequence(int snapshots) const;

 private:
  void reverse(int a, int b, int snapshots, Sequence& out) const;
  int length_, max_snapshots_;
  std::vector<std::int64_t> counts_;  // counts_[s * (length + 1) + l]
};
Sequence periodic_sequence(int length, int segments);
// Griewank's minimal number of forward steps to reverse `steps` steps with `snapshots`
// checkpoints: r * l - C(s + r, s + 1) with r the repetition number.
std::int64_t revolve_forward_count(std::int64_t steps, std::int64_t snapshots);

}  // namespace detail
}  // namespace remat
