#include <cmath>
#include <cstdlib>

#include "cli.h"

namespace remat::cli {

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
  check_output_path(path, "the plot");  // before the work, not after it
}

CLI::App* add_torch_subcommand(CLI::App& app, const std::string& name) {
  for (const TorchCommand& command : kTorchCommands)
    if (name == command.name) return app.add_subcommand(name, command.description);
  throw std::logic_error("remat: no LibTorch command '" + name + "' (this is a bug in remat)");
}

}  // namespace remat::cli
