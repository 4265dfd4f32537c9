#include <algorithm>
#include <limits>

#include "min_memory_table.h"
#include "nested_form.h"
#include "remat/base/check.h"
#include "unit_chain.h"

namespace remat {
namespace detail {

namespace {

// min over j of max(a + column[k], c + row[k], b + forward[k]) for k in [0, n): the leaf
// choices (c: the caller's x_L beside the left parts, when they run after the loss).
template <class T>
T min_of_max_body(T a, const T* __restrict column, T c, const T* __restrict row, T b,
                  const T* __restrict forward, std::size_t n) {
  T best = std::numeric_limits<T>::max();
  for (std::size_t k = 0; k < n; ++k) {
    const T right = a + column[k];
    const T left = c + row[k];
    const T leaf = b + forward[k];
    T v = right > left ? right : left;
    v = leaf > v ? leaf : v;
    best = v < best ? v : best;
  }
  return best;
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define REMAT_MIN_OF_MAX_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define REMAT_MIN_OF_MAX_CLONES
#endif

REMAT_MIN_OF_MAX_CLONES
std::int64_t min_of_max(std::int64_t a, const std::int64_t* __restrict column, std::int64_t c,
                        const std::int64_t* __restrict row, std::int64_t b,
                        const std::int64_t* __restrict forward, std::size_t n) {
  return min_of_max_body(a, column, c, row, b, forward, n);
}

REMAT_MIN_OF_MAX_CLONES
std::int32_t min_of_max(std::int32_t a, const std::int32_t* __restrict column, std::int32_t c,
                        const std::int32_t* __restrict row, std::int32_t b,
                        const std::int32_t* __restrict forward, std::size_t n) {
  return min_of_max_body(a, column, c, row, b, forward, n);
}

// The memory an offloading leaf j of segment (i, l) needs (lf = lf(i, j)), given
// right = MinMem(j, l, fresh) and left = MinMem(i, j-1, s): its forwards with x_i, its right
// part without it, x_i prefetched beside the right part's last backward, its left part.
std::int64_t offload_leaf_memory(const UnitChain& c, int i, int j, int l, std::int64_t lf,
                                 std::int64_t right, std::int64_t left) {
  const std::int64_t x = c.x[static_cast<std::size_t>(i)];
  return std::max({x + c.g[static_cast<std::size_t>(l) + 1] + lf, right,
                   x + c.last_backward_memory(j, l), c.left_shift(l) + left});
}

// Below 2^29, sums of two clamped values stay within 32 bits.
constexpr std::int64_t kNarrowLimit = std::int64_t{1} << 29;

}  // namespace

// With lf(i, j) = max(x[i+1] + nt[i], max_{i<k<j} x[k] + x[k+1] + nt[k]) (the forwards of a
// leaf's CF_i Fn_{i+1} .. Fn_{j-1}), for both states s of a segment start:
//
// MinMem(i, i, s) = max(forward_memory(i, i), backward_memory(i, s))
// MinMem(i, l, s) = min( min_{i<j<=l} max(x[i] + g[l+1] + lf(i, j), x[i] + MinMem(j, l, fresh),
//                                         left_shift(l) + MinMem(i, j-1, s)),
//                        max(chain_step_memory(i, l, s), chain_shift(i, s) + MinMem(i+1, l, taped))
//                        )
//
// and, where x_i may be offloaded (UnitChain::offloadable), the offloading leaves
//   min_{i<j<=l} max(x[i] + g[l+1] + lf(i, j), MinMem(j, l, fresh),
//                    x[i] + last_backward_memory(j, l), left_shift(l) + MinMem(i, j-1, s))
// (the published recurrence also bounds every row below by x[i] + g[l+1] + lf(i, l)): the
// conditions under which the dynamic program's row (i, l) is finite.
//
// Every term is built from the chain's sizes by +, max and min, all non-decreasing, with
// non-negative terms: computing on values clamped to C = exact_up_to + 1 gives min(MinMem, C)
// exactly (a term that reaches C stays at least C). When C is below 2^29 the table is
// computed in 32-bit integers, twice as many per vector instruction.
MinMemoryTable::MinMemoryTable(const UnitChain& c, std::int64_t exact_up_to)
    : stride_(static_cast<std::size_t>(c.length) + 1) {
  REMAT_INTERNAL_ASSERT(exact_up_to >= 0);
  if (exact_up_to < kNarrowLimit)
    build<std::int32_t>(c, exact_up_to + 1);
  else
    build<std::int64_t>(c, std::numeric_limits<std::int64_t>::max() / 4);
}

template <class T>
void MinMemoryTable::build(const UnitChain& c, std::int64_t limit) {
  const int length = c.length;
  const auto clamp = [limit](std::int64_t v) { return static_cast<T>(v < limit ? v : limit); };
  bool any_taped = false;
  for (int i = 0; i <= length; ++i) any_taped = any_taped || c.two_states(i);
  // Rows of the tables (mm[i * stride + l] = MinMem(i, l, .)) and the fresh one's columns,
  // transposed (mm_t[l * stride + j] = MinMem(j, l, fresh)), so that the leaf loop reads
  // memory contiguously.
  std::vector<T> mm(stride_ * stride_, 0), mm_t(stride_ * stride_, 0);
  std::vector<T> tp(any_taped ? stride_ * stride_ : 0, 0);
  std::vector<T> forward(stride_ + 1, 0);  // forward[j] = lf(i, j)
  auto table = [&](bool taped) -> std::vector<T>& { return taped ? tp : mm; };
  auto at = [&](int i, int l, bool taped) -> T& {
    const bool two = taped && c.two_states(i);
    return table(two)[static_cast<std::size_t>(i) * stride_ + static_cast<std::size_t>(l)];
  };
  for (int i = length; i >= 0; --i) {
    const auto ui = static_cast<std::size_t>(i);
    const int states = c.two_states(i) ? 2 : 1;
    for (int s = 0; s < states; ++s) {
      const bool taped = s == 1;
      at(i, i, taped) = clamp(std::max(c.forward_memory(i, i), c.backward_memory(i, taped)));
    }
    mm_t[ui * stride_ + ui] = at(i, i, false);
    std::int64_t lf = 0;
    for (int l = i + 1; l <= length; ++l) {
      const auto ul = static_cast<std::size_t>(l);
      lf = c.leaf_forwards(i, l, lf);
      forward[ul] = clamp(lf);  // lf(i, l)
      const T a = clamp(c.x[ui]);
      const T b = clamp(c.x[ui] + c.g[ul + 1]);
      for (int s = 0; s < states; ++s) {
        const bool taped = s == 1;
        const std::vector<T>& rows = table(taped && c.two_states(i));
        const std::int64_t leaf =
            min_of_max(a, &mm_t[ul * stride_ + ui + 1], clamp(c.left_shift(l)),
                       &rows[ui * stride_ + ui], b, &forward[ui + 1], ul - ui);
        const std::int64_t chain_step =
            std::max(c.chain_step_memory(i, l, taped),
                     c.chain_shift(i, taped) + std::int64_t{at(i + 1, l, true)});
        std::int64_t best = std::min(leaf, chain_step);
        if (c.offloadable(i, taped)) {
          for (int j = i + 1; j <= l; ++j) {
            const auto uj = static_cast<std::size_t>(j);
            best = std::min(best, offload_leaf_memory(c, i, j, l, forward[uj], mm_t[ul * stride_ + uj],
                                                      rows[ui * stride_ + uj - 1]));
          }
        }
        if (c.published_chain_step) best = std::max(best, c.x[ui] + c.g[ul + 1] + lf);
        at(i, l, taped) = clamp(best);
      }
      mm_t[ul * stride_ + ui] = at(i, l, false);
    }
  }
  // Starts with one state read the same row in both.
  if (any_taped)
    for (int i = 0; i <= length; ++i)
      if (!c.two_states(i))
        std::copy_n(&mm[static_cast<std::size_t>(i) * stride_], stride_,
                    &tp[static_cast<std::size_t>(i) * stride_]);
  mm_.assign(mm.begin(), mm.end());
  taped_.assign(tp.begin(), tp.end());
}

// Among the sequences that need MinMem(0, L), the fastest: at each segment, of the choices
// that reach its MinMem, the one whose parts (each again the fastest at its own MinMem) take
// the least time. A lexicographic dynamic program (memory, then time) over the segments.
class MinMemoryTable::LeastMemory {
 public:
  LeastMemory(const MinMemoryTable& table, const UnitChain& chain)
      : t_(table),
        c_(chain),
        stride_(static_cast<std::size_t>(chain.length) + 1),
        time_(2 * stride_ * stride_, -1.0),
        choice_(2 * stride_ * stride_, kNone) {}

