#pragma once
// Pieces of the sequences the dynamic programs rebuild, in rotor's nested form.

#include <cstdint>

#include "remat/base/check.h"
#include "remat/solver/sequence.h"
#include "unit_chain.h"

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
inline void finish_offload_leaf(int i, Sequence& out) { out.insert(out.end() - 1, prefetch(i)); }

// The sequence that achieves a table's Opt(i, l, m, state, k), appended to `out`: the persistent
// table's (PersistentTable, k unused) and the one under a bound on host memory
// (HostBoundedTable, k the host units left). `table` gives
//   double opt(int i, int l, std::int64_t m, bool taped, std::int64_t k) const;
//   std::int64_t copy_size(int i) const;  // the host units of x_i's copy (0 without a bound)
// Each candidate is computed as the table computed it, so that the optimum is found equal: the
// reference keeps the first strict improvement over leaves by increasing j (a leaf before its
// offloading form), then the chain step. With fewest_copies, the plain leaves and the chain
// step come before every offloading leaf (fewer copies on the host where they tie).
template <class Table>
void rebuild_nested(const UnitChain& c, const Table& table, int i, int l, std::int64_t m,
                    bool taped, std::int64_t k, bool fewest_copies, Sequence& out) {
  if (i == l) {
    append_single_stage(i, c.length, out);
    return;
  }
  const auto ui = static_cast<std::size_t>(i);
  const double target = table.opt(i, l, m, taped, k);
  const std::int64_t rest = m - c.x[ui];
  const std::int64_t tail = c.left_shift(l);
  const bool may_offload = c.offloadable(i, taped) && k >= table.copy_size(i);
  const auto leaves = [&](bool plain, bool offloading) {
    double prefix = 0;
    std::int64_t lf = 0;
    for (int j = i + 1; j <= l; ++j) {
      prefix += c.nf[static_cast<std::size_t>(j) - 1];
      lf = c.leaf_forwards(i, j, lf);
      if (m < c.x[ui] + c.g[static_cast<std::size_t>(l) + 1] + lf) continue;
      if (plain && rest >= 0 &&
          ((prefix + c.restart_after(j)) + table.opt(j, l, rest, false, k)) +
                  table.opt(i, j - 1, m - tail, taped, k) ==
              target) {
        append_leaf_forwards(i, j, out);
        rebuild_nested(c, table, j, l, rest, false, k, fewest_copies, out);
        rebuild_nested(c, table, i, j - 1, m - tail, taped, k, fewest_copies, out);
        return true;
      }
      if (offloading && may_offload && m >= c.x[ui] + c.last_backward_memory(j, l)) {
        const std::int64_t moved = k - table.copy_size(i);  // what x_i's copy leaves
        if (((prefix + c.restart_after(j)) + c.copy_wait(i, j, prefix)) +
                table.opt(j, l, m, false, moved) + table.opt(i, j - 1, m - tail, taped, k) ==
            target) {
          append_offload_leaf_forwards(i, j, out);
          rebuild_nested(c, table, j, l, m, false, moved, fewest_copies, out);
          finish_offload_leaf(i, out);
          rebuild_nested(c, table, i, j - 1, m - tail, taped, k, fewest_copies, out);
          return true;
        }
      }
    }
    return false;
  };
  const std::int64_t after = m - c.chain_shift(i, taped);
  const bool chain_ok = after >= 0 && m >= c.chain_step_memory(i, l, taped) &&
                        (c.fw[ui] + c.bw[ui]) + table.opt(i + 1, l, after, true, k) == target;
  if (fewest_copies ? leaves(true, false) || (!chain_ok && leaves(false, true))
                    : leaves(true, true))
    return;
  REMAT_INTERNAL_ASSERT(chain_ok, "no choice reaches Opt(", i, ", ", l, ", ", m,
                        taped ? ", taped" : "", ", host ", k, ")");
  out.push_back(fe(i));
  rebuild_nested(c, table, i + 1, l, after, true, k, fewest_copies, out);
  out.push_back(bwd(i));
}

}  // namespace detail
}  // namespace remat
