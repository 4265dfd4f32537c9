#pragma once
/// Everything remat offers: the solver (remat/solver.h) and the pictures (remat/report.h) and,
/// in a build with LibTorch (remat/config.h), the profiler and the runtime, with the models and
/// data-parallel training where the build has them.

#include "remat/config.h"
#include "remat/report.h"
#include "remat/solver.h"
#if REMAT_WITH_TORCH
#include "remat/core.h"
#include "remat/profiler.h"
#include "remat/runtime.h"
#endif
#if REMAT_WITH_MODELS
#include "remat/models.h"
#endif
#if REMAT_WITH_DISTRIBUTED
#include "remat/distributed.h"
#endif
