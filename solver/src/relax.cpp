// The kernels of relax.h.
#include "relax.h"

#include <algorithm>

namespace remat {
namespace detail {
namespace {

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define REMAT_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define REMAT_VECTOR_CLONES
#endif

// A chunk of kChunk memories at a time: a chunk whose candidate at its end is at least best at
// its start cannot improve best and is skipped without reading it. The last, shorter chunk is
// tested the same way. Each kernel returns how many candidate values it computed (the memories
// of the chunks it did not skip): the work that TableStats counts.
constexpr std::int64_t kChunk = 32;

#define REMAT_RELAX_CHUNKS(CANDIDATE)               \
  std::int64_t k = 0, computed = 0;                 \
  for (; k + kChunk <= n; k += kChunk) {            \
    {                                               \
      const std::int64_t t = k + kChunk - 1;        \
      if ((CANDIDATE) >= best[k]) continue;         \
    }                                               \
    computed += kChunk;                             \
    for (std::int64_t t = k; t < k + kChunk; ++t) { \
      const double v = (CANDIDATE);                 \
      best[t] = v < best[t] ? v : best[t];          \
    }                                               \
  }                                                 \
  if (k < n) {                                      \
    {                                               \
      const std::int64_t t = n - 1;                 \
      if ((CANDIDATE) >= best[k]) return computed;  \
    }                                               \
    computed += n - k;                              \
    for (std::int64_t t = k; t < n; ++t) {          \
      const double v = (CANDIDATE);                 \
      best[t] = v < best[t] ? v : best[t];          \
    }                                               \
  }                                                 \
  return computed;

// best[k] = min(best[k], candidate(k)) for k in [0, n), the candidate being
//   relax_sum:            (c + a[k]) + b[k]
//   relax_left_constant:  c + b[k]
//   relax_right_constant: (c + a[k]) + right
// Inlined into each clone of relax_pair and relax_one, and vectorized there.
inline std::int64_t relax_sum(double* __restrict best, const double* __restrict a,
                              const double* __restrict b, double c, std::int64_t n) {
  REMAT_RELAX_CHUNKS((c + a[t]) + b[t])
}

inline std::int64_t relax_left_constant(double* __restrict best, const double* __restrict b,
                                        double c, std::int64_t n) {
  REMAT_RELAX_CHUNKS(c + b[t])
}

inline std::int64_t relax_right_constant(double* __restrict best, const double* __restrict a,
                                         double c, double right, std::int64_t n) {
  REMAT_RELAX_CHUNKS((c + a[t]) + right)
}

// The last memory at which a candidate starting at `start` with constant part `constant` can
// improve the row best (memories lo..capacity): the last one where best is still above
// `constant`; start - 1 if none.
inline std::int64_t last_improvable(const double* best, std::int64_t lo, std::int64_t capacity,
                                    std::int64_t start, double constant) {
  if (best[start - lo] <= constant) return start - 1;
  return std::partition_point(best + (start - lo), best + (capacity - lo + 1),
                              [constant](double v) { return v > constant; }) -
         best + lo - 1;
}

}  // namespace

REMAT_VECTOR_CLONES
std::int64_t relax_pair(double* best, std::int64_t lo, std::int64_t capacity, std::int64_t start,
                        double prefix, const RowView& right, std::int64_t shift,
                        const RowView& left, std::int64_t tail) {
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

REMAT_VECTOR_CLONES
std::int64_t relax_one(double* best, std::int64_t lo, std::int64_t capacity, std::int64_t start,
                       double step, const RowView& rest, std::int64_t shift) {
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
