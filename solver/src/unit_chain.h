#pragma once
// The chain as the optimal solver's dynamic programs see it: sizes in memory units, the loss
// as a pseudo-stage (UnitChain), made by make_unit_chain (unit_chain.cpp).

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "remat/solver/chain.h"

namespace remat {
namespace detail {

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();

// How errors name a chain the caller built: `chain 'NAME'`, or `chain` when it has no name.
inline std::string chain_source(const Chain& chain) {
  return chain.name.empty() ? std::string("chain") : "chain '" + chain.name + "'";
}

// The chain as the dynamic program sees it, in memory units (sizes rounded up), with the loss
// as a pseudo-stage L. Activations x_0..x_{L+1} (x[L+1] = g[L+1] = 0), stages 0..L:
//   x[k]   size of the activation x_k (every member; a carried one counted again here, which
//          can only overstate memory), g[k] size of its gradient y_k;
//   sv[i]  what stage i's autograd state holds besides its input and x_{i+1};
//   gk[i]  its autograd state with the kept members of x_{i+1} (state_bytes + saved outputs);
//   hf[i]  what remains of x_i after its forward with autograd when x_i was made by a forward
//          without autograd ("fresh"): the members stage i keeps. hf[0] = x[0] (the caller
//          holds the input), hf[L] = x[L] (the loss reads its input while it runs);
//   ht[i]  the same when x_i came from Fe_{i-1} ("taped"): stage i-1 also keeps its kept
//          outputs, so the members either stage keeps remain;
//   ft[i], nt[i], bt[i] temporaries of the forward with and without autograd and of the
//          backward (bt[L]: the loss);
//   fw, bw, nf times (forward with autograd, backward, forward without), 0 for the loss.
// A chain of model v1 (every stage keeps its input and output) has hf = ht = x and
// gk = the stage's saved_bytes: the reference's `xb`.
struct UnitChain {
  int length = 0;
  std::vector<std::int64_t> x, g;            // 0..L+1
  std::vector<std::int64_t> sv, gk, hf, ht;  // 0..L
  std::vector<std::int64_t> ft, nt, bt;      // 0..L
  std::vector<double> fw, bw, nf;            // 0..L
  double restart = 0;                        // Chain::restart_ms
  // The restart of a leaf j: its left part starts right after B_j, unless j = L (the right
  // part is the loss alone).
  double restart_after(int j) const { return j < length ? restart : 0.0; }
  // Context tensors: held by the caller for the whole step.
  std::int64_t context = 0;
  // The chain's output x_L, held by the caller from the loss to the step's end
  // (Chain::output_held): every operation after the loss also holds `tail` = x[L], except
  // that B_{L-1} right after the loss (the chain step of a segment (L-1, L)) finds the part its
  // autograd state keeps already counted: `tail_shared`, rounded down. A segment (i, l) with
  // l < L runs wholly after the loss: it has `tail` less of its memory for itself. 0 and 0
  // when the output is let go, and in the published recurrence (the reference does not model
  // it).
  std::int64_t tail = 0, tail_shared = 0;
  // Check the chain step as the published recurrence does (docs/algorithms.md).
  bool published_chain_step = false;
  // Offload (docs/cost-model.md, "Offload"): a leaf may copy its segment's start x_i to host
  // memory while its forwards run, free it on the device for its right part, and copy it back
  // during the right part's last backward. Empty where the chain has no link or offload is off;
  // else, for 0..L: cd[i], ch[i] the times of x_i's copies out and back; pinned[i] whether
  // stage i-1's autograd state keeps a member of x_i (then x_i is offloaded only where it was
  // made without autograd: its segments have two states).
  std::vector<double> cd, ch;
  std::vector<bool> pinned;

