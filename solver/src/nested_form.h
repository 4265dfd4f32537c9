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

}  // namespace detail
}  // namespace remat
