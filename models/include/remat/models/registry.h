#pragma once
// The built-in models by name, for the command line (`remat profile --model NAME`, `remat
// models`). Each is a chain: a torch::nn::Sequential whose elements are its stages.

#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <string>
#include <vector>

#include "remat/core/stage.h"  // remat::Tensors

namespace remat::models {

struct ModelInfo {
  std::string name;
  std::string description;
  /// Smallest input height/width the architecture accepts.
  int min_image = 1;
  /// Default input height/width (what `remat profile` uses without --image).
  int default_image = 224;
  std::function<torch::nn::Sequential(int num_classes)> make;
};

/// The training loss of the built-in classifiers, from the members of their output: the
/// cross-entropy of the logits against the labels `target`, and for Inception v3 in training
/// mode, whose output is {logits, aux_logits}, torchvision's recipe: loss(logits) + 0.4
/// loss(aux_logits).
torch::Tensor classification_loss(const Tensors& outputs, const torch::Tensor& target);

/// Number of parameter elements of `module` (what torchvision's published counts count).
std::int64_t parameter_count(const torch::nn::Module& module);

/// Every built-in model, in a stable order.
const std::vector<ModelInfo>& registry();
/// The model called `name`; throws c10::ValueError listing the known names.
const ModelInfo& find_model(const std::string& name);

}  // namespace remat::models
