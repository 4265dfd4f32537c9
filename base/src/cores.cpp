// available_cores() and available_memory_bytes(): the cores and the memory this process may
// use, for the automatic number of workers and the default memory limit of a solve.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "remat/base/cores.h"

#ifdef __linux__
#include <sched.h>
#include <sys/resource.h>
#endif

namespace remat {
namespace {

// The process's cgroup: its cgroup v2 path, and its cgroup v1 path for `controller` (v1 names
// controllers alone or together: "cpu,cpuacct").
struct CgroupPaths {
  std::string v2, v1;
};
CgroupPaths cgroup_paths(const std::string& controller) {
  CgroupPaths out;
  std::ifstream cgroup("/proc/self/cgroup");
  for (std::string line; std::getline(cgroup, line);) {
    // "<id>:<controllers>:<path>": "0::<path>" is cgroup v2.
    const std::size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (line.compare(0, first, "0") == 0 && controllers.empty()) out.v2 = path;
    std::stringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');)
      if (name == controller) out.v1 = path;
  }
  return out;
}

// Calls take(path) for the cgroup v2 path and every cgroup above it (a limit anywhere above
// applies too).
template <class Take>
void for_each_v2_ancestor(std::string path, const Take& take) {
  for (;; path = path.substr(0, path.rfind('/'))) {
    take(path);
    if (path.empty() || path == "/") break;
  }
}

// cgroup v2's cpu.max of the process's cgroup and of every cgroup above it (the smallest quota
// applies), then cgroup v1's CFS quota; 0 where none is set or none can be read.
int cgroup_quota_cores() {
  int least = 0;
  const auto take = [&least](int cores) {
    if (cores > 0 && (least == 0 || cores < least)) least = cores;
  };
  const CgroupPaths paths = cgroup_paths("cpu");
  const std::string v2_path = paths.v2, v1_path = paths.v1;
  for_each_v2_ancestor(v2_path, [&](const std::string& path) {
    std::ifstream max("/sys/fs/cgroup" + path + "/cpu.max");
    std::string quota;
    double period = 0;
    if (max >> quota >> period) take(quota_cores(quota, period));
  });
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

// The smallest memory limit of the process's cgroups (v2's memory.max up the hierarchy, v1's
// memory.limit_in_bytes), in bytes; 0 where none is set or none can be read ("max", or v1's
// "unlimited", a number near 2^63).
std::int64_t cgroup_memory_limit() {
  std::int64_t least = 0;
  const auto take = [&least](std::ifstream file) {
    std::string text;
    if (!(file >> text)) return;
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || !(value > 0) || value >= 0x1p62) return;
    const auto bytes = static_cast<std::int64_t>(value);
    if (least == 0 || bytes < least) least = bytes;
  };
  const CgroupPaths paths = cgroup_paths("memory");
  for_each_v2_ancestor(paths.v2, [&](const std::string& path) {
    take(std::ifstream("/sys/fs/cgroup" + path + "/memory.max"));
  });
  for (const std::string& path : {paths.v1, std::string()})
    take(std::ifstream("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes"));
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

std::int64_t available_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  std::int64_t bytes = static_cast<std::int64_t>(
      std::min(static_cast<double>(pages) * static_cast<double>(page_size), 0x1p62));
#ifdef __linux__
  const std::int64_t cgroup = cgroup_memory_limit();
  if (cgroup > 0) bytes = std::min(bytes, cgroup);
  // `ulimit -v` and `ulimit -d`: an allocation beyond them fails although the machine has room.
  for (const int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    rlimit limit{};
    if (getrlimit(resource, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
        static_cast<double>(limit.rlim_cur) < 0x1p62)
      bytes = std::min(bytes, static_cast<std::int64_t>(limit.rlim_cur));
  }
#endif
  return bytes;
}

}  // namespace remat
