#pragma once
// torchvision's DenseNets as chains. Stages: "conv0" (conv 7x7/2, BN, ReLU, max pooling),
// one stage per dense layer ("block1_layer1", ...: BN-ReLU-Conv1x1-BN-ReLU-Conv3x3 whose
// output is concatenated to its input, so that the chain carries all features of the
// block), one per transition ("transition1", ...), and "classifier" (BN, ReLU, global
// average pooling, flatten, linear).

#include <torch/nn/modules/container/sequential.h>

#include <vector>

#include "remat/base/arg.h"  // REMAT_ARG

namespace remat::models {

struct DenseNetOptions {
  REMAT_ARG(int64_t, num_classes) = 1000;
  /// Channels each dense layer adds.
  REMAT_ARG(int64_t, growth_rate) = 32;
  /// Dense layers in each block.
  REMAT_ARG(std::vector<int64_t>, block_config) = {6, 12, 24, 16};
  /// Channels of the first convolution.
  REMAT_ARG(int64_t, num_init_features) = 64;
  /// Width of each dense layer's bottleneck, in multiples of growth_rate.
  REMAT_ARG(int64_t, bn_size) = 4;
  /// Dropout after each dense layer (0: none).
  REMAT_ARG(double, drop_rate) = 0.0;
};

/// A DenseNet with every option free (torchvision's DenseNet class).
torch::nn::Sequential densenet(const DenseNetOptions& options = DenseNetOptions());
/// DenseNet-121 (growth 32, blocks 6-12-24-16, 64 initial features): 7,978,856
/// parameters at 1000 classes. As in torchvision, the variant fixes growth_rate,
/// block_config and num_init_features; `options` gives num_classes, bn_size and drop_rate.
torch::nn::Sequential densenet121(const DenseNetOptions& options = DenseNetOptions());
/// DenseNet-161 (growth 48, blocks 6-12-36-24, 96 initial features): 28,681,000 parameters.
torch::nn::Sequential densenet161(const DenseNetOptions& options = DenseNetOptions());
/// DenseNet-169 (growth 32, blocks 6-12-32-32, 64 initial features): 14,149,480 parameters.
torch::nn::Sequential densenet169(const DenseNetOptions& options = DenseNetOptions());
/// DenseNet-201 (growth 32, blocks 6-12-48-32, 64 initial features): 20,013,928 parameters.
torch::nn::Sequential densenet201(const DenseNetOptions& options = DenseNetOptions());

}  // namespace remat::models
