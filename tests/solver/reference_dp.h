#pragma once
// An independent, straightforwardly written top-down memoized implementation of the
// persistent dynamic program, from the math in shared/reference/rotor-model.md, for the tests.
// It works in units of `unit` bytes (sizes rounded up) and can run the reference's recurrence
// as published (`corrected = false`) or with remat's exact chain step (Fe_i checked with
// y_{l+1} live rather than y_{i+1}, see docs/algorithms.md).

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
    x_.push_back(units(chain.input_bytes));
    xb_.push_back(x_[0]);
    for (const Stage& s : chain.stages) {
      x_.push_back(units(s.out_bytes));
      xb_.push_back(units(s.saved_bytes));
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
    if (i == l) {
      if (m >= std::max(x_[a + 1] + xb_[a + 1] + ft_[a], x_[a] + x_[a + 1] + xb_[a + 1] + bt_[a]))
        result = {fw_[a] + bw_[a], 0};
    } else {
      std::int64_t mmin = x_[b + 1] + x_[a + 1] + ft_[a];
      for (int k = i + 1; k < l; ++k) {
        const auto uk = static_cast<std::size_t>(k);
        mmin = std::max(mmin, x_[b + 1] + x_[uk] + x_[uk + 1] + ft_[uk]);
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
          // Fe_i runs with y_{l+1} live, B_i with y_{i+1} and y_i.
          if (m >= xb_[a + 1] + ft_[a] + x_[b + 1] &&
              m >= x_[a] + x_[a + 1] + xb_[a + 1] + bt_[a] && m >= xb_[a + 1]) {
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
  std::vector<std::int64_t> x_, xb_, ft_, bt_;
  std::vector<double> fw_, bw_, nf_;
  std::map<std::tuple<std::int64_t, int, int>, std::pair<double, int>> memo_;
};

}  // namespace remat::test
