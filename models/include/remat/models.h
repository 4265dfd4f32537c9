#pragma once
// remat_models: built-in networks as chains.
#include "remat/models/convnet.h"
#include "remat/models/registry.h"
