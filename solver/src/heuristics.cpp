#include "heuristics.h"

#include <algorithm>
#include <cmath>

#include "remat/base/check.h"

namespace remat {
namespace detail {

Sequence store_all_sequence(int length) {
  Sequence out;
  for (int i = 0; i < length; ++i) out.push_back(fe(i));
  out.push_back(loss(length));
  for (int i = length - 1; i >= 0; --i) out.push_back(bwd(i));
  return out;
}

Sequence periodic_sequence(int length, int segments) {
  REMAT_CHECK(segments >= 1 && segments <= length, "periodic: segments (", segments,
              ") must be between 1 and the number of stages (", length, ")");
  // torch.utils.checkpoint.checkpoint_sequential: K - 1 segments of floor(L / K) stages run
  // without autograd, keeping their first input; the last segment (the rest) runs with
  // autograd; each earlier segment is recomputed with autograd just before its backward.
  const int size = length / segments;
  const int last_start = (segments - 1) * size;
  Sequence out;
  for (int a = 0; a < last_start; a += size) {
    out.push_back(cf(a));
    for (int k = a + 1; k < a + size; ++k) out.push_back(fn(k));
  }
  for (int k = last_start; k < length; ++k) out.push_back(fe(k));
  out.push_back(loss(length));
  for (int k = length - 1; k >= last_start; --k) out.push_back(bwd(k));
  for (int a = last_start - size; a >= 0; a -= size) {
    for (int k = a; k < a + size; ++k) out.push_back(fe(k));
    for (int k = a + size - 1; k >= a; --k) out.push_back(bwd(k));
  }
  return out;
}

namespace {

// C(n, k) saturating at a large value (only compared against step counts <= 2^31).
std::int64_t binomial(std::int64_t n, std::int64_t k) {
  if (k < 0 || k > n) return 0;
  k = std::min(k, n - k);
  constexpr std::int64_t kCap = std::int64_t{1} << 62;
  std::int64_t result = 1;
  for (std::int64_t t = 1; t <= k; ++t) {
    // result * (n - k + t) / t stays exact: result is C(n - k + t - 1, t - 1).
    const std::int64_t numerator = n - k + t;
    if (result > kCap / numerator) return kCap;
    result = result * numerator / t;
  }
  return result;
}

}  // namespace

std::int64_t revolve_forward_count(std::int64_t steps, std::int64_t snapshots) {
  if (steps <= 1) return 0;
  if (snapshots <= 0) return -1;  // impossible
  // Repetition number r: the least r with C(s + r, s) >= l.
  std::int64_t r = 0;
  while (binomial(snapshots + r, snapshots) < steps) ++r;
  return r * steps - binomial(snapshots + r, snapshots + 1);
}

RevolvePlanner::RevolvePlanner(int length, int max_snapshots)
    : length_(length), max_snapshots_(std::max(1, std::min(max_snapshots, length))) {
  const auto width = static_cast<std::size_t>(length_) + 1;
  counts_.assign(static_cast<std::size_t>(max_snapshots_ + 1) * width, kImpossible);
  counts_[0] = counts_[1] = 0;  // no snapshot: only 0 or 1 step can be reversed
  for (int s = 1; s <= max_snapshots_; ++s) {
    std::int64_t r = 0;
    for (int l = 0; l <= length_; ++l) {
      if (l <= 1) {
        counts_[static_cast<std::size_t>(s) * width + static_cast<std::size_t>(l)] = 0;
        continue;
      }
      while (binomial(s + r, s) < l) ++r;  // r grows with l: amortized over the row
      counts_[static_cast<std::size_t>(s) * width + static_cast<std::size_t>(l)] =
          r * l - binomial(s + r, s + 1);
    }
  }
}

std::int64_t RevolvePlanner::count(int steps, int snapshots) const {
  return counts_[static_cast<std::size_t>(snapshots) * (static_cast<std::size_t>(length_) + 1) +
                 static_cast<std::size_t>(steps)];
}

// Reverses stages [a, b) from x_a (present) given y_b (or the loss when b == L), with
// `snapshots` checkpoint slots, x_a's included: advance k steps, keep x_{a+k}, reverse
// [a+k, b) with one slot fewer, then [a, a+k). f(k) = k + t(l-k, s-1) + t(k, s) is convex in k
// (t is convex in l), so the first minimizer is found by bisection on its slope.
void RevolvePlanner::reverse(int a, int b, int snapshots, Sequence& out) const {
  const int steps = b - a;
  if (steps == 1) {
    out.push_back(fe(a));
    if (b == length_) out.push_back(loss(length_));
    out.push_back(bwd(a));
    return;
  }
  REMAT_INTERNAL_ASSERT(snapshots >= 1);
  auto cost = [&](int k) {
    const std::int64_t right = count(steps - k, snapshots - 1);
    return right >= kImpossible ? kImpossible : k + right + count(k, snapshots);
  };
  int lo = 1, hi = steps - 1;
  if (snapshots == 1) lo = hi;  // no slot left for x_{a+k}: advance to the last step
  // The first k with cost(k + 1) >= cost(k) is the first minimizer
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (cost(mid + 1) >= cost(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  const int advance = lo;
  REMAT_INTERNAL_ASSERT(cost(advance) == count(steps, snapshots), "revolve split");
  out.push_back(cf(a));
  for (int k = a + 1; k < a + advance; ++k) out.push_back(fn(k));
  reverse(a + advance, b, snapshots - 1, out);
  reverse(a, a + advance, snapshots, out);
}

Sequence RevolvePlanner::sequence(int snapshots) const {
  REMAT_CHECK(snapshots >= 1, "revolve needs at least one checkpoint (x_0)");
  Sequence out;
  reverse(0, length_, std::min(snapshots, max_snapshots_), out);
  return out;
}

Sequence revolve_sequence(int length, int snapshots) {
  return RevolvePlanner(length, snapshots).sequence(snapshots);
}

}  // namespace detail
}  // namespace remat
