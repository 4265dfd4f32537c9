#pragma once
// remat_core: stages (C++ modules, callables, TorchScript), Block, generator states.
#include "remat/core/block.h"
#include "remat/core/error.h"
#include "remat/core/generator_state.h"
#include "remat/core/script_stage.h"
#include "remat/core/stage.h"
