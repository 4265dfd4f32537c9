#pragma once
// An independent optimality oracle for the tests: the fastest schedule of a small chain
// within a budget, found by searching every valid sequence of operations (Dijkstra over
// memory states), with its own memory bookkeeping written from docs/cost-model.md. It shares
// no code with the solver or the simulator: only the Chain struct (the input) and Op (to spell
// its answer).
//
// The search space: every order of forwards with autograd (Fe_i), forwards without autograd
// (Fn_i; CF_i is the same operation), the loss and the backwards, where the runtime may drop
// any activation value it holds at any time for free (the simulator drops a value right after
// the last operation that reads it, which is the best such choice for a given order). One
// restriction: an activation is never recomputed while a storage of its previous copy is still
// alive (an autograd state keeps it): with it, each storage has at most one copy, and a state is
// a set of holders. No algorithm of remat produces such a recomputation. The exception is the
// output x_L that the caller keeps from the loss to the step's end (Chain::output_held): a
// storage of it made again leaves the caller an old copy, counted apart.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "remat/solver/chain.h"
#include "remat/solver/sequence.h"

namespace remat::test {

class ExhaustiveOracle {
 public:
  static constexpr double kInf = std::numeric_limits<double>::infinity();

  explicit ExhaustiveOracle(const Chain& chain, bool use_nograd_time = true)
      : chain_(chain), length_(chain.length()), nograd_(use_nograd_time) {
    // The storage of each member: a carried member is its source's storage.
    roots_.resize(static_cast<std::size_t>(length_) + 1);
    for (std::size_t m = 0; m < chain.inputs.size(); ++m)
      roots_[0].push_back(new_root(chain.inputs[m]));
    for (int i = 0; i < length_; ++i) {
      const Stage& stage = chain.stages[static_cast<std::size_t>(i)];
      for (const Member& member : stage.outputs)
        roots_[static_cast<std::size_t>(i) + 1].push_back(
            member.carried_from >= 0
                ? roots_[static_cast<std::size_t>(i)][static_cast<std::size_t>(member.carried_from)]
                : new_root(member));
    }
  }

  /// Peak and makespan of a valid sequence by this bookkeeping, each value dropped right after
  /// the last operation that reads it before it is made again. Throws std::logic_error for
  /// an operation the state does not allow.
  std::pair<std::int64_t, double> evaluate(const Sequence& sequence) const {
    State s;
    std::int64_t peak = memory(s);
    double time = 0;
    for (std::size_t p = 0; p < sequence.size(); ++p) {
      const Op& op = sequence[p];
      bool found = false;
      for (const Move& move : moves(s)) {
        const bool same =
            move.op.kind == OpKind::kForwardNoGrad
                ? (op.kind == OpKind::kForwardNoGrad || op.kind == OpKind::kForwardCheckpoint) &&
                      op.stage == move.op.stage
                : move.op == op && move.op.stage == op.stage;
        if (!same || move.op.stage < 0) continue;
        s = move.to;
        peak = std::max(peak, move.memory);
        time += move.cost;
        found = true;
        break;
      }
      if (!found) throw std::logic_error("oracle: " + op.str() + " is not allowed here");
      // Drop the values no later operation reads before they are made again.
      for (int k = 1; k <= length_; ++k) {
        if (!(s.values >> k & 1u)) continue;
        bool needed = false;
        for (std::size_t q = p + 1; q < sequence.size(); ++q) {
          const Op& later = sequence[q];
          if ((later.kind == OpKind::kLoss && k == length_) ||
              (later.is_forward() && later.stage == k)) {
            needed = true;
            break;
          }
          if (later.is_forward() && later.stage + 1 == k) break;
        }
        if (!needed) s.values &= ~(1u << k);
      }
    }
    if (s.frontier != 0) throw std::logic_error("oracle: the sequence does not reach y_0");
    return {peak, time};
  }

  /// Every sequence of rotor's nested form (docs/algorithms.md): a segment (i, l) either runs
  /// CF_i Fn_{i+1} .. Fn_{j-1}, then (j, l), then (i, j-1); or Fe_i, then (i+1, l), then B_i.
  std::vector<Sequence> nested_sequences() const { return nested(0, length_); }

