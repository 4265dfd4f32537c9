#include <cmath>
#include <cstdlib>

#include "cli.h"

namespace remat::cli {

std::int64_t parse_budget(const std::string& text, std::int64_t store_all_peak_bytes) {
  if (!text.empty() && text.back() == '%') {
    // floor(percent / 100 * peak), exactly.
    try {
      return scale_decimal(text.substr(0, text.size() - 1), store_all_peak_bytes, "budget") / 100;
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      const auto reason = message.find("': ");
      throw std::invalid_argument(
          "bad budget '" + text +
          "': " + (reason == std::string::npos ? message : message.substr(reason + 3)) +
          " (a percentage of the store-all peak, such as 50%)");
    }
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

void check_plot_path(const std::string& path) {
  if (path.empty()) return;
  const std::string suffix = ".svg";
  if (path.size() <= suffix.size() || path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0)
    throw std::invalid_argument("--plot '" + path + "': plots are SVG files; give a name ending in .svg");
}

CLI::App* add_torch_subcommand(CLI::App& app, const std::string& name) {
  for (const TorchCommand& command : kTorchCommands)
    if (name == command.name) return app.add_subcommand(name, command.description);
  throw std::logic_error("remat: no LibTorch command '" + name + "' (this is a bug in remat)");
}

}  // namespace remat::cli
