#pragma once
// The persistent dynamic program (persistent_dp.cpp): its table, the work it counts, and the
// sequence it gives for a budget.

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "min_memory_table.h"
#include "relax.h"
#include "remat/solver/sequence.h"
#include "remat/solver/solver.h"
#include "unit_chain.h"

namespace remat {
namespace detail {

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
  // The sequence achieving value(0, L, m), ties broken as the reference does; with
  // `fewest_copies`, a choice that offloads nothing first where another ties with it (fewer
  // copies on the host, SolveOptions::host_memory_bytes).
  Sequence rebuild(std::int64_t m, bool fewest_copies = false) const;
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

}  // namespace detail
}  // namespace remat