  // The least time of a sequence reversing (i, l) from `taped` in MinMem(i, l, taped).
  double time(int i, int l, bool taped) {
    const std::size_t k = key(i, l, taped);
    if (time_[k] >= 0) return time_[k];
    const auto ui = static_cast<std::size_t>(i);
    if (i == l) {
      time_[k] = c_.fw[ui] + c_.bw[ui];
      return time_[k];
    }
    const std::int64_t target = t_.at(i, l, taped);
    double best = kInfinity;
    int best_choice = kNone;  // j for a leaf, -j for an offloading one, 0 for the chain step
    std::int64_t lf = 0;
    double prefix = 0;
    for (int j = i + 1; j <= l; ++j) {
      const auto uj = static_cast<std::size_t>(j);
      prefix += c_.nf[uj - 1];
      lf = c_.leaf_forwards(i, j, lf);
      const std::int64_t leaf =
          std::max({c_.x[ui] + c_.g[static_cast<std::size_t>(l) + 1] + lf,
                    c_.x[ui] + t_.at(j, l, false), c_.left_shift(l) + t_.at(i, j - 1, taped)});
      if (leaf == target) {
        const double candidate =
            (prefix + c_.restart_after(j)) + time(j, l, false) + time(i, j - 1, taped);
        if (candidate < best) best = candidate, best_choice = j;
      }
      if (c_.offloadable(i, taped) &&
          offload_leaf_memory(c_, i, j, l, lf, t_.at(j, l, false), t_.at(i, j - 1, taped)) ==
              target) {
        const double candidate = ((prefix + c_.restart_after(j)) + c_.copy_wait(i, j, prefix)) +
                                 time(j, l, false) + time(i, j - 1, taped);
        if (candidate < best) best = candidate, best_choice = -j;
      }
    }
    const std::int64_t chain_step = std::max(c_.chain_step_memory(i, l, taped),
                                             c_.chain_shift(i, taped) + t_.at(i + 1, l, true));
    if (chain_step == target) {
      const double candidate = c_.fw[ui] + c_.bw[ui] + time(i + 1, l, true);
      if (candidate < best) best = candidate, best_choice = 0;
    }
    REMAT_INTERNAL_ASSERT(best_choice != kNone, "no choice reaches MinMem(", i, ", ", l,
                          taped ? ", taped" : "", ") = ", target);
    time_[k] = best;
    choice_[k] = best_choice;
    return best;
  }

