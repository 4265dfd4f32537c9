#include "progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace remat::cli {

ProgressBar::ProgressBar(std::string label, bool shown)
    : label_(std::move(label)),
      start_(std::chrono::steady_clock::now()),
      terminal_(isatty(fileno(stderr)) == 1),
      shown_(shown) {}

void ProgressBar::update(int done, int total, const std::string& what) {
  if (!shown_) return;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string estimate = "estimating";
  if (done > 0) estimate = fmt::format("about {:.1f} s left", elapsed / done * (total - done));
  if (terminal_) {
    constexpr int kWidth = 24;
    const int filled = total > 0 ? done * kWidth / total : kWidth;
    fmt::print(stderr, "\r\033[K{} [{}{}] {}/{} {}  {:.1f} s, {}", label_, std::string(filled, '#'),
               std::string(kWidth - filled, '.'), done, total, what, elapsed, estimate);
  } else {
    fmt::print(stderr, "{}: {}/{} {} ({:.1f} s, {})\n", label_, done + 1, total, what, elapsed,
               estimate);
  }
  std::fflush(stderr);
}

void ProgressBar::clear() {
  if (shown_ && terminal_) {
    fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
  }
}

void ProgressBar::finish(int total, const std::string& what) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (!shown_) return;
  clear();
  fmt::print(stderr, "{}: {} {} in {:.1f} s\n", label_, total, what, elapsed);
}

}  // namespace remat::cli
