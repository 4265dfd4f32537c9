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
#include <thread>
#include <vector>

#include "remat/solver/chain.h"
#include "remat/solver/sequence.h"
#include "remat/solver/solver.h"

namespace remat {
namespace detail {

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The chain as the dynamic program sees it, indexed as in shared/reference/rotor-model.md:
// x[0..L+1], xb[0..L+1] (x[L+1] = xb[L+1] = 0), ft[0..L], bt[0..L] in units; fw, bw, nf
// (forward with autograd, backward, forward without autograd) in ms, with the loss
// pseudo-stage L costing 0.
struct UnitChain {
  int length = 0;
  std::vector<std::int64_t> x, xb, ft, bt;
  std::vector<double> fw, bw, nf;
  // Check the chain step as the published recurrence does (docs/algorithms.md).
  bool published_chain_step = false;

  // Memory the chain step of segment (i, l) needs for Fe_i and B_i themselves:
  //   exact:     max(xb[i+1] + ft[i] + x[l+1], x[i] + x[i+1] + xb[i+1] + bt[i])
  //   published: max(x[i+1] + xb[i+1] + ft[i], x[i] + x[i+1] + xb[i+1] + bt[i])
  // (Fe_i runs while y_{l+1} is live, not y_{i+1}; B_i with y_{i+1} and y_i.)
  std::int64_t chain_step_memory(int i, int l) const {
    const auto a = static_cast<std::size_t>(i);
    const std::int64_t live_gradient =
        published_chain_step ? x[a + 1] : x[static_cast<std::size_t>(l) + 1];
    const std::int64_t forward = xb[a + 1] + ft[a] + live_gradient;
    const std::int64_t backward = x[a] + x[a + 1] + xb[a + 1] + bt[a];
    return forward > backward ? forward : backward;
  }
};
UnitChain make_unit_chain(const Chain& chain, std::int64_t unit_bytes, bool use_nograd_time,
                          bool published_chain_step = false);

// MinMem(i, l): the least memory (units, x_i excluded, y_{l+1} included) with which stages
// i..l can be reversed under the persistent model: the first finite entry of each row of the
// dynamic program. docs/algorithms.md writes out its recurrence.
class MinMemoryTable {
 public:
  // at(i, l) is exact up to exact_up_to; a larger MinMem reads as some value above it (which
  // is all the dynamic program and fits() need to know of it).
  explicit MinMemoryTable(const UnitChain& chain,
                          std::int64_t exact_up_to = std::numeric_limits<std::int64_t>::max());
  std::int64_t at(int i, int l) const {
    return mm_[static_cast<std::size_t>(i) * stride_ + static_cast<std::size_t>(l)];
  }

 private:
  template <class T>
  void build(const UnitChain& chain, std::int64_t limit);
  std::size_t stride_;
  std::vector<std::int64_t> mm_;  // mm_[i * stride + l]
};

// Whether the chain fits in `capacity_units` (x_0 included) under this unit chain.
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

// The persistent dynamic program over memory 0..capacity units for every segment (i, l).
// Rows are stored compressed: +inf below their minimum memory, constant above the memory
// where they saturate.
class PersistentTable {
 public:
  // threads: the number of workers (at most one per block of segment starts); 0 chooses, one
  // per hardware thread or the calling thread alone for small problems.
  PersistentTable(const UnitChain& chain, const MinMemoryTable& min_memory, std::int64_t capacity,
                  int threads);
  // Opt(i, l, m): least time to reverse stages i..l with m units (x_i excluded,
  // y_{l+1} included); +inf if impossible.
  double value(int i, int l, std::int64_t m) const { return row(i, l).at(m); }
  // The sequence achieving value(0, L, m), ties broken as the reference does.
  Sequence rebuild(std::int64_t m) const;
  // Bytes held by the table's rows.
  std::int64_t stored_bytes() const { return stored_bytes_; }

 private:
  struct Row {
    const double* values = nullptr;
    std::int64_t lo = 0;   // first finite memory
    std::int64_t sat = 0;  // from here on the value is constant
    double constant = 0;   // values[sat - lo]
    bool empty() const { return values == nullptr; }
    double at(std::int64_t m) const {
      if (values == nullptr || m < lo) return kInfinity;
      return values[(m < sat ? m : sat) - lo];
    }
  };
  const Row& row(int i, int l) const {
    return rows_[static_cast<std::size_t>(i) * stride_ + static_cast<std::size_t>(l)];
  }
  Row& row(int i, int l) {
    return rows_[static_cast<std::size_t>(i) * stride_ + static_cast<std::size_t>(l)];
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
                 const std::atomic<bool>& failed);
  void single_row(int i, int worker);
  void begin_row(int i, int l, Pending& p);
  // Leaf j of a row (i, l): left is Opt(i, j-1, .), right Opt(j, l, .).
  void add_leaf(int j, double prefix, const Row& left, const Row& right, Pending& p);
  void finish_row(int i, int l, int worker, Pending& p);
  double* allocate(int worker, std::int64_t count);
  void rebuild(int i, int l, std::int64_t m, Sequence& out) const;

  const UnitChain& chain_;
  const MinMemoryTable& min_memory_;
  std::int64_t capacity_;
  std::size_t stride_;
  std::vector<Row> rows_;
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
};

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
