#pragma once
// What the benchmarks share: the median of their repetitions and a size in MiB for tables.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace remat::bench {

/// Median of `values` (not empty): the middle one, or the mean of the two middle ones.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// "123.4 MiB".
inline std::string mib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", bytes / (1 << 20));
  return text;
}

}  // namespace remat::bench
