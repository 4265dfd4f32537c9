// available_cores(): the cores this process may run on, for the automatic number of workers.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "remat/solver/solver.h"

#ifdef __linux__
#include <sched.h>
#endif

namespace remat {
namespace {

// cgroup v2's cpu.max of the process's cgroup and of every cgroup above it (the smallest quota
// applies), then cgroup v1's CFS quota; 0 where none is set or none can be read.
int cgroup_quota_cores() {
  int least = 0;
  const auto take = [&least](int cores) {
    if (cores > 0 && (least == 0 || cores < least)) least = cores;
  };
  std::string v2_path, v1_path;
  std::ifstream cgroup("/proc/self/cgroup");
  for (std::string line; std::getline(cgroup, line);) {
    // "<id>:<controllers>:<path>": "0::<path>" is cgroup v2; v1's cpu controller is named
    // "cpu" or "cpu,cpuacct".
    const std::size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (line.compare(0, first, "0") == 0 && controllers.empty()) v2_path = path;
    std::stringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');)
      if (name == "cpu") v1_path = path;
  }
  for (std::string path = v2_path;; path = path.substr(0, path.rfind('/'))) {
    std::ifstream max("/sys/fs/cgroup" + path + "/cpu.max");
    std::string quota;
    double period = 0;
    if (max >> quota >> period) take(quota_cores(quota, period));
    if (path.empty() || path == "/") break;
  }
  for (const std::string root : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
    for (const std::string& path : {v1_path, std::string()}) {
      std::ifstream quota_file(root + path + "/cpu.cfs_quota_us");
      std::ifstream period_file(root + path + "/cpu.cfs_period_us");
      std::string quota;
      double period = 0;
      if (quota_file >> quota && period_file >> period) take(quota_cores(quota, period));
    }
  }
  return least;
}

}  // namespace

int quota_cores(const std::string& quota, double period) {
  if (quota == "max" || quota.empty() || !(period > 0)) return 0;
  char* end = nullptr;
  const double value = std::strtod(quota.c_str(), &end);
  if (end == quota.c_str() || *end != '\0' || !(value > 0)) return 0;  // -1: none (v1)
  return static_cast<int>(std::min(1e6, std::ceil(value / period)));
}

int available_cores() {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
#ifdef __linux__
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) cores = CPU_COUNT(&set);
  const int quota = cgroup_quota_cores();
  if (quota > 0) cores = std::min(cores, quota);
#endif
  return std::max(1, cores);
}

}  // namespace remat
