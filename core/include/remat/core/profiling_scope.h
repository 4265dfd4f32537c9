#pragma once
// Whether remat's profiler is measuring a chain somewhere in this process. Its forwards and
// backwards are not training steps: they accumulate into the parameters' gradients and then
// put the gradients back as they were. DataParallel's gradient hooks ignore them (a backward
// of the user's outside DataParallel::backward() is refused), so that a chain may be measured
// after DataParallel is made.

namespace remat::detail {

/// True while a ProfilingScope lives, on any thread.
bool profiling();

/// Marks the profiler at work for as long as it lives.
class ProfilingScope {
 public:
  ProfilingScope();
  ~ProfilingScope();
  ProfilingScope(const ProfilingScope&) = delete;
  ProfilingScope& operator=(const ProfilingScope&) = delete;
};

}  // namespace remat::detail
