// The dynamic program under a bound on host memory (docs/algorithms.md, "A bound on host
// memory").
//
// Offloaded checkpoints nest: an offloading leaf of segment (i, l) keeps x_i's copy on the host
// from its O_i until its left part first reads x_i again, that is while its right part runs,
// and the right part's own copies come back within it. A plain leaf's right part and left part
// run one after the other, and a chain step's rest runs alone. So the most host memory a
// schedule of (i, l) fills is
//   offloading leaf j:  max(size(i) + H(j, l), H(i, j-1))
//   plain leaf j:       max(H(j, l), H(i, j-1))
//   chain step:         H(i+1, l)
// (a left part that offloads x_i again writes over the same copy: size(i) once), which is the
// simulator's Simulation::host_peak_bytes for the nested form. With k host units left, Opt and
// MinMem get k as one more index: a plain leaf and a chain step give their parts k, an
// offloading leaf gives its right part k - size(i) and its left part k. Everything else is the
// persistent table's recurrence (persistent_dp.cpp), candidate for candidate, so that without
// a binding bound the two tables agree value for value.
//
// A segment (i, l) can offload only x_i .. x_{l-1}, so the host memory its schedules hold is a
// sum of some of their sizes: its rows change only at those sums, and are stored once for each
// (HostLevels; with copies of 25 units and 32 units of host memory, two levels, not 33). The
// rows are computed in the persistent table's order without its blocks and tiles, a long
// segment's levels side by side on the solver's threads.
#include "host_table.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "nested_form.h"
#include "remat/base/check.h"
#include "remat/base/cores.h"
#include "worker_pool.h"

