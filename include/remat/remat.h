#pragma once
/// Everything remat offers. Today: the solver (remat/solver.h); the profiler, runtime and
/// models join here as they land.

#include "remat/solver.h"
