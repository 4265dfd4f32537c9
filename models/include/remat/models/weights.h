#pragma once
// Loading torchvision's published weights into the chains of this library.

#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <vector>

#include "remat/models/state_dict.h"

namespace remat::models {

/// Thrown when a state dict does not fit a model; what() lists the missing, unexpected and
/// mis-shaped names (torchvision's names), and the model is left unchanged.
class WeightsError : public InputError {
 public:
  using InputError::InputError;
};

/// Loads a state dict as torchvision publishes it (`torch.save(model.state_dict(), path)`,
/// e.g. "resnet50-0676ba61.pth") into `model`, a chain built by remat::models (its stages
/// know torchvision's name of each of their parameters and buffers; for any other Sequential,
/// the names are the chain's own: "<stage>.<name in stage>").
/// - Accepts what torchvision's own loaders accept: DenseNet files with the old names
///   ("denselayer1.norm.1.weight"), ViT files with the old MLP names ("mlp.linear_1.weight",
///   as in the published ViT weights), files saved from nn.DataParallel (every name prefixed
///   "module."), BatchNorm state without `num_batches_tracked` (set to 0, as PyTorch does).
/// - Values are converted to each parameter's dtype and device.
/// - Nothing is changed unless every tensor of the model has a value of the right shape and
///   the file has no name the model lacks; otherwise WeightsError lists them.
/// Example: `auto net = remat::models::resnet50();
///           remat::models::load_torchvision_weights(net, "resnet50-0676ba61.pth");`
void load_torchvision_weights(torch::nn::Sequential& model, const std::string& path);
/// The same from a state dict already read (read_state_dict); `source` names it in errors.
void load_torchvision_weights(torch::nn::Sequential& model,
                              const std::vector<StateDictEntry>& state_dict,
                              const std::string& source = "state dict");

/// torchvision's name for the parameter or buffer `key` of `model` ("layer1_0.conv1.weight"
/// -> "layer1.0.conv1.weight").
std::string torchvision_name(const torch::nn::Sequential& model, const std::string& key);

}  // namespace remat::models
