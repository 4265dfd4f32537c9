#pragma once
// An independent, straightforwardly written top-down memoized implementation of the
// persistent dynamic program, from rotor's recurrence as docs/algorithms.md writes it (model v1
// only), for the tests. It works in units of `unit` bytes (sizes rounded up) and can run the
// reference's recurrence as published (`corrected = false`) or with remat's exact chain step (Fe_i
// checked with y_{l+1} live rather than y_{i+1}, see docs/algorithms.md). Corrected, it also
// counts the chain's output x_L that the caller keeps from the loss to the step's end
// (Chain::output_held), as remat does; the published recurrence does not.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

#include "remat/solver/chain.h"
#include "remat/solver/sequence.h"

namespace remat::test {

class ReferenceDp {
 public:
  ReferenceDp(const Chain& chain, std::int64_t unit, bool use_nograd, bool corrected)
      : corrected_(corrected) {
    auto units = [unit](std::int64_t b) { return (b + unit - 1) / unit; };
    length_ = chain.length();
    // Model v1: every stage keeps its whole input and output (Stage::keeping_all).
    x_.push_back(units(chain.input_bytes()));
    xb_.push_back(x_[0]);
    for (const Stage& s : chain.stages) {
      x_.push_back(units(s.out_bytes()));
      xb_.push_back(units(s.kept_bytes()));
      ft_.push_back(units(s.fwd_tmp_bytes));
      bt_.push_back(units(s.bwd_tmp_bytes));
      fw_.push_back(s.fwd_ms);
      bw_.push_back(s.bwd_ms);
      nf_.push_back(use_nograd ? s.nograd_ms() : s.fwd_ms);
    }
    x_.push_back(0);  // x[L+1]
    xb_.push_back(0);
    ft_.push_back(0);  // the loss
    bt_.push_back(units(chain.loss_tmp_bytes));
    fw_.push_back(0);
    bw_.push_back(0);
    nf_.push_back(0);
    // Every check of an operation after the loss adds the caller's x_L, except that of B_{L-1}
    // right after the loss, whose state keeps its output already (bytes rounded down).
    if (corrected && chain.output_held) {
      tail_ = x_[static_cast<std::size_t>(length_)];
      tail_kept_ = chain.stages.back().out_bytes() / unit;
    }
  }

  static constexpr double kInf = std::numeric_limits<double>::infinity();

  /// Opt[M - x[0]][0][L], +inf when infeasible (including M - x[0] <= 0).
  double solve(std::int64_t capacity) {
    const std::int64_t m = capacity - x_[0];
    if (m <= 0) return kInf;
    return opt(m, 0, length_);
  }

  /// The sequence, rebuilt with the reference's tie-breaking (leaves first by increasing j,
  /// strict improvements only, then the chain step).
  Sequence sequence(std::int64_t capacity) {
    Sequence out;
    rebuild(capacity - x_[0], 0, length_, out);
    return out;
  }

  std::int64_t x(int k) const { return x_[static_cast<std::size_t>(k)]; }

 private:
  double opt(std::int64_t m, int i, int l) {
    const auto key = std::make_tuple(m, i, l);
    const auto found = memo_.find(key);
    if (found != memo_.end()) return found->second.first;
    std::pair<double, int> result{kInf, -2};  // choice: j > i leaf, -1 chain, 0 single
    const std::size_t a = static_cast<std::size_t>(i), b = static_cast<std::size_t>(l);
    // A segment that does not reach the loss runs after it, beside the caller's x_L.
    const std::int64_t after = l < length_ ? tail_ : 0;
    if (i == l) {
      if (m >= after + std::max(x_[a + 1] + xb_[a + 1] + ft_[a],
                                x_[a] + x_[a + 1] + xb_[a + 1] + bt_[a]))
        result = {fw_[a] + bw_[a], 0};
    } else {
      std::int64_t mmin = after + x_[b + 1] + x_[a + 1] + ft_[a];
      for (int k = i + 1; k < l; ++k) {
        const auto uk = static_cast<std::size_t>(k);
        mmin = std::max(mmin, after + x_[b + 1] + x_[uk] + x_[uk + 1] + ft_[uk]);
      }
      if (m >= mmin) {
        for (int j = i + 1; j <= l; ++j) {
          const auto uj = static_cast<std::size_t>(j);
          if (m < x_[uj]) continue;
          double forwards = 0;
          for (int k = i; k < j; ++k) forwards += nf_[static_cast<std::size_t>(k)];
          const double value = forwards + opt(m - x_[uj], j, l) + opt(m, i, j - 1);
          if (value < result.first) result = {value, j};
        }
        if (corrected_) {
          // Fe_i runs with y_{l+1} live, B_i with y_{i+1} and y_i, and always after the loss.
          const std::int64_t backward_after =
              l < length_ ? tail_ : tail_ - (i + 1 == length_ ? tail_kept_ : 0);
          if (m >= after + xb_[a + 1] + ft_[a] + x_[b + 1] &&
              m >= backward_after + x_[a] + x_[a + 1] + xb_[a + 1] + bt_[a] && m >= xb_[a + 1]) {
            const double value = (fw_[a] + bw_[a]) + opt(m - xb_[a + 1], i + 1, l);
            if (value < result.first) result = {value, -1};
          }
        } else if (m >= xb_[a + 1]) {
          const double value = opt(m, i, i) + opt(m - xb_[a + 1], i + 1, l);
          if (value < result.first) result = {value, -1};
        }
      }
    }
    memo_[key] = result;
    return result.first;
  }

