#include "rank_launch.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "cli.h"
#include "remat/base/text.h"
#include "remat/distributed.h"

namespace remat::cli {

std::pair<std::string, int> parse_master(const std::string& text) {
  std::string host = text, port_text;
  bool has_port = false;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string::npos || (close + 1 < text.size() && text[close + 1] != ':'))
      throw std::invalid_argument(
          fmt::format("--master {}: expected [IPV6] or [IPV6]:PORT", printable(text)));
    host = text.substr(1, close - 1);
    has_port = close + 1 < text.size();
    if (has_port) port_text = text.substr(close + 2);
  } else if (const std::size_t colon = text.find(':'); colon != std::string::npos) {
    if (text.find(':', colon + 1) != std::string::npos)
      throw std::invalid_argument(
          fmt::format("--master {}: an IPv6 address goes in brackets, as [{}] or [ADDRESS]:PORT",
                      printable(text), printable(text)));
    host = text.substr(0, colon);
    has_port = true;
    port_text = text.substr(colon + 1);
  }
  int port = 29500;
  if (has_port) {
    const std::optional<long> value = whole_number(port_text, 1, 65535);
    if (!value)
      throw std::invalid_argument(
          fmt::format("--master {}: the port must be a number from 1 to 65535", printable(text)));
    port = static_cast<int>(*value);
  }
  if (host.empty())
    throw std::invalid_argument(fmt::format("--master {}: no host (HOST:PORT)", printable(text)));
  return {host, port};
}

int launch_ranks(int nproc, const std::string& master_option, double timeout_s) {
  std::pair<std::string, int> master{"127.0.0.1", 0};
  if (!master_option.empty()) master = parse_master(master_option);
  if (master.second == 0) master.second = distributed::free_local_port();
  std::vector<std::string> argv = command_line();
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) argv[0] = self.string();
  fmt::print(stderr, "remat: starting {} here, rendezvous at {}\n", counted(nproc, "rank"),
             distributed::host_port(master.first, master.second));
  const auto grace = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)) +
                     std::chrono::seconds(30);
  const std::vector<distributed::RankExit> exits = distributed::launch_local(
      argv, nproc,
      distributed::LaunchOptions().master(master.first, master.second).grace(grace));
  // The job's code: the first rank's own error code (not a signal); a job whose ranks were only
  // killed is a distributed failure.
  int code = kExitOk;
  for (const auto& e : exits) {
    if (e.code == 0) continue;
    if (e.killed_by_launcher)
      fmt::print(stderr, "remat: rank {} had not stopped {:.0f} s after another failed: killed\n",
                 e.rank, std::chrono::duration<double>(grace).count());
    else if (e.code > 128)
      fmt::print(stderr, "remat: rank {} was killed by signal {}\n", e.rank, e.code - 128);
    else
      fmt::print(stderr, "remat: rank {} exited with code {}\n", e.rank, e.code);
    if (code == kExitOk || (code == kExitDistributed && e.code < 128 && e.code != kExitDistributed))
      code = e.code > 128 ? kExitDistributed : e.code;
  }
  return code;
}

}  // namespace remat::cli
