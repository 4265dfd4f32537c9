#pragma once
// remat_profiler: memory trackers and the chain profiler.
#include "remat/profiler/block.h"
#include "remat/profiler/generator_state.h"
#include "remat/profiler/memory_tracker.h"
#include "remat/profiler/profiler.h"