  bool offload() const { return !cd.empty(); }
  // Whether a leaf of a segment starting at x_i in this state may offload x_i: x_0 is the
  // caller's, and the loss's input x_L starts no leaf.
  bool offloadable(int i, bool taped) const {
    return offload() && i >= 1 && i < length && !(taped && pinned[static_cast<std::size_t>(i)]);
  }
  // Whether segments starting at i differ between the two states (fresh, taped).
  bool two_states(int i) const {
    const auto a = static_cast<std::size_t>(i);
    return hf[a] != ht[a] || (offload() && pinned[a]);
  }
  // The memory of the last operation of a right part (j, l), its B_j (the loss where j = L),
  // the caller's x_L counted whole after the loss (never less than the operation takes): with
  // the prefetched x_i beside it, the condition of an offloading leaf.
  std::int64_t last_backward_memory(int j, int l) const {
    return backward_memory(j, false) + (l == length && j < length ? tail : 0);
  }
  // The time an offloading leaf (i, j) waits for its copies beyond its forwards' time `sweep`
  // (nf[i] + ... + nf[j-1]): the copy out overlaps the forwards, the copy back B_j and the
  // restart after it.
  double copy_wait(int i, int j, double sweep) const {
    const auto a = static_cast<std::size_t>(i);
    const double out = cd[a] - sweep;
    const double back = ch[a] - (bw[static_cast<std::size_t>(j)] + restart_after(j));
    return (out > 0 ? out : 0.0) + (back > 0 ? back : 0.0);
  }
  std::int64_t held(int i, bool taped) const {
    return taped ? ht[static_cast<std::size_t>(i)] : hf[static_cast<std::size_t>(i)];
  }
  // Memory of the chain step of segment (i, l) (x_i included):
  //   Fe_i: x[i] + g[l+1] + x[i+1] + sv[i] + ft[i]    (y_{l+1} is live; published: y_{i+1})
  //   B_i:  held(i) + gk[i] + g[i+1] + g[i] + bt[i]
  std::int64_t forward_memory(int i, int l) const {
    const auto a = static_cast<std::size_t>(i);
    const std::int64_t live_gradient =
        published_chain_step ? g[a + 1] : g[static_cast<std::size_t>(l) + 1];
    return x[a] + live_gradient + x[a + 1] + sv[a] + ft[a];
  }
  std::int64_t backward_memory(int i, bool taped) const {
    const auto a = static_cast<std::size_t>(i);
    return held(i, taped) + gk[a] + g[a + 1] + g[a] + bt[a];
  }
  // The memory of the chain step of segment (i, l): B_i runs after the loss when l = L.
  std::int64_t chain_step_memory(int i, int l, bool taped) const {
    const std::int64_t forward = forward_memory(i, l);
    std::int64_t backward = backward_memory(i, taped);
    if (l == length) backward += tail - (i + 1 == length ? tail_shared : 0);
    return forward > backward ? forward : backward;
  }
  // lf(i, j), what a leaf's forwards CF_i Fn_{i+1} .. Fn_{j-1} need beyond x_i (each forward's
  // input, output and temporary, the largest), from lf(i, j-1) given as `previous` (ignored
  // for j = i + 1): the leaves of a segment are swept by increasing j.
  std::int64_t leaf_forwards(int i, int j, std::int64_t previous) const {
    const auto a = static_cast<std::size_t>(j);
    if (j == i + 1) return x[a] + nt[a - 1];
    const std::int64_t next = x[a - 1] + x[a] + nt[a - 1];
    return next > previous ? next : previous;
  }
  // What the caller's x_L takes from the memory of the left part (i, j-1) of a leaf of
  // segment (i, l): all of it after the loss, i.e. when l = L.
  std::int64_t left_shift(int l) const { return l == length ? tail : 0; }
  // What the chain step keeps outside the rest of the segment: the remains of x_i and the
  // autograd state (x_{i+1} belongs to the rest).
  std::int64_t chain_shift(int i, bool taped) const {
    return held(i, taped) + sv[static_cast<std::size_t>(i)];
  }
};
// With `offload`, the chain's link (if it has one) gives the copies' times.
UnitChain make_unit_chain(const Chain& chain, std::int64_t unit_bytes, bool use_nograd_time,
                          bool published_chain_step = false, bool offload = false);

}  // namespace detail
}  // namespace remat
