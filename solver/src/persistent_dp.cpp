// The persistent dynamic program of Beaumont, Eyraud-Dubois, Herrmann, Joly and Shilova
// (hal-02352969), as the reference rotor implementation runs it, generalized to cost model v2
// (docs/cost-model.md: a storage counts once; a stage's backward keeps only some of its input
// and output) and with one correction.
//
// Opt(i, l, m, s): least time to go from x_i to y_i over stages i..l, given y_{l+1}, with m
// units of memory, x_i and y_{l+1} included. The state s of the segment's start says where x_i
// came from: "fresh" (a forward without autograd: after Fe_i only what stage i keeps of it
// remains, hf[i]) or "taped" (Fe_{i-1}: stage i-1 keeps part of it too, ht[i]). With the padded
// arrays of UnitChain and lf(i, j) the memory of a leaf's forwards (min_memory.cpp):
//
//   Opt(i, i, m, s) = fw[i] + bw[i]   if m >= MinMem(i, i, s), else +inf
//   Opt(i, l, m, s) = +inf            if m < MinMem(i, l, s), else the least of
//     leaf j, i < j <= l:  ((sum_{k=i}^{j-1} nf[k] + restart_after(j)) + Opt(j, l, m - x[i], fresh))
//                          + Opt(i, j-1, m - left_shift(l), s)
//                          if m >= x[i] + g[l+1] + lf(i, j)
//     chain step:          (fw[i] + bw[i]) + Opt(i+1, l, m - held(i, s) - sv[i], taped)
//                          if m >= chain_step_memory(i, l, s)
//
// A leaf's left part starts with a forward right after the right part's last operation, B_j:
// one restart (Chain::restart_ms) per leaf, except where the right part is the loss alone
// (j = L); none elsewhere.
//
// The chain step's forward is checked with y_{l+1} live; the published recurrence checks it
// with y_{i+1} (UnitChain::published_chain_step selects that form). For a chain of model v1
// (hf = ht = x, g = x) this is the reference's recurrence with m shifted by x[i].
//
// For fixed (i, l, j) the leaf is a shifted min-plus over the memory axis, evaluated as
// straight vector loops over contiguous rows. A row is +inf below MinMem(i, l, s), computed
// exactly by MinMemoryTable, and constant from the memory where it saturates, so it is stored
// as the range in between.
//
// Most of the work is pruned without changing a single value (docs/performance.md): every
// candidate and every row is non-increasing in memory, so a leaf is evaluated only below the
// first memory where the row being computed is already at most the leaf's constant part, and
// only over the chunks of memories where its value at the chunk's end is below the row at the
// chunk's start. Leaves are added by increasing j where possible, which finds good values
// early. The rows are computed in blocks of segment starts by tiles of segment ends
// (run_block), so that rows read from memory are used several times from cache; the blocks
// are pipelined over threads.
#include <algorithm>
#include <cstring>
#include <new>

#include "min_memory_table.h"
#include "nested_form.h"
#include "persistent_table.h"
#include "remat/base/check.h"
#include "unit_chain.h"
#include "worker_pool.h"