  void rebuild(std::int64_t m, int i, int l, Sequence& out) {
    opt(m, i, l);
    const int choice = memo_.at(std::make_tuple(m, i, l)).second;
    if (i == l) {
      if (i == length_) {
        out.push_back(loss(length_));
      } else {
        out.push_back(fe(i));
        out.push_back(bwd(i));
      }
    } else if (choice == -1) {
      out.push_back(fe(i));
      rebuild(m - xb_[static_cast<std::size_t>(i) + 1], i + 1, l, out);
      out.push_back(bwd(i));
    } else {
      const int j = choice;
      out.push_back(cf(i));
      for (int k = i + 1; k < j; ++k) out.push_back(fn(k));
      rebuild(m - x_[static_cast<std::size_t>(j)], j, l, out);
      rebuild(m, i, j - 1, out);
    }
  }

  bool corrected_;
  int length_ = 0;
  std::int64_t tail_ = 0, tail_kept_ = 0;
  std::vector<std::int64_t> x_, xb_, ft_, bt_;
  std::vector<double> fw_, bw_, nf_;
  std::map<std::tuple<std::int64_t, int, int>, std::pair<double, int>> memo_;
};

}  // namespace remat::test

namespace remat::test {

/// The dynamic program of cost model v2 (docs/algorithms.md), written top-down and memoized
/// from its math, in exact bytes: Opt(i, l, m, taped) with m the memory of the segment, x_i and
/// y_{l+1} included. Independent of solver/src: it builds its own arrays from the chain.
class ReferenceDp2 {
 public:
  static constexpr double kInf = std::numeric_limits<double>::infinity();

  ReferenceDp2(const Chain& chain, bool use_nograd) : length_(chain.length()) {
    const auto n = static_cast<std::size_t>(length_);
    for (int k = 0; k <= length_; ++k) {
      x_.push_back(chain.activation_bytes(k));
      g_.push_back(chain.gradient_bytes(k));
    }
    x_.push_back(0);
    g_.push_back(0);
    // Bytes of the members of x_k in either list.
    auto bytes_of = [&](int k, const std::vector<int>& a, const std::vector<int>& b) {
      std::int64_t total = 0;
      const auto& members = chain.members(k);
      for (std::size_t m = 0; m < members.size(); ++m) {
        const int index = static_cast<int>(m);
        if (std::count(a.begin(), a.end(), index) || std::count(b.begin(), b.end(), index))
          total += members[m].bytes;
      }
      return total;
    };
    for (std::size_t i = 0; i < n; ++i) {
      const Stage& s = chain.stages[i];
      const int k = static_cast<int>(i);
      const std::int64_t kept_out = bytes_of(k + 1, s.saved_outputs, {});
      sv_.push_back(s.state_bytes);
      gk_.push_back(s.state_bytes + kept_out);
      hf_.push_back(i == 0 ? x_[0] : bytes_of(k, s.saved_inputs, {}));
      ht_.push_back(i == 0 ? x_[0]
                           : bytes_of(k, s.saved_inputs, chain.stages[i - 1].saved_outputs));
      ft_.push_back(s.fwd_tmp_bytes);
      nt_.push_back(s.nograd_tmp_bytes());
      bt_.push_back(s.bwd_tmp_bytes);
      fw_.push_back(s.fwd_ms);
      bw_.push_back(s.bwd_ms);
      nf_.push_back(use_nograd ? s.nograd_ms() : s.fwd_ms);
    }
    sv_.push_back(0);  // the loss, pseudo-stage L
    nt_.push_back(0);
    gk_.push_back(0);
    hf_.push_back(x_[n]);
    ht_.push_back(x_[n]);
    ft_.push_back(0);
    bt_.push_back(chain.loss_tmp_bytes);
    fw_.push_back(0);
    bw_.push_back(0);
    nf_.push_back(0);
    context_ = chain.context_bytes;
    restart_ = chain.restart_ms;
    // The caller keeps x_L from the loss to the step's end: every operation after the loss
    // holds it too, B_{L-1} right after the loss sharing what its state keeps of it.
    if (chain.output_held) {
      tail_ = x_[n];
      tail_kept_ = bytes_of(length_, chain.stages.back().saved_outputs, {});
    }
  }

