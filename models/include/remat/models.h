#pragma once
// remat_models: built-in networks as chains.
#include "remat/models/convnet.h"
#include "remat/models/densenet.h"
#include "remat/models/inception.h"
#include "remat/models/resnet.h"
#include "remat/models/safetensors.h"
#include "remat/models/state_dict.h"
#include "remat/models/transformer.h"
#include "remat/models/vgg.h"
#include "remat/models/weights.h"
#include "remat/models/registry.h"
