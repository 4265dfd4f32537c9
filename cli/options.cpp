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

Link parse_link(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::size_t end = comma == std::string::npos ? text.size() : comma;
    parts.push_back(text.substr(start, end - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  REMAT_CHECK(parts.size() == 3, "--link '", text,
              "': expected D2H,H2D,LATENCY (GB/s out, GB/s back, ms per copy), e.g. 25,25,0.01");
  const char* names[] = {"its bandwidth out (D2H, GB/s)", "its bandwidth back (H2D, GB/s)",
                         "its latency (ms)"};
  double values[3] = {0, 0, 0};
  for (std::size_t k = 0; k < 3; ++k) {
    char* end = nullptr;
    values[k] = std::strtod(parts[k].c_str(), &end);
    REMAT_CHECK(!parts[k].empty() && end == parts[k].c_str() + parts[k].size() &&
                    std::isfinite(values[k]),
                "--link '", text, "': ", names[k], " '", parts[k], "' is not a number");
  }
  for (std::size_t k = 0; k < 2; ++k)
    REMAT_CHECK(values[k] >= kMinLinkGbps && values[k] <= kMaxLinkGbps, "--link '", text, "': ",
                names[k], " must be from ", kMinLinkGbps, " to ", kMaxLinkGbps, " GB/s");
  REMAT_CHECK(values[2] >= 0 && values[2] <= kMaxStageMs, "--link '", text, "': ", names[2],
              " must be from 0 to ", kMaxStageMs, " ms");
  return Link{values[0], values[1], values[2]};
}

void add_offload_options(CLI::App& cmd, bool& offload, std::string& link, std::string& host_memory,
                         const std::string& offload_help) {
  cmd.add_flag("--offload", offload, offload_help);
  cmd.add_option("--link", link,
                 "The device's link to host memory as D2H,H2D,LATENCY: GB/s out, GB/s back, ms "
                 "per copy (25,25,0.01); replaces the chain's own");
  cmd.add_option("--host-memory", host_memory,
                 "With --offload: the most host memory the offloaded copies may hold at once "
                 "(a size: 16GiB); default: no bound");
}

std::int64_t host_memory_option(const std::string& text, bool offload) {
  if (text.empty()) return -1;
  REMAT_CHECK(offload, "--host-memory ", text, " bounds the offloaded copies: give --offload too");
  try {
    return parse_size(text);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(std::string("--host-memory: ") + error.what());
  }
}

void apply_link_options(Chain& chain, const std::string& link, bool offload) {
  if (!link.empty()) chain.link = parse_link(link);
  REMAT_CHECK(!offload || chain.link, "--offload: the chain '", chain.name,
              "' has no link to host memory; give one with --link D2H,H2D,LATENCY (GB/s, GB/s, "
              "ms), or profile the chain on the device");
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