  /// The least makespan of a valid sequence whose every operation fits in `budget` bytes
  /// (+inf if none), and one such sequence.
  std::pair<double, Sequence> solve(std::int64_t budget) const {
    const State start;
    if (memory(start) > budget) return {kInf, {}};
    using Item = std::pair<double, State>;
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue;
    std::map<State, double> best;
    std::map<State, std::pair<State, Op>> parent;
    best[start] = 0;
    queue.push({0, start});
    while (!queue.empty()) {
      const auto [time, state] = queue.top();
      queue.pop();
      if (time > best[state]) continue;
      if (state.frontier == 0) return {time, path(parent, state, start)};
      for (const Move& move : moves(state)) {
        if (move.memory > budget) continue;
        const double next = time + move.cost;
        const auto found = best.find(move.to);
        if (found == best.end() || next < found->second) {
          best[move.to] = next;
          parent[move.to] = {state, move.op};
          queue.push({next, move.to});
        }
      }
    }
    return {kInf, {}};
  }

 private:
  // values: bit k set when x_k is held as a value (bit 0 always: the caller's input);
  // graphs: bit i set when stage i's autograd state is alive; frontier: -1 before the loss,
  // then the k of the one gradient y_k held (stages k..L-1 are backpropagated); caller, old:
  // bit r set when the caller's x_L holds storage r's current copy, or an older one;
  // after_backward: the last operation was a backward (a forward now is a restart, which costs
  // Chain::restart_ms more).
  struct State {
    std::uint32_t values = 1u, graphs = 0u;
    int frontier = -1;
    std::uint32_t caller = 0u, old = 0u;
    bool after_backward = false;
    bool operator<(const State& o) const {
      return std::tie(values, graphs, frontier, caller, old, after_backward) <
             std::tie(o.values, o.graphs, o.frontier, o.caller, o.old, o.after_backward);
    }
    bool operator>(const State& o) const { return o < *this; }
  };
  struct Move {
    State to;
    Op op;
    double cost;
    std::int64_t memory;  // during the operation
  };
  static constexpr Op kDrop{OpKind::kLoss, -1};  // stage -1: dropping a value (no operation)

  int new_root(const Member& member) {
    if (sizes_.size() >= 32) throw std::logic_error("oracle: more than 32 storages");
    sizes_.push_back(member.bytes);
    // Its gradient's size, where it has one (Member::grad_bytes, else its own size).
    gradient_sizes_.push_back(member.grad ? member.grad_bytes.value_or(member.bytes) : 0);
    return static_cast<int>(sizes_.size()) - 1;
  }
  const Stage& stage(int i) const { return chain_.stages[static_cast<std::size_t>(i)]; }
  const std::vector<int>& roots(int k) const { return roots_[static_cast<std::size_t>(k)]; }

  // Which storages are alive in a state (values and autograd states), plus the states' own
  // bytes; gradients apart.
  std::int64_t memory(const State& s, int gradient_a = -2, int gradient_b = -2) const {
    std::vector<bool> alive(sizes_.size(), false), gradient(sizes_.size(), false);
    std::int64_t total = chain_.context_bytes;
    for (int k = 0; k <= length_; ++k)
      if (s.values >> k & 1u)
        for (const int r : roots(k)) alive[static_cast<std::size_t>(r)] = true;
    for (std::size_t r = 0; r < sizes_.size(); ++r) {
      if (s.caller >> r & 1u) alive[r] = true;
      if (s.old >> r & 1u) total += sizes_[r];
    }
    for (int i = 0; i < length_; ++i) {
      if (!(s.graphs >> i & 1u)) continue;
      total += stage(i).state_bytes;
      for (const int m : stage(i).saved_inputs)
        alive[static_cast<std::size_t>(roots(i)[static_cast<std::size_t>(m)])] = true;
      for (const int m : stage(i).saved_outputs)
        alive[static_cast<std::size_t>(roots(i + 1)[static_cast<std::size_t>(m)])] = true;
    }
    for (const int k : {s.frontier, gradient_a, gradient_b}) {
      if (k < 0) continue;
      const std::vector<Member>& members = chain_.members(k);
      // y_L: the members the loss differentiates (Member::loss_gradient); a gradient the loss
      // does not give is made by the backward that reads its member, y_{L-1}'s.
      for (std::size_t m = 0; m < members.size(); ++m)
        if (members[m].grad && (k < length_ || members[m].loss_gradient))
          gradient[static_cast<std::size_t>(roots(k)[m])] = true;
    }
    for (std::size_t r = 0; r < sizes_.size(); ++r)
      total += (alive[r] ? sizes_[r] : 0) + (gradient[r] ? gradient_sizes_[r] : 0);
    return total;
  }

