#pragma once
/// What this process may use of the machine: its cores (for automatic worker counts) and its
/// memory (for default memory limits).

#include <cstdint>
#include <string>

namespace remat {

/// The cores this process may run on, which automatic threads (`threads(0)`) use: its CPU
/// affinity (`taskset`, a container's `--cpuset-cpus`), lowered to its cgroup's CPU quota where
/// one is set (a container's `--cpus`, rounded up); at least 1. Not
/// std::thread::hardware_concurrency(), which counts every core of the machine: a container
/// allowed 2 of 64 cores would run 64 workers on 2.
int available_cores();
/// The whole cores a CPU quota allows: `quota` microseconds (cgroup v2's `cpu.max` first field,
/// or v1's `cpu.cfs_quota_us`) per `period`, rounded up; 0 for none ("max", -1) or unreadable.
int quota_cores(const std::string& quota, double period);
/// The memory this process may use, in bytes, from which a solve's default memory limit is
/// taken (SolveOptions::memory_limit_bytes): the machine's physical memory, lowered to its
/// cgroup's memory limit (a container's `--memory`: cgroup v2's `memory.max`, v1's
/// `memory.limit_in_bytes`) and to its address-space and data limits (`ulimit -v`, `ulimit -d`)
/// where one is set; 0 when the machine's memory is unknown.
std::int64_t available_memory_bytes();

}  // namespace remat
