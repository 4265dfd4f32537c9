#pragma once
// torchvision's Inception v3 as a chain. Stages, named as torchvision's members:
// "Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1",
// "Conv2d_4a_3x3", "maxpool2", "Mixed_5b" ... "Mixed_6e", "AuxLogits" (with aux_logits),
// "Mixed_7a", "Mixed_7b", "Mixed_7c", "fc" (pooling, dropout, flatten, linear). With
// transform_input the first stage starts by transforming the input as torchvision does.
//
// The auxiliary classifier. torchvision returns InceptionOutputs(logits, aux_logits) in
// training mode; a chain carries one tensor from stage to stage, so here:
// - In training mode with aux_logits, the "AuxLogits" stage computes the auxiliary logits
//   from Mixed_6e's output and appends them to the feature map as extra channel planes
//   (zero-padded); Mixed_7a, 7b, 7c carry them along untouched, and "fc" returns
//   [logits | aux_logits] as one N x 2*num_classes tensor. split_inception_output()
//   separates them: `auto [logits, aux] = split_inception_output(out, num_classes)`, and a
//   loss on both (torchvision's recipe: loss(logits) + 0.4 * loss(aux)) trains both heads.
// - In eval mode (or without aux_logits) "AuxLogits" passes its input through and the
//   output is the N x num_classes logits, as in torchvision.
// The auxiliary head needs Mixed_6e's output to be at least 17x17, that is a 299x299 input
// (as in torchvision); without it the network accepts 75x75.

#include <torch/nn/modules/container/sequential.h>

#include "remat/solver/arg.h"  // REMAT_ARG

namespace remat::models {

struct InceptionV3Options {
  REMAT_ARG(int64_t, num_classes) = 1000;
  /// Build the auxiliary classifier (torchvision's default).
  REMAT_ARG(bool, aux_logits) = true;
  /// Map inputs normalized with ImageNet's statistics to the [-1, 1] scaling Google's
  /// weights expect (torchvision sets it when loading pretrained weights).
  REMAT_ARG(bool, transform_input) = false;
  /// Dropout before the last linear layer.
  REMAT_ARG(double, dropout) = 0.5;
};

/// Inception v3: 27,161,264 parameters at 1000 classes (23,834,568 without aux_logits).
torch::nn::Sequential inception_v3(const InceptionV3Options& options = InceptionV3Options());

/// The two outputs of Inception v3 in training mode; `aux_logits` is undefined when the
/// network ran without the auxiliary classifier (eval mode, or aux_logits off).
struct InceptionOutputs {
  torch::Tensor logits;
  torch::Tensor aux_logits;
};
/// Splits the output of inception_v3 (N x num_classes, or N x 2*num_classes in training
/// mode with aux_logits) into logits and auxiliary logits (views of `output`).
InceptionOutputs split_inception_output(const torch::Tensor& output, int64_t num_classes);

}  // namespace remat::models
