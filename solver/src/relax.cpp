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
// tested the same way. Every candidate is at least its constant part `floor`, and best is
// non-increasing: from the first chunk whose start is at most `floor` on, nothing can improve,
// and the kernel stops there. Each kernel returns how many candidate values it computed (the
// memories of the chunks it did not skip): the work that TableStats counts.
constexpr std::int64_t kChunk = 32;

#define REMAT_RELAX_CHUNKS(CANDIDATE)               \
  std::int64_t k = 0, computed = 0;                 \
  for (; k + kChunk <= n; k += kChunk) {            \
    if (best[k] <= floor) return computed;          \
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
    if (best[k] <= floor) return computed;          \
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
// and at least `floor` everywhere. Inlined into each clone of relax_pair and relax_one, and
// vectorized there.
inline std::int64_t relax_sum(double* __restrict best, const double* __restrict a,
                              const double* __restrict b, double c, double floor, std::int64_t n) {
  REMAT_RELAX_CHUNKS((c + a[t]) + b[t])
}

inline std::int64_t relax_left_constant(double* __restrict best, const double* __restrict b,
                                        double c, double floor, std::int64_t n) {
  REMAT_RELAX_CHUNKS(c + b[t])
}

inline std::int64_t relax_right_constant(double* __restrict best, const double* __restrict a,
                                         double c, double right, double floor, std::int64_t n) {
  REMAT_RELAX_CHUNKS((c + a[t]) + right)
}

// best[k] = min(best[k], constant) for k in [0, n): best is non-increasing, so that is
// best[k] = constant up to the first k where best is at most constant already.
inline std::int64_t fill_constant(double* best, double constant, std::int64_t n) {
  std::int64_t k = 0;
  while (k < n && best[k] > constant) best[k++] = constant;
  return k;
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
  std::int64_t computed = 0;
  // Both rows vary on [start, min(right_end, left_end)].
  const std::int64_t stop = std::min({right_end, left_end, capacity});
  if (stop >= start)
    computed +=
        relax_sum(best + (start - lo), right.values + (start - shift - right.lo),
                  left.values + (start - tail - left.lo), prefix, constant, stop - start + 1);
  // Where one row is constant and the other varies, then where both are constant (each part
  // stops at once where the row is at most `constant` already).
  const std::int64_t from = std::max(start, stop + 1);
  const std::int64_t end = std::min(std::max(right_end, left_end), capacity);
  if (end >= from) {
    if (right_end < left_end)
      computed += relax_left_constant(best + (from - lo), left.values + (from - tail - left.lo),
                                      prefix + right.constant, constant, end - from + 1);
    else
      computed += relax_right_constant(best + (from - lo), right.values + (from - shift - right.lo),
                                       prefix, left.constant, constant, end - from + 1);
  }
  const std::int64_t rest = std::max(from, end + 1);
  if (rest > capacity) return computed;
  return computed + fill_constant(best + (rest - lo), constant, capacity - rest + 1);
}

REMAT_VECTOR_CLONES
std::int64_t relax_one(double* best, std::int64_t lo, std::int64_t capacity, std::int64_t start,
                       double step, const RowView& rest, std::int64_t shift) {
  if (start > capacity) return 0;
  const double constant = step + rest.constant;
  const std::int64_t stop = std::min(shift + rest.sat, capacity);
  std::int64_t computed = 0;
  if (stop >= start)
    computed = relax_left_constant(best + (start - lo), rest.values + (start - shift - rest.lo),
                                   step, constant, stop - start + 1);
  const std::int64_t from = std::max(start, stop + 1);
  if (from > capacity) return computed;
  return computed + fill_constant(best + (from - lo), constant, capacity - from + 1);
}

}  // namespace detail
}  // namespace remat
