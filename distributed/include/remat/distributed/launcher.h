#pragma once
// Starting the ranks of a job on this machine, as torchrun does: `remat train --nproc N` and the
// tests use it.

#include <chrono>
#include <string>
#include <vector>

namespace remat::distributed {

/// How one local rank ended.
struct RankExit {
  int rank = 0;
  /// The exit code, or 128 + the signal that ended it (a killed rank: 137).
  int code = 0;
  /// Killed by the launcher because it had not stopped `grace` after another rank failed.
  bool killed_by_launcher = false;
};

struct LaunchOptions {
  /// The address and port of the rendezvous (rank 0 listens there).
  LaunchOptions& master(std::string addr, int port) {
    master_addr_ = std::move(addr);
    master_port_ = port;
    return *this;
  }
  /// After a rank fails, how long the others have to stop on their own (they notice within
  /// their timeout) before the launcher kills them.
  LaunchOptions& grace(std::chrono::milliseconds value) {
    grace_ = value;
    return *this;
  }
  /// Ranks [first_rank, first_rank + count) of `world_size` run here (one machine's share).
  LaunchOptions& ranks(int first_rank, int world_size) {
    first_rank_ = first_rank;
    world_size_ = world_size;
    return *this;
  }
  const std::string& master_addr() const { return master_addr_; }
  int master_port() const { return master_port_; }
  std::chrono::milliseconds grace() const { return grace_; }
  int first_rank() const { return first_rank_; }
  int world_size() const { return world_size_; }

 private:
  std::string master_addr_ = "127.0.0.1";
  int master_port_ = 29500;
  std::chrono::milliseconds grace_ = std::chrono::seconds(330);
  int first_rank_ = 0;
  int world_size_ = 0;  // 0: count
};

/// The variable launch_local gives each rank: the launcher's process id. Group::create (on
/// Linux) then has the rank killed when the launcher dies, and kills it at once if the launcher
/// is already gone.
inline constexpr const char* kLauncherPidVariable = "REMAT_LAUNCHER_PID";

/// The most processes launch_local starts on one machine (a machine has at most a few dozen
/// accelerators; each rank is a LibTorch process of its own): more is refused before any starts.
inline constexpr int kMaxLocalRanks = 64;

/// Starts `count` processes running `argv` (argv[0] is the program's path), each with torchrun's
/// environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and REMAT_LAUNCHER_PID
/// added to this one's, and waits for all of them. Returns how each ended, in rank order. Throws
/// std::runtime_error if a process cannot be started (the ones started are killed), and
/// std::invalid_argument for a count outside 1..kMaxLocalRanks.
std::vector<RankExit> launch_local(const std::vector<std::string>& argv, int count,
                                   const LaunchOptions& options = LaunchOptions());

/// A TCP port free on 127.0.0.1 now (the kernel's choice), for a local job's rendezvous.
int free_local_port();

}  // namespace remat::distributed
