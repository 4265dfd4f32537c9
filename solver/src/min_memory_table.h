#pragma once
// The least memory each segment of a UnitChain can be reversed in (min_memory.cpp).

#include <cstdint>
#include <limits>
#include <vector>

#include "remat/solver/sequence.h"
#include "unit_chain.h"

namespace remat {
namespace detail {

// MinMem(i, l, state): the least memory (units, x_i and y_{l+1} included) with which stages
// i..l can be reversed under the persistent model: the first finite entry of each row of the
// dynamic program. docs/algorithms.md writes out its recurrence.
class MinMemoryTable {
 public:
  // at(i, l, taped) is exact up to exact_up_to; a larger MinMem reads as some value above it
  // (which is all the dynamic program and fits() need to know of it).
  explicit MinMemoryTable(const UnitChain& chain,
                          std::int64_t exact_up_to = std::numeric_limits<std::int64_t>::max());
  std::int64_t at(int i, int l, bool taped = false) const {
    const std::size_t k = static_cast<std::size_t>(i) * stride_ + static_cast<std::size_t>(l);
    return taped && !taped_.empty() ? taped_[k] : mm_[k];
  }
  // The fastest sequence that reverses the whole chain in at(0, L) units (of the choices that
  // reach each segment's MinMem, the fastest). The table must be exact (the default
  // exact_up_to) and `chain` the one it was built from.
  Sequence least_memory_sequence(const UnitChain& chain) const;

 private:
  class LeastMemory;
  template <class T>
  void build(const UnitChain& chain, std::int64_t limit);
  std::size_t stride_;
  std::vector<std::int64_t> mm_;     // fresh: mm_[i * stride + l]
  std::vector<std::int64_t> taped_;  // taped (empty when no segment start has two states)
};

// Whether the chain fits in `capacity_units` (x_0 and the context included).
bool fits(const UnitChain& chain, const MinMemoryTable& table, std::int64_t capacity_units);

}  // namespace detail
}  // namespace remat
