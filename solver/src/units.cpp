#include "remat/solver/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "remat/solver/check.h"

namespace remat {

std::int64_t parse_size(std::string_view text) {
  const std::string input(text);
  std::size_t start = 0;
  while (start < input.size() && std::isspace(static_cast<unsigned char>(input[start]))) ++start;
  const char* begin = input.c_str() + start;
  char* end = nullptr;
  const double number = std::strtod(begin, &end);
  REMAT_CHECK(end != begin, "bad size '", text, "': expected a number with an optional unit ",
              "such as 700MiB, 2.5GiB or 1e9");
  REMAT_CHECK(begin[0] != '-' && number >= 0, "bad size '", text, "': must not be negative");
  REMAT_CHECK(std::isfinite(number), "bad size '", text, "': must be finite");
  std::string unit(end);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();
  double scale = 0;
  struct Unit {
    const char* name;
    double scale;
  };
  static const Unit kUnits[] = {
      {"", 1},
      {"B", 1},
      {"kB", 1e3},
      {"KB", 1e3},
      {"MB", 1e6},
      {"GB", 1e9},
      {"TB", 1e12},
      {"KiB", 1024.0},
      {"MiB", 1048576.0},
      {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0},
      {"k", 1024.0},
      {"K", 1024.0},
      {"M", 1048576.0},
      {"G", 1073741824.0},
      {"T", 1099511627776.0},
  };
  for (const Unit& candidate : kUnits) {
    if (unit == candidate.name) scale = candidate.scale;
  }
  REMAT_CHECK(scale > 0, "bad size '", text, "': unknown unit '", unit,
              "' (use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  const double bytes = std::floor(number * scale);
  REMAT_CHECK(bytes < 9.2e18, "bad size '", text, "': too large");
  return static_cast<std::int64_t>(bytes);
}

std::string format_bytes(std::int64_t bytes) {
  static const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[64];
  if (unit == 0) {
    std::snprintf(buffer, sizeof buffer, "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buffer, sizeof buffer, "%.2f %s", value, kNames[unit]);
  }
  return buffer;
}

}  // namespace remat
