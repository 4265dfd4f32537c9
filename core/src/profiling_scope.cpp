#include "remat/core/profiling_scope.h"

#include <atomic>

namespace remat::detail {
namespace {

std::atomic<int>& depth() {
  static std::atomic<int> value{0};
  return value;
}

}  // namespace

bool profiling() { return depth().load() > 0; }

ProfilingScope::ProfilingScope() { ++depth(); }

ProfilingScope::~ProfilingScope() { --depth(); }

}  // namespace remat::detail