  // Whether a new member of x_k still has a live storage (the one-copy restriction).
  bool copy_alive(const State& s, int k) const {
    std::vector<bool> fresh(sizes_.size(), false);
    for (std::size_t m = 0; m < roots(k).size(); ++m)
      if (chain_.members(k)[m].carried_from < 0)
        fresh[static_cast<std::size_t>(roots(k)[m])] = true;
    for (int b = 0; b <= length_; ++b)
      if (s.values >> b & 1u)
        for (const int r : roots(b))
          if (fresh[static_cast<std::size_t>(r)]) return true;
    for (int i = 0; i < length_; ++i) {
      if (!(s.graphs >> i & 1u)) continue;
      for (const int m : stage(i).saved_inputs)
        if (fresh[static_cast<std::size_t>(roots(i)[static_cast<std::size_t>(m)])]) return true;
      for (const int m : stage(i).saved_outputs)
        if (fresh[static_cast<std::size_t>(roots(i + 1)[static_cast<std::size_t>(m)])]) return true;
    }
    return false;
  }

  std::vector<Move> moves(const State& s) const {
    std::vector<Move> out;
    for (int k = 1; k <= length_; ++k)
      if (s.values >> k & 1u) {
        State to = s;
        to.values &= ~(1u << k);
        out.push_back({to, kDrop, 0, memory(to)});
      }
    for (int i = 0; i < length_; ++i) {
      if (!(s.values >> i & 1u)) continue;               // input not held
      if (s.frontier >= 0 && i >= s.frontier) continue;  // already backpropagated
      if (copy_alive(s, i + 1)) continue;                // one copy at a time
      const Stage& st = stage(i);
      const double restart = s.after_backward ? chain_.restart_ms : 0.0;
      State no_grad = s;
      no_grad.values |= 1u << (i + 1);
      no_grad.after_backward = false;
      // New copies of the output's own members: the caller's become old ones.
      for (std::size_t m = 0; m < roots(i + 1).size(); ++m) {
        const auto r = static_cast<std::uint32_t>(roots(i + 1)[m]);
        if (st.outputs[m].carried_from < 0 && (no_grad.caller >> r & 1u)) {
          no_grad.caller &= ~(1u << r);
          no_grad.old |= 1u << r;
        }
      }
      out.push_back({no_grad, fn(i), (nograd_ ? st.nograd_ms() : st.fwd_ms) + restart,
                     memory(no_grad) + st.nograd_tmp_bytes()});
      if (!(s.graphs >> i & 1u)) {
        State grad = no_grad;
        grad.graphs |= 1u << i;
        out.push_back({grad, fe(i), st.fwd_ms + restart, memory(grad) + st.fwd_tmp_bytes});
      }
    }
    if (s.frontier < 0 && (s.values >> length_ & 1u)) {
      State to = s;
      to.frontier = length_;
      if (chain_.output_held)
        for (const int r : roots(length_)) to.caller |= 1u << r;
      out.push_back({to, loss(length_), 0, memory(to) + chain_.loss_tmp_bytes});
    }
    if (s.frontier > 0 && (s.graphs >> (s.frontier - 1) & 1u)) {
      const int i = s.frontier - 1;
      State during = s;
      during.frontier = i;
      State to = during;
      to.graphs &= ~(1u << i);
      to.after_backward = true;
      out.push_back(
          {to, bwd(i), stage(i).bwd_ms, memory(during, s.frontier) + stage(i).bwd_tmp_bytes});
    }
    return out;
  }

  std::vector<Sequence> nested(int i, int l) const {
    if (i == l) return {i == length_ ? Sequence{loss(length_)} : Sequence{fe(i), bwd(i)}};
    std::vector<Sequence> out;
    for (int j = i + 1; j <= l; ++j) {
      Sequence head{cf(i)};
      for (int k = i + 1; k < j; ++k) head.push_back(fn(k));
      for (const Sequence& right : nested(j, l))
        for (const Sequence& left : nested(i, j - 1)) {
          Sequence s = head;
          s.insert(s.end(), right.begin(), right.end());
          s.insert(s.end(), left.begin(), left.end());
          out.push_back(std::move(s));
        }
    }
    for (const Sequence& rest : nested(i + 1, l)) {
      Sequence s{fe(i)};
      s.insert(s.end(), rest.begin(), rest.end());
      s.push_back(bwd(i));
      out.push_back(std::move(s));
    }
    return out;
  }

  Sequence path(const std::map<State, std::pair<State, Op>>& parent, State state,
                const State& start) const {
    Sequence out;
    while (!(!(state < start) && !(start < state))) {
      const auto& [from, op] = parent.at(state);
      if (op.stage >= 0 || op.kind != OpKind::kLoss) out.insert(out.begin(), op);
      state = from;
    }
    return out;
  }

  const Chain& chain_;
  int length_;
  bool nograd_;
  std::vector<std::int64_t> sizes_;
  std::vector<std::int64_t> gradient_sizes_;
  std::vector<std::vector<int>> roots_;
};

}  // namespace remat::test
