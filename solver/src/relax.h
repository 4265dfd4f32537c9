#pragma once
// The min-plus kernels of the dynamic programs (persistent_dp.cpp, storage_dp.cpp): a row being
// computed is relaxed with a candidate made of one or two stored rows shifted along the memory
// axis.
//
// Every candidate and every row is non-increasing in memory: +inf below its least memory, then
// varying, then constant. So a candidate can only improve the row below the first memory where
// the row is already at most the candidate's constant part: it is evaluated up to there only,
// its constant part written out directly (the row is larger there), so that the row stays the
// exact minimum. Within that range, the kernels skip every chunk of memories whose candidate at
// its end is at least the row at its start (floating-point addition is monotone, so this holds
// for the rounded values too). docs/performance.md measures what this prunes.

#include <cstdint>
#include <limits>

namespace remat {
namespace detail {

// A stored row over memories: +inf below lo, values[m - lo] on [lo, sat], `constant`
// (values[sat - lo]) beyond; +inf everywhere when values is null.
struct RowView {
  const double* values = nullptr;
  std::int64_t lo = 0;
  std::int64_t sat = 0;
  double constant = 0;
  bool empty() const { return values == nullptr; }
  double at(std::int64_t m) const {
    if (values == nullptr || m < lo) return std::numeric_limits<double>::infinity();
    return values[(m < sat ? m : sat) - lo];
  }
};

// best[k] = min(best[k], candidate(k)) for k in [0, n), the candidate being
//   relax_sum:            (c + a[k]) + b[k]
//   relax_left_constant:  c + b[k]
//   relax_right_constant: (c + a[k]) + right
// (relax.cpp; vectorized, with an AVX2 clone where the compiler makes one). Each returns how
// many candidate values it computed: n less the memories of the chunks it skipped.
std::int64_t relax_sum(double* best, const double* a, const double* b, double c, std::int64_t n);
std::int64_t relax_left_constant(double* best, const double* b, double c, std::int64_t n);
std::int64_t relax_right_constant(double* best, const double* a, double c, double right,
                                  std::int64_t n);

// The last memory at which a candidate starting at `start` with constant part `constant` can
// improve the row best (memories lo..capacity): the last one where best is still above
// `constant`; start - 1 if none.
std::int64_t last_improvable(const double* best, std::int64_t lo, std::int64_t capacity,
                             std::int64_t start, double constant);

// The row best (memories lo..capacity, non-increasing) relaxed, from memory `start` on, with
//   (prefix + right(m - shift)) + left(m - tail).
// Both rows must be non-empty; `start` at least where both are finite. Returns the number of
// candidate values computed or written (the work TableStats counts).
inline std::int64_t relax_pair(double* best, std::int64_t lo, std::int64_t capacity,
                               std::int64_t start, double prefix, const RowView& right,
                               std::int64_t shift, const RowView& left, std::int64_t tail) {
  if (start > capacity) return 0;
  const std::int64_t right_end = shift + right.sat;  // right is constant beyond
  const std::int64_t left_end = tail + left.sat;     // left is constant beyond
  const double constant = (prefix + right.constant) + left.constant;
  const std::int64_t last = last_improvable(best, lo, capacity, start, constant);
  if (last < start) return 0;
  std::int64_t computed = 0;
  // Both rows vary on [start, min(right_end, left_end)].
  std::int64_t stop = right_end < left_end ? right_end : left_end;
  if (last < stop) stop = last;
  if (stop >= start)
    computed += relax_sum(best + (start - lo), right.values + (start - shift - right.lo),
                          left.values + (start - tail - left.lo), prefix, stop - start + 1);
  if (right_end < left_end) {  // right constant, left varying
    const std::int64_t from = start > right_end + 1 ? start : right_end + 1;
    stop = left_end < last ? left_end : last;
    if (stop >= from)
      computed += relax_left_constant(best + (from - lo), left.values + (from - tail - left.lo),
                                      prefix + right.constant, stop - from + 1);
  } else if (left_end < right_end) {  // left constant, right varying
    const std::int64_t from = start > left_end + 1 ? start : left_end + 1;
    stop = right_end < last ? right_end : last;
    if (stop >= from)
      computed += relax_right_constant(best + (from - lo), right.values + (from - shift - right.lo),
                                       prefix, left.constant, stop - from + 1);
  }
  const std::int64_t end = right_end > left_end ? right_end : left_end;
  const std::int64_t from = start > end + 1 ? start : end + 1;
  for (std::int64_t m = from; m <= last; ++m) best[m - lo] = constant;
  return computed + (last >= from ? last - from + 1 : 0);
}

// The row best (memories lo..capacity, non-increasing) relaxed, from memory `start` on, with
//   step + rest(m - shift).
// `rest` must be non-empty; `start` at least where it is finite. Returns the number of candidate
// values computed or written.
inline std::int64_t relax_one(double* best, std::int64_t lo, std::int64_t capacity,
                              std::int64_t start, double step, const RowView& rest,
                              std::int64_t shift) {
  if (start > capacity) return 0;
  const double constant = step + rest.constant;
  const std::int64_t last = last_improvable(best, lo, capacity, start, constant);
  const std::int64_t rest_end = shift + rest.sat;
  const std::int64_t stop = rest_end < last ? rest_end : last;
  std::int64_t computed = 0;
  if (stop >= start)
    computed = relax_left_constant(best + (start - lo), rest.values + (start - shift - rest.lo),
                                   step, stop - start + 1);
  const std::int64_t from = start > rest_end + 1 ? start : rest_end + 1;
  for (std::int64_t m = from; m <= last; ++m) best[m - lo] = constant;
  return computed + (last >= from ? last - from + 1 : 0);
}

}  // namespace detail
}  // namespace remat
