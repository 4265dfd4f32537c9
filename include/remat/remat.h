#pragma once
/// Everything remat offers: the solver (remat/solver.h) and, in a build with LibTorch, the
/// profiler (remat/profiler.h); the runtime and models join here as they land.

#include "remat/report.h"
#include "remat/solver.h"
#if __has_include("remat/profiler.h")
#include "remat/profiler.h"
#endif
#if __has_include("remat/runtime.h")
#include "remat/runtime.h"
#endif
#if __has_include("remat/models.h")
#include "remat/models.h"
#endif
