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

std::optional<long> whole_number(const std::string& text, long low, long high) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < low || value > high) return std::nullopt;
  return value;
}

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  const auto hex = [&](unsigned char c) {
    static const char digits[] = "0123456789abcdef";
    out += "\\x";
    out += digits[c >> 4];
    out += digits[c & 15];
  };
  // The length of the valid UTF-8 sequence at i, or 0 (a stray continuation byte, a truncated
  // or overlong sequence: bytes a Latin-1 terminal would read as C1 controls).
  const auto sequence = [&](std::size_t i) -> std::size_t {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t n = c >= 0xc2 && c <= 0xdf   ? 2
                          : c >= 0xe0 && c <= 0xef ? 3
                          : c >= 0xf0 && c <= 0xf4 ? 4
                                                   : 0;
    if (n == 0 || i + n > text.size()) return 0;
    for (std::size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xc0) != 0x80) return 0;
    }
    return n;
  };
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      hex(c);
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (const std::size_t n = sequence(i);
               n > 0 && !(c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0)) {
      out.append(text, i, n);  // printable UTF-8 (not U+0080-U+009F, the C1 controls)
      i += n;
      continue;
    } else {
      hex(c);
    }
    ++i;
  }
  return out;
}

CLI::App* add_torch_subcommand(CLI::App& app, const std::string& name) {
  for (const TorchCommand& command : kTorchCommands)
    if (name == command.name) return app.add_subcommand(name, command.description);
  throw std::logic_error("remat: no LibTorch command '" + name + "' (this is a bug in remat)");
}

}  // namespace remat::cli
