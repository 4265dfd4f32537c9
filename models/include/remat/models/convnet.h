#pragma once
// A small VGG-like network, the example chain until the torchvision ports land: `blocks`
// stages of Conv3x3+BatchNorm+ReLU, max pooling after every `pool_every` of them (a stage
// of its own), then a classifier stage (global average pooling, flatten, linear).

#include <torch/nn/modules/container/sequential.h>

#include "remat/base/arg.h"  // REMAT_ARG

namespace remat::models {

struct ConvNetOptions {
  REMAT_ARG(int, num_classes) = 10;
  REMAT_ARG(int, width) = 32;      // channels of the first stage, doubled at each pooling
  REMAT_ARG(int, blocks) = 8;      // Conv+BN+ReLU stages
  REMAT_ARG(int, pool_every) = 2;  // a max-pooling stage after every this many blocks
  REMAT_ARG(int, max_width) = 256;
};

torch::nn::Sequential convnet(const ConvNetOptions& options = ConvNetOptions());

}  // namespace remat::models
