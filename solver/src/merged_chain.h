#pragma once
// Chains rewritten for the dynamic program (merge.cpp): x_0's members pinned as context, runs
// of stages that carry a member merged into one.

#include <optional>
#include <vector>

#include "remat/solver/chain.h"
#include "remat/solver/sequence.h"

namespace remat {
namespace detail {

// The chain with the members of x_0 that have no gradient and that stage 0 carries on moved into
// the context, from every activation that carries them (merge.cpp): the caller holds x_0 for the whole step, so such a storage
// is live from start to end either way, counted once, as the context is. Every sequence has the same
// peak, time and live memory on both chains; the dynamic program, which counts a carried member
// in every activation it is in, counts these once. None when nothing is to move, or when an
// activation would be left without a member.
std::optional<Chain> pin_input_members(const Chain& chain);
// SolveOptions::merge_carried_runs (merge.cpp): the chain with every run of stages that carry a
// member over their inner activations merged into one stage. first[c] is the chain's first
// stage in merged stage c, first.back() = L. A merged stage runs its stages in order (Fe, or
// CF then Fn, or Fn), its backwards in reverse; its fields are such that an expanded sequence
// runs on the chain in the merged chain's time, never above its peak, and with the same live
// memory after each merged operation.
struct MergedChain {
  Chain chain;
  std::vector<int> first;
};
// No merged chain when no run has two stages (nothing is carried over an inner activation), or
// when merging would pass the chain limits (sums of times or sizes).
std::optional<MergedChain> merge_carried_runs(const Chain& chain);
// A sequence of the merged chain as a sequence of the chain.
Sequence expand_merged(const Sequence& merged, const std::vector<int>& first);

}  // namespace detail
}  // namespace remat
