#pragma once
// Pieces of the sequences the dynamic programs rebuild, in rotor's nested form.

#include "remat/solver/sequence.h"

namespace remat {
namespace detail {

// Pieces of rotor's nested form, shared by the sequences the tables rebuild: a segment (i, i)
// (the loss at the chain's end, else Fe_i B_i), and a leaf's forwards CF_i Fn_{i+1} .. Fn_{j-1}.
inline void append_single_stage(int i, int length, Sequence& out) {
  if (i == length) {
    out.push_back(loss(length));
  } else {
    out.push_back(fe(i));
    out.push_back(bwd(i));
  }
}
inline void append_leaf_forwards(int i, int j, Sequence& out) {
  out.push_back(cf(i));
  for (int k = i + 1; k < j; ++k) out.push_back(fn(k));
}
// An offloading leaf (docs/cost-model.md, "Offload"): O_i, its forwards, E_i; then its right
// part, with P_i before the right part's last operation (finish_offload_leaf), then its left
// part.
inline void append_offload_leaf_forwards(int i, int j, Sequence& out) {
  out.push_back(offload(i));
  append_leaf_forwards(i, j, out);
  out.push_back(evict(i));
}
inline void finish_offload_leaf(int i, Sequence& out) {
  out.insert(out.end() - 1, prefetch(i));
}

}  // namespace detail
}  // namespace remat
