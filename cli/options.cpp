#include <cmath>
#include <cstdlib>

#include "cli.h"

namespace remat::cli {

namespace {
std::vector<std::string>& saved_command_line() {
  static std::vector<std::string> line;
  return line;
}
}  // namespace

void set_command_line(int argc, char** argv) { saved_command_line().assign(argv, argv + argc); }
const std::vector<std::string>& command_line() { return saved_command_line(); }

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

void check_solver_threads(int threads) {
  REMAT_CHECK(threads >= 0, "--threads (", threads, ") must not be negative");
  REMAT_CHECK(threads <= kMaxThreads, "--threads (", threads, ") must be at most ", kMaxThreads,
              " (0, the default, runs one per core)");
}

void check_segments_option(const CLI::App& cmd, Algorithm algorithm, int segments) {
  if (cmd.count("--segments") == 0) return;
  REMAT_CHECK(algorithm == Algorithm::kPeriodic, "--segments applies to --algorithm periodic only");
  REMAT_CHECK(segments > 0, "--segments (", segments, ") must be a positive number of segments");
}

std::optional<long> whole_number(const std::string& text, long low, long high) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < low || value > high) return std::nullopt;
  return value;
}

CLI::App* add_torch_subcommand(CLI::App& app, const std::string& name) {
  for (const TorchCommand& command : kTorchCommands)
    if (name == command.name) return app.add_subcommand(name, command.description);
  throw std::logic_error("remat: no LibTorch command '" + name + "' (this is a bug in remat)");
}

}  // namespace remat::cli
