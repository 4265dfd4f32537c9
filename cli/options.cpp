#include <cmath>
#include <cstdlib>

#include "cli.h"

namespace remat::cli {

std::int64_t parse_budget(const std::string& text, const Chain& chain) {
  if (!text.empty() && text.back() == '%') {
    const std::string number = text.substr(0, text.size() - 1);
    char* end = nullptr;
    const double percent = std::strtod(number.c_str(), &end);
    REMAT_CHECK(!number.empty() && end == number.c_str() + number.size() &&
                    std::isfinite(percent) && percent >= 0,
                "bad budget '", text, "': expected a percentage such as 50%");
    return static_cast<std::int64_t>(
        std::floor(percent / 100.0 * static_cast<double>(store_all_peak(chain))));
  }
  try {
    return parse_size(text);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(std::string(error.what()) +
                                " (or a percentage of the store-all peak, such as 50%)");
  }
}

Format parse_format(const std::string& text) {
  if (text == "text") return Format::kText;
  if (text == "json") return Format::kJson;
  REMAT_CHECK(false, "unknown format '", text, "' (expected text or json)");
  return Format::kText;
}

}  // namespace remat::cli
