#pragma once
// remat_runtime: remat::Checkpointable.
#include "remat/runtime/checkpointable.h"
