#pragma once
/// Pictures of schedules, trade-offs and profiles as standalone SVG (no dependency): they open
/// in any browser, are laid out for 1200 px and stay readable for chains of 300+ stages
/// (operations and stages are aggregated when there are more than pixels to show them).
///
///   remat::Solution s = remat::solve(chain, remat::SolveOptions(700LL << 20));
///   remat::write_text_file("schedule.svg", remat::schedule_svg(chain, s));  // solver/files.h
///
/// The root element carries the figures it shows as data-* attributes (peak, makespan,
/// budget, ...), and every mark its own (data-op, data-budget-bytes, ...), so that a test or
/// a script can check a picture against the numbers it was drawn from.

#include <cstdint>
#include <string>

#include "remat/base/files.h"  // write_text_file
#include "remat/solver/chain.h"
#include "remat/solver/solver.h"
#include "remat/solver/tradeoff.h"

namespace remat {

struct PlotOptions {
  /// Width of the picture in pixels.
  REMAT_ARG(int, width) = 1200;
  /// Title; empty: one made from the chain and the result.
  REMAT_ARG(std::string, title) = "";
  /// At most this many operation marks on a timeline; beyond, consecutive operations of the
  /// same kind are drawn as one mark.
  REMAT_ARG(int, max_op_marks) = 800;
};

/// Timeline of a feasible solution: one row of operations over predicted time (Fe, Fn, CF,
/// B, L in distinct colors, stage indices where they fit), and beneath it live memory over
/// time split into checkpoints, saved activations, gradients and temporaries, with the
/// budget line and the peak marked. Throws std::invalid_argument for an infeasible solution.
std::string schedule_svg(const Chain& chain, const Solution& solution,
                         const PlotOptions& options = PlotOptions());

/// Makespan against budget: optimal, revolve and the best periodic as curves, every periodic
/// segment count as a point, store-all marked.
std::string tradeoff_svg(const Chain& chain, const Tradeoff& tradeoff,
                         const PlotOptions& options = PlotOptions());

/// Per-stage bars: forward and backward times above, saved and output bytes below.
std::string profile_svg(const Chain& chain, const PlotOptions& options = PlotOptions());

}  // namespace remat
