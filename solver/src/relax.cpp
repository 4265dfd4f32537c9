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
#ifndef REMAT_RELAX_CHUNK
#define REMAT_RELAX_CHUNK 32
#endif
constexpr std::int64_t kChunk = REMAT_RELAX_CHUNK;

#define REMAT_RELAX_CHUNKS(CANDIDATE)              \
  std::int64_t k = 0, computed = 0;                \
  const std::int64_t chunk = kChunk;               \
  for (; k + chunk <= n; k += chunk) {             \
    {                                              \
      const std::int64_t t = k + chunk - 1;        \
      if ((CANDIDATE) >= best[k]) continue;        \
    }                                              \
    computed += chunk;                             \
    for (std::int64_t t = k; t < k + chunk; ++t) { \
      const double v = (CANDIDATE);                \
      best[t] = v < best[t] ? v : best[t];         \
    }                                              \
  }                                                \
  if (k < n) {                                     \
    {                                              \
      const std::int64_t t = n - 1;                \
      if ((CANDIDATE) >= best[k]) return computed; \
    }                                              \
    computed += n - k;                             \
    for (std::int64_t t = k; t < n; ++t) {         \
      const double v = (CANDIDATE);                \
      best[t] = v < best[t] ? v : best[t];         \
    }                                              \
  }                                                \
  return computed;

REMAT_VECTOR_CLONES
std::int64_t sum_kernel(double* __restrict best, const double* __restrict a,
                        const double* __restrict b, double c,
                        std::int64_t n){REMAT_RELAX_CHUNKS((c + a[t]) + b[t])}

REMAT_VECTOR_CLONES std::int64_t
    left_constant_kernel(double* __restrict best, const double* __restrict b, double c,
                         std::int64_t n){REMAT_RELAX_CHUNKS(c + b[t])}

REMAT_VECTOR_CLONES std::int64_t
    right_constant_kernel(double* __restrict best, const double* __restrict a, double c,
                          double right, std::int64_t n) {
  REMAT_RELAX_CHUNKS((c + a[t]) + right)
}

}  // namespace

std::int64_t relax_sum(double* best, const double* a, const double* b, double c, std::int64_t n) {
  return sum_kernel(best, a, b, c, n);
}

std::int64_t relax_left_constant(double* best, const double* b, double c, std::int64_t n) {
  return left_constant_kernel(best, b, c, n);
}

std::int64_t relax_right_constant(double* best, const double* a, double c, double right,
                                  std::int64_t n) {
  return right_constant_kernel(best, a, c, right, n);
}

std::int64_t last_improvable(const double* best, std::int64_t lo, std::int64_t capacity,
                             std::int64_t start, double constant) {
  if (best[start - lo] <= constant) return start - 1;
  return std::partition_point(best + (start - lo), best + (capacity - lo + 1),
                              [constant](double v) { return v > constant; }) -
         best + lo - 1;
}

}  // namespace detail
}  // namespace remat