namespace remat {
namespace detail {
namespace {

// Arena blocks grow from 4 KiB to 32 MiB: small tables stay small, large ones allocate rarely.
constexpr std::int64_t kFirstArenaBlock = 512;  // doubles
constexpr std::int64_t kLargestArenaBlock =
    PersistentTable::kArenaBlockBytes / static_cast<std::int64_t>(sizeof(double));

// A block of kBlockStarts segment starts is computed kTileEnds segment ends at a time: each
// row a tile reads from memory is used for several of the rows it computes, from cache.
// (bench/solver_bench tuned both on the 2-core development machine.)
constexpr int kBlockStarts = 16;
constexpr int kTileEnds = 16;
constexpr double kPendingBytes = 4.0 * 1024 * 1024;

}  // namespace

// Plain blocks of 4 KiB pages. Offered to the kernel as huge pages (MADV_HUGEPAGE), as they were
// until 2026-12-03, a table's fresh pages cost more to fault in than the TLB saves on the
// virtual development machines: L = 1000 at 500 slots took 12.8 s instead of 8.8 s, the kernel
// zeroing each 2 MiB page at about 0.3 GB/s (docs/performance.md, "Solver").
PersistentTable::Block PersistentTable::allocate_block(std::int64_t count) {
  void* memory = std::malloc(static_cast<std::size_t>(count) * sizeof(double));
  if (memory == nullptr) throw std::bad_alloc();
  return Block(static_cast<double*>(memory));
}

PersistentTable::PersistentTable(const UnitChain& chain, const MinMemoryTable& min_memory,
                                 std::int64_t capacity, int threads)
    : chain_(chain),
      min_memory_(min_memory),
      capacity_(capacity),
      stride_(static_cast<std::size_t>(chain.length) + 1),
      rows_(stride_ * stride_) {
  for (int i = 0; i <= chain.length; ++i)
    if (chain.two_states(i)) {
      taped_rows_.resize(stride_ * stride_);
      break;
    }
  REMAT_INTERNAL_ASSERT(capacity >= 0);
  const int length = chain.length;
  const std::int64_t width = capacity + 1;
  const Plan how = plan(length, width, threads);
  const int block = how.block, tile = how.tile;
  const int blocks = (length + 1 + block - 1) / block;
  WorkerPool pool(how.workers);
  arenas_.resize(static_cast<std::size_t>(pool.size()));
  std::vector<std::vector<double>> scratch(arenas_.size());
  std::vector<TableStats> work(arenas_.size());
  const int states = taped_rows_.empty() ? 1 : 2;
  for (auto& buffer : scratch)
    buffer.resize(static_cast<std::size_t>(states * block * tile * width));

  // Block k holds segment starts [start(k), start(k) + block), from the top of the chain
  // down: it reads rows of blocks < k, so it trails block k - 1, one l at a time.
  std::vector<std::atomic<int>> progress(static_cast<std::size_t>(blocks));
  for (auto& done : progress) done = -1;
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  pool.run(blocks, [&](std::int64_t k, int worker) {
    const int end = length + 1 - static_cast<int>(k) * block;
    const int start = std::max(0, end - block);
    try {
      run_block(start, end, tile, worker, scratch[static_cast<std::size_t>(worker)].data(), width,
                k > 0 ? &progress[static_cast<std::size_t>(k - 1)] : nullptr,
                progress[static_cast<std::size_t>(k)], failed,
                work[static_cast<std::size_t>(worker)]);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  });
  if (error) std::rethrow_exception(error);
  for (const Arena& arena : arenas_) stored_bytes_ += arena.bytes;
  for (const TableStats& worker : work) stats_ += worker;
}

PersistentTable::Plan PersistentTable::plan(int length, std::int64_t width, int threads) {
  // The rows being computed, block x tile of them, are what every leaf writes: they should
  // stay in the core's cache (1 MiB at 500 slots with 16 x 16). With wide rows (many slots),
  // fewer ends per tile, then fewer starts per block.
  const double row_bytes = static_cast<double>(width) * sizeof(double);
  Plan out;
  out.block = std::min(kBlockStarts, length + 1);
  out.tile = kTileEnds;
  while (out.tile > 1 && out.block * out.tile * row_bytes > kPendingBytes) out.tile /= 2;
  while (out.block > 1 && out.block * out.tile * row_bytes > kPendingBytes) out.block /= 2;
  const int blocks = (length + 1 + out.block - 1) / out.block;
  // Automatic: one worker per available core, the small problems on the calling thread alone.
  if (threads <= 0) {
    const double work = (length + 1.0) * (length + 1.0) * (length + 1.0) / 6.0 * width;
    threads = work < 2e7 ? 1 : available_cores();
  }
  out.workers = std::max(1, std::min(threads, blocks));
  return out;
}

double* PersistentTable::allocate(int worker, std::int64_t count) {
  Arena& arena = arenas_[static_cast<std::size_t>(worker)];
  if (arena.blocks.empty() || arena.used + count > arena.size) {
    const std::int64_t grown = arena.blocks.empty() ? kFirstArenaBlock : 2 * arena.size;
    const std::int64_t size = std::max(std::min(grown, kLargestArenaBlock), count);
    arena.blocks.emplace_back(allocate_block(size));
    arena.used = 0;
    arena.size = size;
    arena.bytes += size * static_cast<std::int64_t>(sizeof(double));
  }
  double* out = arena.blocks.back().get() + arena.used;
  arena.used += count;
  return out;
}

// Computes the rows (i, l, s) for i in [start, end), every l >= i and both states s, `tile`
// values of l at a time. In a tile [l0, l1), the leaves j in [end, l0] read finished rows only
// (left rows of earlier tiles, right rows of the blocks above): they are added first, j
// ascending, each left row used for every l of the tile and each right row for every i of the
// block while in cache. The other leaves read rows of this tile or this block; they follow l
// ascending, j from l down, so that a row (j, l) of this block is finished right before it is
// first read. It stays one function of about 120 lines on purpose: it is the solver's inner
// loop, whose tiles, pruning bounds and scratch rows live in its locals and registers; split,
// they would pass through memory (docs/performance.md, "Solver": every change here is measured
// with remat_solver_bench).
void PersistentTable::run_block(int start, int end, int tile, int worker, double* scratch,
                                std::int64_t width, const std::atomic<int>* above,
                                std::atomic<int>& done, const std::atomic<bool>& failed,
                                TableStats& stats) {
  const UnitChain& c = chain_;
  const int length = c.length;
  const int count = end - start;
  const int states = taped_rows_.empty() ? 1 : 2;
  std::vector<Pending> pending(static_cast<std::size_t>(states) * static_cast<std::size_t>(count) *
                               static_cast<std::size_t>(tile));
  for (std::size_t k = 0; k < pending.size(); ++k)
    pending[k].best = scratch + static_cast<std::int64_t>(k) * width;
  // prefix[k][j] = (nf[i] + ... + nf[j-1]) + restart_after(j) for i = start + k, summed from the left
  // as rebuild() sums it, so that candidates are bit-identical; forward[k][j] = lf(i, j).
  const auto columns = static_cast<std::size_t>(length) + 2;
  // With offload, offload_prefix[k][j] = prefix[k][j] + the offloading leaf's copy_wait.
  std::vector<double> prefix(static_cast<std::size_t>(count) * columns, 0.0);
  std::vector<double> offload_prefix(c.offload() ? prefix.size() : 0, 0.0);
  std::vector<std::int64_t> forward(static_cast<std::size_t>(count) * columns, 0);
  for (int k = 0; k < count; ++k) {
    double sum = 0;
    const int i = start + k;
    std::int64_t lf = 0;
    for (int j = start + k + 1; j <= length; ++j) {
      const auto uj = static_cast<std::size_t>(j);
      const std::size_t at = static_cast<std::size_t>(k) * columns + uj;
      sum += c.nf[uj - 1];
      lf = c.leaf_forwards(i, j, lf);
      prefix[at] = sum + c.restart_after(j);
      if (c.offload()) offload_prefix[at] = prefix[at] + c.copy_wait(start + k, j, sum);
      forward[at] = lf;
    }
  }
  const auto prefix_of = [&](int i, int j) {
    return prefix[static_cast<std::size_t>(i - start) * columns + static_cast<std::size_t>(j)];
  };
  // The least memory at which leaf j of row (i, l) can run its forwards.
  const auto forward_lo = [&](int i, int j, int l) {
    return c.x[static_cast<std::size_t>(i)] + c.g[static_cast<std::size_t>(l) + 1] +
           forward[static_cast<std::size_t>(i - start) * columns + static_cast<std::size_t>(j)];
  };
  const auto states_of = [&](int i) { return c.two_states(i) ? states : 1; };
  // Leaf j of row (i, l, s), and where x_i may be offloaded in state s, the offloading leaf: its
  // right part has all the memory, and x_i is prefetched beside the right part's last backward.
  const auto add_leaves = [&](int i, int j, int l, int s, const Row& left, const Row& right,
                              Pending& p) {
    const auto ui = static_cast<std::size_t>(i);
    add_leaf(c.x[ui], c.left_shift(l), forward_lo(i, j, l), prefix_of(i, j), left, right, p,
             stats);
    if (!c.offloadable(i, s == 1)) return;
    const std::size_t at =
        static_cast<std::size_t>(i - start) * columns + static_cast<std::size_t>(j);
    add_leaf(0, c.left_shift(l),
             std::max(forward_lo(i, j, l), c.x[ui] + c.last_backward_memory(j, l)),
             offload_prefix[at], left, right, p, stats);
  };
  const auto wait_above = [&](int l) {
    if (above == nullptr || l < end) return true;  // rows (j, l), j >= end: blocks above
    while (above->load(std::memory_order_acquire) < l) {
      if (failed.load(std::memory_order_relaxed)) return false;
      std::this_thread::yield();
    }
    return true;
  };
  for (int l0 = start; l0 <= length; l0 += tile) {
    const int l1 = std::min(length + 1, l0 + tile);
    const auto slot = [&](int i, int s, int l) -> Pending& {
      return pending[(static_cast<std::size_t>(s) * static_cast<std::size_t>(count) +
                      static_cast<std::size_t>(i - start)) *
                         static_cast<std::size_t>(tile) +
                     static_cast<std::size_t>(l - l0)];
    };
    const auto finish = [&](int i, int l) {
      for (int s = 0; s < states_of(i); ++s) finish_row(i, l, s == 1, worker, slot(i, s, l), stats);
    };
    for (int l = l0; l < l1; ++l) {
      const int top = std::min(end - 1, l - 1);  // rows (i, l), i <= top, have leaves
      for (int i = start; i <= top; ++i)
        for (int s = 0; s < states_of(i); ++s) begin_row(i, l, s == 1, slot(i, s, l));
    }
    // Leaves j in [end, l0] of every row of the tile: they read finished rows only.
    if (end <= l0) {
      if (!wait_above(l1 - 1)) return;
      for (int j = end; j <= l0; ++j) {
        for (int i = start; i < end; ++i) {
          for (int s = 0; s < states_of(i); ++s) {
            const Row& left = row(i, j - 1, s == 1);
            if (left.empty()) continue;
            for (int l = l0; l < l1; ++l) {
              Pending& p = slot(i, s, l);
              const Row& right = row(j, l);
              if (p.active && !right.empty()) add_leaves(i, j, l, s, left, right, p);
            }
          }
        }
      }
    }
    // The other leaves, l ascending.
    for (int l = l0; l < l1; ++l) {
      if (!wait_above(l)) return;
      if (l < end) single_row(l, worker);
      const int top = std::min(end - 1, l - 1);
      for (int j = l; j > start; --j) {
        if (j <= top) finish(j, l);
        if (j >= end && j <= l0) continue;  // added above
        const Row& right = row(j, l);
        if (right.empty()) continue;
        const int last = std::min(j - 1, top);
        for (int i = start; i <= last; ++i) {
          for (int s = 0; s < states_of(i); ++s) {
            Pending& p = slot(i, s, l);
            if (!p.active) continue;
            const Row& left = row(i, j - 1, s == 1);
            if (!left.empty()) add_leaves(i, j, l, s, left, right, p);
          }
        }
      }
      if (start <= top) finish(start, l);
      done.store(l, std::memory_order_release);
    }
  }
}

void PersistentTable::single_row(int i, int worker) {
  for (int s = 0; s < (chain_.two_states(i) ? 2 : 1); ++s) {
    const std::int64_t lo = min_memory_.at(i, i, s == 1);
    if (lo > capacity_) continue;  // +inf everywhere: an empty row
    double* value = allocate(worker, 1);
    *value = chain_.fw[static_cast<std::size_t>(i)] + chain_.bw[static_cast<std::size_t>(i)];
    row(i, i, s == 1) = Row{value, lo, lo, *value};
  }
}

void PersistentTable::begin_row(int i, int l, bool taped, Pending& p) {
  p.lo = min_memory_.at(i, l, taped);
  p.active = p.lo <= capacity_;
  if (!p.active) return;
  const std::int64_t n = capacity_ - p.lo + 1;
  std::fill(p.best, p.best + n, kInfinity);
}

// Leaf j of row (i, l, s): (prefix + Opt(j, l, m - x[i], fresh)) + Opt(i, j-1, m - tail, s)
// (tail = left_shift: the caller's x_L when the left part runs after the loss), from
// m = forward_lo on.
void PersistentTable::add_leaf(std::int64_t shift, std::int64_t tail, std::int64_t forward_lo,
                               double prefix, const Row& left, const Row& right, Pending& p,
                               TableStats& stats) {
  const std::int64_t start = std::max({p.lo, forward_lo, shift + right.lo, tail + left.lo});
  ++stats.candidates;
  stats.values += relax_pair(p.best, p.lo, capacity_, start, prefix, right, shift, left, tail);
}

// Adds the chain step to row (i, l, s) and stores the row.
void PersistentTable::finish_row(int i, int l, bool taped, int worker, Pending& p,
                                 TableStats& stats) {
  if (!p.active) return;
  const UnitChain& c = chain_;
  const auto ui = static_cast<std::size_t>(i);
  const std::int64_t lo = p.lo;
  double* best = p.best;
  // Chain step: Fe_i, reverse i+1..l (x_{i+1} taped), B_i.
  const Row& rest = row(i + 1, l, true);
  if (!rest.empty()) {
    const std::int64_t shift = c.chain_shift(i, taped);
    ++stats.candidates;
    stats.values += relax_one(best, lo, capacity_,
                              std::max({lo, c.chain_step_memory(i, l, taped), shift + rest.lo}),
                              c.fw[ui] + c.bw[ui], rest, shift);
  }
  const std::int64_t n = capacity_ - lo + 1;
  REMAT_INTERNAL_ASSERT(best[0] < kInfinity, "row (", i, ", ", l, taped ? ", taped" : "",
                        ") infinite at its minimum");
  std::int64_t last = n - 1;
  while (last > 0 && best[last - 1] == best[n - 1]) --last;
  double* values = allocate(worker, last + 1);
  std::memcpy(values, best, static_cast<std::size_t>(last + 1) * sizeof(double));
  row(i, l, taped) = Row{values, lo, lo + last, values[last]};
}

Sequence PersistentTable::rebuild(std::int64_t m, bool fewest_copies) const {
  REMAT_INTERNAL_ASSERT(value(0, chain_.length, m) < kInfinity);
  // The table as rebuild_nested reads it: no host index.
  struct Rows {
    const PersistentTable& table;
    double opt(int i, int l, std::int64_t memory, bool taped, std::int64_t) const {
      return table.value(i, l, memory, taped);
    }
    std::int64_t copy_size(int) const { return 0; }
  };
  Sequence out;
  rebuild_nested(chain_, Rows{*this}, 0, chain_.length, m, false, 0, fewest_copies, out);
  return out;
}

}  // namespace detail
}  // namespace remat
