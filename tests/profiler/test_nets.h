#pragma once
// Small chains for the LibTorch tests: the layer kinds of the ported models (Conv, BatchNorm,
// ReLU, pooling, Linear, Dropout), a batch of a few samples.
#include <torch/torch.h>

#include "remat/profiler/block.h"

namespace remat::test {

namespace nn = torch::nn;

// Conv+BN+ReLU stages, a pooling stage, a classifier stage with flatten.
inline nn::Sequential conv_chain(int channels = 8, int classes = 10, bool dropout = false) {
  nn::Sequential net;
  net->push_back(remat::Block(nn::Conv2d(nn::Conv2dOptions(3, channels, 3).padding(1).bias(false)),
                                nn::BatchNorm2d(channels), nn::ReLU()));
  net->push_back(remat::Block(
      nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false)),
      nn::BatchNorm2d(channels), nn::ReLU()));
  net->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(2)));
  net->push_back(remat::Block(
      nn::Conv2d(nn::Conv2dOptions(channels, 2 * channels, 3).padding(1).bias(false)),
      nn::BatchNorm2d(2 * channels), nn::ReLU()));
  if (dropout) net->push_back(nn::Dropout(0.3));
  net->push_back(remat::Block(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({2, 2})),
                                nn::Flatten(), nn::Linear(8 * channels, classes)));
  return net;
}

// Every parameter and buffer, flattened into one list (for before/after comparisons).
inline std::vector<torch::Tensor> state_of(const nn::Module& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net.parameters()) out.push_back(p.detach().clone());
  for (const auto& b : net.buffers()) out.push_back(b.clone());
  return out;
}

inline bool same_tensors(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!a[i].sizes().equals(b[i].sizes()) || !torch::equal(a[i], b[i])) return false;
  return true;
}

}  // namespace remat::test
