#pragma once
// torchvision's Inception v3 as a chain. Stages, named as torchvision's members:
// "Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1",
// "Conv2d_4a_3x3", "maxpool2", "Mixed_5b" ... "Mixed_6e", "AuxLogits" (with aux_logits),
// "Mixed_7a", "Mixed_7b", "Mixed_7c", "fc" (pooling, dropout, flatten, linear). With
// transform_input the first stage starts by transforming the input as torchvision does.
//
// The auxiliary classifier. torchvision returns InceptionOutputs(logits, aux_logits) in
// training mode. Here, with aux_logits, the chain's activations from "AuxLogits" on are tuples
// (remat/core/stage.h): "AuxLogits" returns {features, aux_logits} in training mode, and
// "Mixed_7a", "Mixed_7b", "Mixed_7c" and "fc" transform the features and carry the auxiliary
// logits unchanged, so that the chain's output is {logits, aux_logits}: a side output,
// differentiated with the logits (torchvision's recipe: loss(logits) + 0.4 * loss(aux),
// classification_loss() in registry.h). In eval mode "AuxLogits" returns {features} and the
// output is {logits}. These stages take their members as one std::vector<torch::Tensor>
// (remat::MemberListModule), so the Sequential itself runs too:
// `net->forward<std::vector<torch::Tensor>>(x)`. Without aux_logits every stage maps a tensor
// to a tensor, as in the other models.
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

}  // namespace remat::models
