#pragma once
// remat_runtime: remat::Checkpointable, remat::keep_freed_memory.
#include "remat/runtime/checkpointable.h"
#include "remat/runtime/allocator.h"
