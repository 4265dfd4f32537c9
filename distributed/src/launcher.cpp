#include "remat/distributed/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace remat::distributed {

int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    ::close(fd);
    throw std::runtime_error(std::string("finding a free port: ") + std::strerror(error));
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

std::vector<RankExit> launch_local(const std::vector<std::string>& argv, int count,
                                   const LaunchOptions& options) {
  if (argv.empty() || count < 1) throw std::invalid_argument("launch_local: no program or no rank");
  if (count > kMaxLocalRanks)
    throw std::invalid_argument("launch_local: " + std::to_string(count) +
                                " ranks on one machine, more than " +
                                std::to_string(kMaxLocalRanks));
  const int world = options.world_size() > 0 ? options.world_size() : count;
  // The environment: this one's without torchrun's variables, then each rank's.
  std::vector<std::string> base;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool ours = false;
    for (const char* name : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_ADDR=", "MASTER_PORT=",
                             "REMAT_LAUNCHER_PID="})
      ours = ours || entry.rfind(name, 0) == 0;
    if (!ours) base.push_back(entry);
  }
  std::vector<pid_t> pids;
  std::vector<RankExit> exits(static_cast<std::size_t>(count));
  const auto kill_all = [&] {
    for (pid_t pid : pids)
      if (pid > 0) ::kill(pid, SIGKILL);
    for (pid_t pid : pids)
      if (pid > 0) ::waitpid(pid, nullptr, 0);
  };
  for (int local = 0; local < count; ++local) {
    const int rank = options.first_rank() + local;
    std::vector<std::string> env = base;
    env.push_back("RANK=" + std::to_string(rank));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("LOCAL_RANK=" + std::to_string(local));
    env.push_back("MASTER_ADDR=" + options.master_addr());
    env.push_back("MASTER_PORT=" + std::to_string(options.master_port()));
    // The rank dies with this process (Group::create sees to it): a launcher stopped by a
    // signal (kill, timeout, a scheduler) leaves no rank training on.
    env.push_back(std::string(kLauncherPidVariable) + "=" + std::to_string(::getpid()));
    std::vector<char*> envp, args;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (std::string& s : argv_copy) args.push_back(s.data());
    args.push_back(nullptr);
    pid_t pid = 0;
    const int error = ::posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), envp.data());
    if (error != 0) {
      kill_all();
      throw std::runtime_error("cannot start rank " + std::to_string(rank) + " (" + argv[0] +
                               "): " + std::strerror(error));
    }
    pids.push_back(pid);
    exits[static_cast<std::size_t>(local)].rank = rank;
  }
  // Wait for all; once one fails, the others get `grace` to stop on their own.
  int running = count;
  bool failed = false;
  auto kill_at = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno != EINTR) break;
    if (pid > 0) {
      for (std::size_t k = 0; k < pids.size(); ++k) {
        if (pids[k] != pid) continue;
        pids[k] = -1;
        --running;
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        exits[k].code = code;
        if (code != 0 && !failed) {
          failed = true;
          kill_at = std::chrono::steady_clock::now() + options.grace();
        }
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > kill_at) {
      for (std::size_t k = 0; k < pids.size(); ++k)
        if (pids[k] > 0) {
          ::kill(pids[k], SIGKILL);
          ::waitpid(pids[k], nullptr, 0);
          pids[k] = -1;
          exits[k].code = 128 + SIGKILL;
          exits[k].killed_by_launcher = true;
          --running;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exits;
}

}  // namespace remat::distributed
