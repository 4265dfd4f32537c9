#pragma once
// remat train --nproc N without --rank: the job's ranks started on this machine.

#include <string>
#include <utility>

namespace remat::cli {

/// --master's "HOST:PORT", "HOST" (port 29500), "[IPV6]:PORT" or "[IPV6]". An IPv6 address
/// without brackets is refused: in "fe80::1:29500" nothing tells the port from the address.
/// Throws std::invalid_argument naming the option (exit 2).
std::pair<std::string, int> parse_master(const std::string& text);

/// Starts `nproc` local ranks, each this same command line with torchrun's variables, their
/// rendezvous at `master` (HOST:PORT as parse_master reads it; empty: 127.0.0.1 and a free
/// port), and waits for them: a rank still running `timeout_s` + 30 s after another failed is
/// killed. Returns the job's exit code: 0, the first rank's own error code, or
/// kExitDistributed for a job whose ranks were only killed.
int launch_ranks(int nproc, const std::string& master, double timeout_s);

}  // namespace remat::cli
