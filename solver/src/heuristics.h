#pragma once
// The heuristics' sequences (heuristics.cpp; docs/algorithms.md).

#include <cstdint>
#include <vector>

#include "remat/solver/sequence.h"

namespace remat {
namespace detail {

// Sequences of the heuristics (docs/algorithms.md).
Sequence store_all_sequence(int length);
// Griewank's binomial reversal with `snapshots` checkpoints, x_0 included (>= 1).
Sequence revolve_sequence(int length, int snapshots);

// Revolve for one chain length and every number of snapshots up to a maximum: Griewank's
// minimal forward counts t(l, s) tabulated for l <= length, s <= max_snapshots.
class RevolvePlanner {
 public:
  static constexpr std::int64_t kImpossible = std::int64_t{1} << 62;
  RevolvePlanner(int length, int max_snapshots);
  // t(steps, snapshots); kImpossible when snapshots == 0 and steps > 1.
  std::int64_t count(int steps, int snapshots) const;
  Sequence sequence(int snapshots) const;

 private:
  void reverse(int a, int b, int snapshots, Sequence& out) const;
  int length_, max_snapshots_;
  std::vector<std::int64_t> counts_;  // counts_[s * (length + 1) + l]
};
Sequence periodic_sequence(int length, int segments);
// Griewank's minimal number of forward steps to reverse `steps` steps with `snapshots`
// checkpoints: r * l - C(s + r, s + 1) with r the repetition number.
std::int64_t revolve_forward_count(std::int64_t steps, std::int64_t snapshots);

}  // namespace detail
}  // namespace remat
