#pragma once
// The built-in models by name, for the command line (`remat profile --model NAME`, `remat
// models`). Each is a chain: a torch::nn::Sequential whose elements are its stages.

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "remat/core/stage.h"  // remat::Tensors
#include "remat/models/granularity.h"

namespace remat::models {

/// What a built-in model's input is.
enum class InputKind {
  /// Images (batch, 3, height, width); the chain's output is the logits (and Inception's
  /// auxiliary logits), trained with classification_loss.
  kImage,
  /// Token ids (batch, sequence) in [0, vocab_size); the chain's output is {loss} (GPT-2).
  kTokens,
};

/// The shape of a model's input and how it is cut into stages, for the models whose
/// parameters or stages depend on them (ModelInfo::build).
struct ModelConfig {
  int num_classes = 1000;
  /// Input height and width; 0: the model's default. ViT's position embedding has one entry
  /// per patch of a square image of this size.
  int image = 0;
  /// One stage per block (transformer block, Inception Mixed block), or finer: per half-block
  /// (transformers), per branch (Inception v3). One of the model's ModelInfo::granularities.
  Granularity granularity = Granularity::kBlock;
};

struct ModelInfo {
  std::string name;
  std::string description;
  /// Smallest input height/width the architecture accepts.
  int min_image = 1;
  /// Default input height/width (what `remat profile` uses without --image).
  int default_image = 224;
  /// The model for 1000 classes or `num_classes`, at its default image size and granularity.
  std::function<torch::nn::Sequential(int num_classes)> make;

  InputKind input = InputKind::kImage;
  /// Images: the input must be square, a multiple of this (ViT's patches); 0: any size.
  int image_multiple = 0;
  /// Tokens: the vocabulary's size, the longest sequence and the default one.
  int vocab_size = 0;
  int max_sequence = 0;
  int default_sequence = 0;
  /// The granularities the model can be cut at, the default (kBlock) first: the transformers
  /// also have kHalfBlock, Inception v3 kBranch.
  std::vector<Granularity> granularities{Granularity::kBlock};
  /// Parameters (at 1000 classes) and stages (at block granularity), known without building
  /// the model, which `remat models` lists (building takes seconds for a VGG's 140 million
  /// weights, and 6 GB for gpt2-xl's); 0: count them on a built one. models_test.cpp and
  /// transformer_test.cpp build each model and compare.
  std::int64_t known_parameters = 0;
  int known_stages = 0;
  /// The parameters each class adds to known_parameters: the classifier's inputs and its bias
  /// (both of Inception v3's classifiers); 0 for the language models, which have no classes.
  std::int64_t parameters_per_class = 0;
  /// Makes the model for `config` (image size, granularity); empty: make(config.num_classes).
  std::function<torch::nn::Sequential(const ModelConfig& config)> make_for;

  /// The model for `config`, by make_for when there is one.
  torch::nn::Sequential build(const ModelConfig& config) const;
  /// Whether `granularity` is one of granularities.
  bool has_granularity(Granularity granularity) const;
  /// The parameters at `num_classes` classes from the known counts; 0 where they are not known.
  std::int64_t parameters_for(int num_classes) const;
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
