#pragma once
// torchvision's VGGs as chains. Stages: one per convolution (Conv3x3 [+ BN] + ReLU, named
// after its index in torchvision's `features`: "features_0", ...), one per max pooling,
// "avgpool" (adaptive average pooling to 7x7 and flatten), "classifier_0" and
// "classifier_3" (Linear + ReLU + Dropout) and "classifier_6" (the last Linear).

#include <torch/nn/modules/container/sequential.h>

#include "remat/base/arg.h"  // REMAT_ARG

namespace remat::models {

struct VGGOptions {
  REMAT_ARG(int64_t, num_classes) = 1000;
  /// Dropout probability in the classifier.
  REMAT_ARG(double, dropout) = 0.5;
  /// Width of the classifier's two hidden layers: torchvision's is 4096. Smaller widths make
  /// VGGs for small images (the ported torchvision tests use 64, so that their randomized
  /// reference files are not 500 MB each); the names stay torchvision's.
  REMAT_ARG(int64_t, classifier_width) = 4096;
};

/// VGG-11 (configuration "A"): 132,863,336 parameters at 1000 classes.
torch::nn::Sequential vgg11(const VGGOptions& options = VGGOptions());
/// VGG-11 with BatchNorm after every convolution: 132,868,840 parameters.
torch::nn::Sequential vgg11_bn(const VGGOptions& options = VGGOptions());
/// VGG-13 (configuration "B"): 133,047,848 parameters.
torch::nn::Sequential vgg13(const VGGOptions& options = VGGOptions());
/// VGG-13 with BatchNorm: 133,053,736 parameters.
torch::nn::Sequential vgg13_bn(const VGGOptions& options = VGGOptions());
/// VGG-16 (configuration "D"): 138,357,544 parameters.
torch::nn::Sequential vgg16(const VGGOptions& options = VGGOptions());
/// VGG-16 with BatchNorm: 138,365,992 parameters.
torch::nn::Sequential vgg16_bn(const VGGOptions& options = VGGOptions());
/// VGG-19 (configuration "E"): 143,667,240 parameters.
torch::nn::Sequential vgg19(const VGGOptions& options = VGGOptions());
/// VGG-19 with BatchNorm: 143,678,248 parameters.
torch::nn::Sequential vgg19_bn(const VGGOptions& options = VGGOptions());

}  // namespace remat::models