  void rebuild(int i, int l, bool taped, Sequence& out) {
    if (i == l) {
      append_single_stage(i, c_.length, out);
      return;
    }
    time(i, l, taped);
    const int j = choice_[key(i, l, taped)];
    if (j > 0) {
      append_leaf_forwards(i, j, out);
      rebuild(j, l, false, out);
      rebuild(i, j - 1, taped, out);
    } else if (j < 0) {
      append_offload_leaf_forwards(i, -j, out);
      rebuild(-j, l, false, out);
      finish_offload_leaf(i, out);
      rebuild(i, -j - 1, taped, out);
    } else {
      out.push_back(fe(i));
      rebuild(i + 1, l, true, out);
      out.push_back(bwd(i));
    }
  }

 private:
  static constexpr int kNone = std::numeric_limits<int>::min();
  std::size_t key(int i, int l, bool taped) const {
    const bool two = taped && c_.two_states(i);
    return (two ? stride_ * stride_ : 0) + static_cast<std::size_t>(i) * stride_ +
           static_cast<std::size_t>(l);
  }
  const MinMemoryTable& t_;
  const UnitChain& c_;
  std::size_t stride_;
  std::vector<double> time_;
  std::vector<int> choice_;
};

Sequence MinMemoryTable::least_memory_sequence(const UnitChain& chain) const {
  // The published recurrence bounds whole rows, not choices: no choice need reach them.
  REMAT_INTERNAL_ASSERT(!chain.published_chain_step);
  LeastMemory search(*this, chain);
  Sequence out;
  search.rebuild(0, chain.length, false, out);
  return out;
}

bool fits(const UnitChain& chain, const MinMemoryTable& table, std::int64_t capacity_units) {
  const std::int64_t frame = capacity_units - chain.context;
  return frame - chain.x[0] >= 1 && frame >= table.at(0, chain.length);
}

}  // namespace detail
}  // namespace remat