  /// The optimum for a budget in bytes, +inf when infeasible.
  double solve(std::int64_t budget) {
    const std::int64_t m = budget - context_;
    if (m - x_[0] < 1) return kInf;
    return opt(m, 0, length_, false);
  }

  Sequence sequence(std::int64_t budget) {
    Sequence out;
    rebuild(budget - context_, 0, length_, false, out);
    return out;
  }

 private:
  std::int64_t held(int i, bool taped) const {
    return taped ? ht_[static_cast<std::size_t>(i)] : hf_[static_cast<std::size_t>(i)];
  }
  // Here m counts the caller's x_L in the segments that run after the loss (l < L), as all
  // the operations of a segment that does not reach the loss do.
  std::int64_t after_loss(int l) const { return l < length_ ? tail_ : 0; }
  // Fe_i with y_{l+1} live, B_i with y_{i+1} and y_i (after the loss).
  bool chain_fits(std::int64_t m, int i, int l, bool taped) const {
    const auto a = static_cast<std::size_t>(i);
    // (The loss itself, i = L, holds x_L as its input.)
    const std::int64_t backward_tail = i == length_  ? 0
                                       : l < length_ ? tail_
                                                     : tail_ - (i + 1 == l ? tail_kept_ : 0);
    return m >= after_loss(l) + x_[a] + g_[static_cast<std::size_t>(l) + 1] + x_[a + 1] + sv_[a] +
                    ft_[a] &&
           m >= backward_tail + held(i, taped) + gk_[a] + g_[a + 1] + g_[a] + bt_[a];
  }

  double opt(std::int64_t m, int i, int l, bool taped) {
    if (m < 0) return kInf;
    const auto key = std::make_tuple(m, i, l, taped);
    const auto found = memo_.find(key);
    if (found != memo_.end()) return found->second.first;
    std::pair<double, int> result{kInf, -2};  // choice: j > i leaf, -1 chain step
    const auto a = static_cast<std::size_t>(i);
    if (i == l) {
      if (chain_fits(m, i, i, taped)) result = {fw_[a] + bw_[a], -1};
    } else {
      // Leaves: CF_i Fn_{i+1} .. Fn_{j-1} run with x_i and y_{l+1} live.
      std::int64_t forward = x_[a + 1] + nt_[a];
      double forwards = 0;
      for (int j = i + 1; j <= l; ++j) {
        const auto uj = static_cast<std::size_t>(j);
        forwards += nf_[uj - 1];
        if (j > i + 1) forward = std::max(forward, x_[uj - 1] + x_[uj] + nt_[uj - 1]);
        if (m < after_loss(l) + x_[a] + g_[static_cast<std::size_t>(l) + 1] + forward) continue;
        // Its left part, right after the right part's B_j, begins with a restart (none when
        // the right part is the loss alone).
        const double restart = j < length_ ? restart_ : 0.0;
        const double value =
            ((forwards + restart) + opt(m - x_[a], j, l, false)) + opt(m, i, j - 1, taped);
        if (value < result.first) result = {value, j};
      }
      if (chain_fits(m, i, l, taped)) {
        const double value = (fw_[a] + bw_[a]) + opt(m - held(i, taped) - sv_[a], i + 1, l, true);
        if (value < result.first) result = {value, -1};
      }
    }
    memo_[key] = result;
    return result.first;
  }

  void rebuild(std::int64_t m, int i, int l, bool taped, Sequence& out) {
    opt(m, i, l, taped);
    const int choice = memo_.at(std::make_tuple(m, i, l, taped)).second;
    const auto a = static_cast<std::size_t>(i);
    if (i == l) {
      if (i == length_) {
        out.push_back(loss(length_));
      } else {
        out.push_back(fe(i));
        out.push_back(bwd(i));
      }
    } else if (choice == -1) {
      out.push_back(fe(i));
      rebuild(m - held(i, taped) - sv_[a], i + 1, l, true, out);
      out.push_back(bwd(i));
    } else {
      out.push_back(cf(i));
      for (int k = i + 1; k < choice; ++k) out.push_back(fn(k));
      rebuild(m - x_[a], choice, l, false, out);
      rebuild(m, i, choice - 1, taped, out);
    }
  }

  int length_ = 0;
  std::int64_t tail_ = 0, tail_kept_ = 0;
  std::vector<std::int64_t> x_, g_, sv_, gk_, hf_, ht_, ft_, nt_, bt_;
  std::vector<double> fw_, bw_, nf_;
  std::int64_t context_ = 0;
  double restart_ = 0;
  std::map<std::tuple<std::int64_t, int, int, bool>, std::pair<double, int>> memo_;
};

}  // namespace remat::test
