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
//
// Branch granularity (InceptionV3Options::granularity(Granularity::kBranch), `--granularity
// branch`): each Mixed block is one stage per branch, named after the block and the branch's
// first member: "Mixed_5b_branch1x1", "Mixed_5b_branch5x5", "Mixed_5b_branch3x3dbl",
// "Mixed_5b_branch_pool", ... (Mixed_6a and Mixed_7a's last stage, "..._branch_pool", is their
// max pooling). A branch's stage takes {x, the block's finished branches, rest} and returns
// them with its own output after the finished branches: x, the finished branches and rest (the
// auxiliary logits, after AuxLogits) are carried, one storage each. The block's last stage
// returns {the branches concatenated, rest}, as the block does. So the schedule can keep some
// branches' outputs and recompute the others, rather than a whole block. From "maxpool2" on,
// every stage then takes and returns a list of members (its output is {logits} without
// aux_logits). The parameters keep torchvision's names ("Mixed_5b.branch1x1.conv.weight"), the
// same seed gives the same parameters at both granularities, and the outputs are the same.

#include <torch/nn/modules/container/sequential.h>

#include "remat/base/arg.h"  // REMAT_ARG
#include "remat/models/granularity.h"

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
  /// kBlock: one stage per Mixed block; kBranch: one per branch (see above). kHalfBlock is a
  /// transformer's: a c10::ValueError.
  REMAT_ARG(Granularity, granularity) = Granularity::kBlock;
};

/// Inception v3: 27,161,264 parameters at 1000 classes (23,834,568 without aux_logits).
torch::nn::Sequential inception_v3(const InceptionV3Options& options = InceptionV3Options());

}  // namespace remat::models
