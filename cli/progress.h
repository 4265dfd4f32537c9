#pragma once
// A progress bar on stderr for long work: redrawn in place on a terminal, one line per step
// otherwise (logs, CI), with the elapsed time and an estimate of what is left.
#include <chrono>
#include <string>

namespace remat::cli {

class ProgressBar {
 public:
  /// A bar that is not `shown` prints nothing (a data-parallel job's ranks other than 0).
  explicit ProgressBar(std::string label, bool shown = true);
  /// Step `done` of `total` is starting; `what` names it.
  void update(int done, int total, const std::string& what);
  /// Erases the bar on a terminal, before printing something else there (the next update()
  /// draws it again).
  void clear();
  /// Clears the bar (on a terminal) and prints the total time: "<label>: 12 <what> in 3.4 s".
  void finish(int total, const std::string& what = "stages");

 private:
  std::string label_;
  std::chrono::steady_clock::time_point start_;
  bool terminal_;
  bool shown_;
};

}  // namespace remat::cli
