#pragma once
// The min-plus kernels of the dynamic programs (persistent_dp.cpp, storage_dp.cpp): a row being
// computed is relaxed with a candidate made of one or two stored rows shifted along the memory
// axis.
//
// Every candidate and every row is non-increasing in memory: +inf below its least memory, then
// varying, then constant. So a candidate can only improve the row below the first memory where
// the row is already at most the candidate's constant part: the kernels stop at the first chunk
// of memories that starts there, and write the constant part out directly where both rows are
// constant (the row is larger there), so that the row stays the exact minimum. Before that, they
// skip every chunk whose candidate at its end is at least the row at its start (floating-point
// addition is monotone, so this holds for the rounded values too). docs/performance.md measures
// what this prunes.
//
// relax_pair and relax_one are whole functions in relax.cpp, each with an AVX2 clone chosen
// once per call: the kernels are inlined into them, so that a candidate costs one call.

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

// The row best (memories lo..capacity, non-increasing) relaxed, from memory `start` on, with
//   (prefix + right(m - shift)) + left(m - tail).
// Both rows must be non-empty; `start` at least where both are finite. Returns the number of
// candidate values computed or written (the work TableStats counts).
std::int64_t relax_pair(double* best, std::int64_t lo, std::int64_t capacity, std::int64_t start,
                        double prefix, const RowView& right, std::int64_t shift,
                        const RowView& left, std::int64_t tail);

// The row best (memories lo..capacity, non-increasing) relaxed, from memory `start` on, with
//   step + rest(m - shift).
// `rest` must be non-empty; `start` at least where it is finite. Returns the number of candidate
// values computed or written.
std::int64_t relax_one(double* best, std::int64_t lo, std::int64_t capacity, std::int64_t start,
                       double step, const RowView& rest, std::int64_t shift);

}  // namespace detail
}  // namespace remat
