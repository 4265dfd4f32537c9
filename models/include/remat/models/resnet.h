#pragma once
// torchvision's ResNets as chains. Stages: "conv1" (conv 7x7/2, BN, ReLU), "maxpool", one
// stage per residual block ("layer1_0" ... "layer4_2"), and "fc" (global average pooling,
// flatten, linear). Same layers, parameter names (after the rename that
// load_torchvision_weights applies) and initialization as torchvision.models.resnet*.

#include <torch/nn/modules/container/sequential.h>

#include "remat/base/arg.h"  // REMAT_ARG

namespace remat::models {

struct ResNetOptions {
  REMAT_ARG(int64_t, num_classes) = 1000;
  /// Zero the last BatchNorm weight of every residual block, so each block starts as the
  /// identity (torchvision's zero_init_residual).
  REMAT_ARG(bool, zero_init_residual) = false;
};

/// ResNet-18 (BasicBlock, [2, 2, 2, 2]): 11,689,512 parameters at 1000 classes, 11 stages.
/// Example: `remat::Checkpointable chk(remat::models::resnet18(ResNetOptions().num_classes(10)));`
torch::nn::Sequential resnet18(const ResNetOptions& options = ResNetOptions());
/// ResNet-34 (BasicBlock, [3, 4, 6, 3]): 21,797,672 parameters, 19 stages.
torch::nn::Sequential resnet34(const ResNetOptions& options = ResNetOptions());
/// ResNet-50 (Bottleneck, [3, 4, 6, 3]): 25,557,032 parameters, 19 stages.
torch::nn::Sequential resnet50(const ResNetOptions& options = ResNetOptions());
/// ResNet-101 (Bottleneck, [3, 4, 23, 3]): 44,549,160 parameters, 36 stages.
torch::nn::Sequential resnet101(const ResNetOptions& options = ResNetOptions());
/// ResNet-152 (Bottleneck, [3, 8, 36, 3]): 60,192,808 parameters, 53 stages.
torch::nn::Sequential resnet152(const ResNetOptions& options = ResNetOptions());

}  // namespace remat::models