namespace remat {
namespace detail {
namespace {

// A segment's levels are handed to the workers where its leaves times its memories reach this.
constexpr double kParallelWork = 20000;
constexpr std::int64_t kFirstBlock = 1 << 12;                  // doubles
constexpr std::int64_t kLargestBlock = std::int64_t{1} << 22;  // 32 MiB

}  // namespace

HostUnits host_units(const Chain& chain, std::int64_t bytes, std::int64_t slots) {
  REMAT_INTERNAL_ASSERT(bytes >= 0 && slots >= 0);
  HostUnits out;
  out.unit_bytes = slots == 0 ? 1 : std::max<std::int64_t>(1, bytes / slots + (bytes % slots != 0));
  out.capacity = bytes / out.unit_bytes;
  const int length = chain.length();
  out.size.assign(static_cast<std::size_t>(length) + 1, 0);
  for (int i = 1; i < length; ++i) {
    const std::int64_t b = chain.activation_bytes(i);
    out.size[static_cast<std::size_t>(i)] = b / out.unit_bytes + (b % out.unit_bytes != 0);
  }
  return out;
}

HostLevels::HostLevels(const UnitChain& chain, const HostUnits& host)
    : stride_(static_cast<std::size_t>(chain.length) + 1),
      first_(stride_ * stride_, 0),
      count_(stride_ * stride_, 0),
      size_(host.size),
      capacity_(host.capacity) {
  REMAT_INTERNAL_ASSERT(size_.size() == stride_ && capacity_ >= 0);
  // The sums reachable with x_i .. x_{l-1}, as bits 0 .. capacity, grown one size at a time.
  const std::size_t bits = static_cast<std::size_t>(capacity_) + 1;
  const std::size_t words = (bits + 63) / 64;
  std::vector<std::uint64_t> reach(words), grown(words);
  for (int i = 0; i <= chain.length; ++i) {
    std::fill(reach.begin(), reach.end(), 0);
    reach[0] = 1;
    for (int l = i; l <= chain.length; ++l) {
      const std::int64_t add = l > i ? size_[static_cast<std::size_t>(l) - 1] : 0;
      if (add > 0 && add <= capacity_) {  // reach |= reach << add, within the capacity
        const auto shift_words = static_cast<std::size_t>(add) / 64;
        const auto shift_bits = static_cast<unsigned>(add % 64);
        std::fill(grown.begin(), grown.end(), 0);
        for (std::size_t w = words; w-- > shift_words;) {
          std::uint64_t v = reach[w - shift_words] << shift_bits;
          if (shift_bits != 0 && w > shift_words)
            v |= reach[w - shift_words - 1] >> (64 - shift_bits);
          grown[w] = v;
        }
        if (bits % 64 != 0) grown[words - 1] &= (std::uint64_t{1} << (bits % 64)) - 1;
        for (std::size_t w = 0; w < words; ++w) reach[w] |= grown[w];
      }
      first_[pair(i, l)] = sums_.size();
      for (std::size_t w = 0; w < words; ++w)
        for (std::uint64_t v = reach[w]; v != 0; v &= v - 1)
          sums_.push_back(
              static_cast<std::int64_t>(w * 64 + static_cast<std::size_t>(__builtin_ctzll(v))));
      count_[pair(i, l)] = sums_.size() - first_[pair(i, l)];
    }
  }
}

std::size_t HostLevels::index(int i, int l, std::int64_t k) const {
  REMAT_INTERNAL_ASSERT(k >= 0);
  const std::size_t first = first_[pair(i, l)], count = count_[pair(i, l)];
  // Every sum up to the last reachable (most long segments): the level is k itself.
  const std::int64_t last = sums_[first + count - 1];
  if (static_cast<std::size_t>(last) + 1 == count)
    return static_cast<std::size_t>(k < last ? k : last);
  const auto begin = sums_.begin() + static_cast<std::ptrdiff_t>(first);
  return static_cast<std::size_t>(
             std::upper_bound(begin, begin + static_cast<std::ptrdiff_t>(count), k) - begin) -
         1;
}

HostLayout::HostLayout(const UnitChain& chain, const HostLevels& levels)
    : chain_(chain),
      levels_(levels),
      stride_(static_cast<std::size_t>(chain.length) + 1),
      offsets_(2 * stride_ * stride_, 0) {
  for (int s = 0; s < 2; ++s)
    for (int i = 0; i <= chain.length; ++i) {
      if (s == 1 && !chain.two_states(i)) continue;
      for (int l = i; l <= chain.length; ++l) {
        offsets_[(static_cast<std::size_t>(s) * stride_ + static_cast<std::size_t>(i)) * stride_ +
                 static_cast<std::size_t>(l)] = size_;
        size_ += levels.count(i, l);
      }
    }
}

HostMinMemory::HostMinMemory(const UnitChain& c, const HostLevels& levels)
    : layout_(c, levels), values_(layout_.size(), kUnreachable) {
  for (int i = c.length; i >= 0; --i) {
    const auto ui = static_cast<std::size_t>(i);
    const int states = c.two_states(i) ? 2 : 1;
    for (int s = 0; s < states; ++s)
      values_[layout_.entry(i, i, s == 1, 0)] =
          std::max(c.forward_memory(i, i), c.backward_memory(i, s == 1));
    for (int l = i + 1; l <= c.length; ++l) {
      const auto ul = static_cast<std::size_t>(l);
      for (int s = 0; s < states; ++s) {
        const bool taped = s == 1;
        const bool offloadable = c.offloadable(i, taped);
        for (std::size_t n = 0; n < levels.count(i, l); ++n) {
          const std::int64_t k = levels.sum(i, l, n);
          std::int64_t best = kUnreachable;
          const std::int64_t rest = at(i + 1, l, true, k);
          if (rest < kUnreachable)
            best = std::max(c.chain_step_memory(i, l, taped), c.chain_shift(i, taped) + rest);
          std::int64_t lf = 0;
          for (int j = i + 1; j <= l; ++j) {
            lf = c.leaf_forwards(i, j, lf);
            const std::int64_t left = at(i, j - 1, taped, k);
            if (left >= kUnreachable) continue;
            const std::int64_t forwards = c.x[ui] + c.g[ul + 1] + lf;
            const std::int64_t left_memory = c.left_shift(l) + left;
            const std::int64_t right = at(j, l, false, k);
            if (right < kUnreachable)
              best = std::min(best, std::max({forwards, c.x[ui] + right, left_memory}));
            if (offloadable && k >= levels.size(i)) {
              const std::int64_t moved = at(j, l, false, k - levels.size(i));
              if (moved < kUnreachable)
                best =
                    std::min(best, std::max({forwards, moved,
                                             c.x[ui] + c.last_backward_memory(j, l), left_memory}));
            }
          }
          values_[layout_.entry(i, l, taped, n)] = best;
        }
      }
    }
  }
}

double HostBoundedTable::bytes_needed(const UnitChain& chain, const HostLevels& levels,
                                      const HostMinMemory& least, std::int64_t capacity) {
  double total = 0;
  for (int i = 0; i <= chain.length; ++i)
    for (int s = 0; s < (chain.two_states(i) ? 2 : 1); ++s)
      for (int l = i; l <= chain.length; ++l)
        for (std::size_t n = 0; n < levels.count(i, l); ++n) {
          const std::int64_t lo = least.at(i, l, s == 1, levels.sum(i, l, n));
          if (lo <= capacity) total += static_cast<double>(capacity - lo + 1) * sizeof(double);
        }
  return total;
}

HostBoundedTable::HostBoundedTable(const UnitChain& chain, const HostLevels& levels,
                                   const HostMinMemory& least, std::int64_t capacity, int threads)
    : chain_(chain),
      levels_(levels),
      least_(least),
      capacity_(capacity),
      layout_(chain, levels),
      rows_(layout_.size()) {
  REMAT_INTERNAL_ASSERT(capacity >= 0);
  WorkerPool pool(std::max(1, threads > 0 ? threads : available_cores()));
  arenas_.resize(static_cast<std::size_t>(pool.size()));
  std::vector<std::vector<double>> scratch(
      arenas_.size(), std::vector<double>(static_cast<std::size_t>(capacity) + 1));
  for (int i = chain.length; i >= 0; --i)
    for (int l = i; l <= chain.length; ++l) {
      const int states = chain.two_states(i) ? 2 : 1;
      const auto count = static_cast<std::int64_t>(levels.count(i, l)) * states;
      const auto row = [&](std::int64_t task, int worker) {
        const auto w = static_cast<std::size_t>(worker);
        compute_row(i, l, task % states == 1, static_cast<std::size_t>(task / states), scratch[w],
                    arenas_[w]);
      };
      // The levels of a long segment side by side; a short one's on this thread (a hand-off
      // costs more than its rows).
      if (pool.size() > 1 && count > 1 &&
          static_cast<double>(l - i) * static_cast<double>(capacity) >= kParallelWork)
        pool.run(count, row);
      else
        for (std::int64_t task = 0; task < count; ++task) row(task, 0);
    }
  for (const Arena& arena : arenas_) stored_bytes_ += arena.bytes;
}

double* HostBoundedTable::Arena::allocate(std::int64_t count) {
  if (blocks.empty() || used + count > size) {
    size = std::max(count, blocks.empty() ? kFirstBlock : std::min(2 * size, kLargestBlock));
    blocks.emplace_back(new double[static_cast<std::size_t>(size)]);
    used = 0;
    bytes += size * static_cast<std::int64_t>(sizeof(double));
  }
  double* out = blocks.back().get() + used;
  used += count;
  return out;
}

void HostBoundedTable::compute_row(int i, int l, bool taped, std::size_t n,
                                   std::vector<double>& scratch, Arena& arena) {
  const UnitChain& c = chain_;
  const auto ui = static_cast<std::size_t>(i);
  const std::int64_t k = levels_.sum(i, l, n);
  RowView& out = rows_[layout_.entry(i, l, taped, n)];
  const std::int64_t lo = least_.at(i, l, taped, k);
  if (lo > capacity_) return;  // +inf everywhere: an empty row
  if (i == l) {
    double* value = arena.allocate(1);
    *value = c.fw[ui] + c.bw[ui];
    out = RowView{value, lo, lo, *value};
    return;
  }
  const std::int64_t width = capacity_ - lo + 1;
  double* best = scratch.data();
  std::fill(best, best + width, kInfinity);
  const std::int64_t tail = c.left_shift(l);
  const bool offloadable = c.offloadable(i, taped) && k >= levels_.size(i);
  double sum = 0;
  std::int64_t lf = 0;
  for (int j = i + 1; j <= l; ++j) {
    const auto uj = static_cast<std::size_t>(j);
    sum += c.nf[uj - 1];
    lf = c.leaf_forwards(i, j, lf);
    const RowView& left = row(i, j - 1, taped, k);
    if (left.empty()) continue;
    const double prefix = sum + c.restart_after(j);
    const std::int64_t forward_lo = c.x[ui] + c.g[static_cast<std::size_t>(l) + 1] + lf;
    const RowView& right = row(j, l, false, k);
    if (!right.empty())
      relax_pair(best, lo, capacity_,
                 std::max({lo, forward_lo, c.x[ui] + right.lo, tail + left.lo}), prefix, right,
                 c.x[ui], left, tail);
    if (!offloadable) continue;
    const RowView& moved = row(j, l, false, k - levels_.size(i));
    if (!moved.empty())
      relax_pair(best, lo, capacity_,
                 std::max({lo, forward_lo, c.x[ui] + c.last_backward_memory(j, l), moved.lo,
                           tail + left.lo}),
                 prefix + c.copy_wait(i, j, sum), moved, 0, left, tail);
  }
  const RowView& rest = row(i + 1, l, true, k);
  if (!rest.empty()) {
    const std::int64_t shift = c.chain_shift(i, taped);
    relax_one(best, lo, capacity_,
              std::max({lo, c.chain_step_memory(i, l, taped), shift + rest.lo}),
              c.fw[ui] + c.bw[ui], rest, shift);
  }
  REMAT_INTERNAL_ASSERT(best[0] < kInfinity, "host-bounded row (", i, ", ", l,
                        taped ? ", taped" : "", ", ", k, ") infinite at its minimum");
  std::int64_t last = width - 1;
  while (last > 0 && best[last - 1] == best[width - 1]) --last;
  double* values = arena.allocate(last + 1);
  std::memcpy(values, best, static_cast<std::size_t>(last + 1) * sizeof(double));
  out = RowView{values, lo, lo + last, values[last]};
}

Sequence HostBoundedTable::rebuild(std::int64_t m) const {
  REMAT_INTERNAL_ASSERT(value(0, chain_.length, m, false, levels_.capacity()) < kInfinity);
  // The table as rebuild_nested reads it: the host units left as its index.
  struct Rows {
    const HostBoundedTable& table;
    double opt(int i, int l, std::int64_t memory, bool taped, std::int64_t k) const {
      return table.value(i, l, memory, taped, k);
    }
    std::int64_t copy_size(int i) const { return table.levels_.size(i); }
  };
  Sequence out;
  rebuild_nested(chain_, Rows{*this}, 0, chain_.length, m, false, levels_.capacity(), false, out);
  return out;
}

}  // namespace detail
}  // namespace remat
