#pragma once
// remat_profiler: memory trackers and the chain profiler.
#include "remat/core.h"
#include "remat/profiler/memory_tracker.h"
#include "remat/profiler/profiler.h"
