#pragma once
// The dynamic program under a bound on host memory (SolveOptions::host_memory_bytes,
// host_table.cpp): the persistent table's recurrence with one more dimension, the host memory
// a segment may still fill with offloaded checkpoints.

#include <cstdint>
#include <memory>
#include <vector>

#include "min_memory_table.h"
#include "relax.h"
#include "remat/solver/chain.h"
#include "remat/solver/sequence.h"
#include "unit_chain.h"

namespace remat {
namespace detail {

// The host memory in units: `capacity` units of `unit_bytes`, each x_i's copy taking
// size[i] units (its bytes rounded up: a schedule that fits in units fits in bytes).
struct HostUnits {
  std::int64_t unit_bytes = 1;
  std::int64_t capacity = 0;
  std::vector<std::int64_t> size;  // 0..L; size[0] = size[L] = 0 (never offloaded)
};

// The host memory `bytes` in at most `slots` units (unit_bytes = ceil(bytes / slots), at least
// 1): slots = 0 keeps bytes exact (unit 1).
HostUnits host_units(const Chain& chain, std::int64_t bytes, std::int64_t slots);

// The host memories at which a segment's rows differ. A schedule of segment (i, l) fills the
// host with some of the copies of x_i .. x_{l-1} at once, so the memory it holds is a sum of
// some of their sizes: with k units, the rows are those at the largest such sum at most k.
// Those sums (up to the capacity) are the segment's levels, 0 first.
class HostLevels {
 public:
  HostLevels(const UnitChain& chain, const HostUnits& host);
  // The number of levels of segment (i, l), and the n-th (ascending).
  std::size_t count(int i, int l) const { return count_[pair(i, l)]; }
  std::int64_t sum(int i, int l, std::size_t n) const { return sums_[first_[pair(i, l)] + n]; }
  // The level that stands for k units in segment (i, l): the last one at most k.
  std::size_t index(int i, int l, std::int64_t k) const;
  std::int64_t size(int i) const { return size_[static_cast<std::size_t>(i)]; }
  std::int64_t capacity() const { return capacity_; }

 private:
  std::size_t pair(int i, int l) const {
    return static_cast<std::size_t>(i) * stride_ + static_cast<std::size_t>(l);
  }
  std::size_t stride_;
  std::vector<std::size_t> first_, count_;
  std::vector<std::int64_t> sums_, size_;
  std::int64_t capacity_;
};

// Where the entries of a table over host levels stand: for each (state, i, l), one per level of
// the segment, the taped state only where segments starting at i have two.
class HostLayout {
 public:
  HostLayout(const UnitChain& chain, const HostLevels& levels);
  std::size_t size() const { return size_; }
  // The entry of level n of (i, l, state), and the one that stands for k host units.
  std::size_t entry(int i, int l, bool taped, std::size_t n) const {
    return offsets_[(static_cast<std::size_t>(taped && chain_.two_states(i)) * stride_ +
                     static_cast<std::size_t>(i)) *
                        stride_ +
                    static_cast<std::size_t>(l)] +
           n;
  }
  std::size_t at(int i, int l, bool taped, std::int64_t k) const {
    return entry(i, l, taped, levels_.index(i, l, k));
  }

 private:
  const UnitChain& chain_;
  const HostLevels& levels_;
  std::size_t stride_;
  std::vector<std::size_t> offsets_;
  std::size_t size_ = 0;
};

// MinMem(i, l, s, k): the least memory with which segment (i, l) can be reversed with at most k
// host units of offloaded checkpoints (min_memory.cpp's recurrence, an offloading leaf of x_i
// leaving k - size(i) to its right part); +inf-like (kUnreachable) where none.
class HostMinMemory {
 public:
  static constexpr std::int64_t kUnreachable = std::int64_t{1} << 62;
  HostMinMemory(const UnitChain& chain, const HostLevels& levels);
  std::int64_t at(int i, int l, bool taped, std::int64_t k) const {
    return values_[layout_.at(i, l, taped, k)];
  }

 private:
  HostLayout layout_;
  std::vector<std::int64_t> values_;
};

// Opt(i, l, m, s, k): the persistent table's Opt with at most k host units of offloaded
// checkpoints in the segment (x_i's own copy included where it offloads x_i). Rows stored as
// the persistent table's: +inf below their least memory, constant from where they saturate.
// The levels of a segment are computed side by side by `threads` workers (0: one per
// available core), each segment after the ones it reads.
class HostBoundedTable {
 public:
  HostBoundedTable(const UnitChain& chain, const HostLevels& levels, const HostMinMemory& least,
                   std::int64_t capacity, int threads = 1);
  double value(int i, int l, std::int64_t m, bool taped, std::int64_t k) const {
    return row(i, l, taped, k).at(m);
  }
  // The sequence achieving value(0, L, m, fresh, host capacity), ties broken as the persistent
  // table breaks them.
  Sequence rebuild(std::int64_t m) const;
  std::int64_t stored_bytes() const { return stored_bytes_; }
  // The most bytes the rows can take (each row from its least memory to the capacity), known
  // before the table is built: what the memory limit is checked against.
  static double bytes_needed(const UnitChain& chain, const HostLevels& levels,
                             const HostMinMemory& least, std::int64_t capacity);

 private:
  const RowView& row(int i, int l, bool taped, std::int64_t k) const {
    return rows_[layout_.at(i, l, taped, k)];
  }
  // Rows are allocated from one arena per worker.
  struct Arena {
    std::vector<std::unique_ptr<double[]>> blocks;
    std::int64_t used = 0, size = 0, bytes = 0;
    double* allocate(std::int64_t count);
  };
  void compute_row(int i, int l, bool taped, std::size_t n, std::vector<double>& best,
                   Arena& arena);

  const UnitChain& chain_;
  const HostLevels& levels_;
  const HostMinMemory& least_;
  std::int64_t capacity_;
  HostLayout layout_;
  std::vector<RowView> rows_;
  std::vector<Arena> arenas_;
  std::int64_t stored_bytes_ = 0;
};

}  // namespace detail
}  // namespace remat
