#pragma once
// Networks with one layer per stage: a CNN (Conv, BatchNorm, ReLU, Dropout, pooling) and a
// transformer block (Linear, LayerNorm, self-attention, Dropout, GELU). The runtime's tests
// check that store-all through a Checkpointable measures exactly plain autograd's peak on them
// (tests/runtime/per_layer_test.cpp); the cost-model bench compares model v1 and v2 on them.
#include <torch/torch.h>

#include <cmath>

namespace remat::bench {

namespace nn = torch::nn;

// Self-attention over (batch, sequence, features), one tensor in and out: what a transformer
// block's attention layer is to the chain.
struct SelfAttentionImpl : nn::Module {
  SelfAttentionImpl(int features, int heads)
      : heads_(heads),
        qkv_(register_module("qkv", nn::Linear(features, 3 * features))),
        out_(register_module("out", nn::Linear(features, features))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const auto b = x.size(0), n = x.size(1), f = x.size(2);
    const auto parts = qkv_(x).view({b, n, 3, heads_, f / heads_}).permute({2, 0, 3, 1, 4});
    const torch::Tensor q = parts[0], k = parts[1], v = parts[2];
    const torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(f / heads_);
    const torch::Tensor mixed = torch::matmul(torch::softmax(scores, -1), v);
    return out_(mixed.transpose(1, 2).reshape({b, n, f}));
  }
  int heads_;
  nn::Linear qkv_, out_;
};
TORCH_MODULE(SelfAttention);

// Every layer a stage. `repeats` groups of layers at each resolution (1: 14 stages).
inline nn::Sequential per_layer_cnn(int width = 8, int repeats = 1) {
  nn::Sequential net;
  for (int r = 0; r < repeats; ++r) {
    net->push_back(nn::Conv2d(nn::Conv2dOptions(r == 0 ? 3 : width, width, 3).padding(1).bias(false)));
    net->push_back(nn::BatchNorm2d(width));
    net->push_back(nn::ReLU());
    net->push_back(nn::Conv2d(nn::Conv2dOptions(width, width, 3).padding(1).bias(false)));
    net->push_back(nn::BatchNorm2d(width));
    net->push_back(nn::ReLU());
    net->push_back(nn::Dropout(0.2));
  }
  net->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(2)));
  for (int r = 0; r < repeats; ++r) {
    net->push_back(nn::Conv2d(nn::Conv2dOptions(r == 0 ? width : 2 * width, 2 * width, 3).padding(1).bias(false)));
    net->push_back(nn::BatchNorm2d(2 * width));
    net->push_back(nn::ReLU());
  }
  net->push_back(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({2, 2})));
  net->push_back(nn::Flatten());
  net->push_back(nn::Linear(8 * width, 10));
  return net;
}

// `blocks` transformer blocks, every layer a stage, then a linear head (1 block: 11 stages).
inline nn::Sequential per_layer_transformer(int features, int blocks = 1) {
  nn::Sequential net;
  for (int b = 0; b < blocks; ++b) {
    net->push_back(nn::Linear(features, features));
    net->push_back(nn::LayerNorm(nn::LayerNormOptions({features})));
    net->push_back(SelfAttention(features, 4));
    net->push_back(nn::Dropout(0.1));
    net->push_back(nn::LayerNorm(nn::LayerNormOptions({features})));
    net->push_back(nn::Linear(features, 4 * features));
    net->push_back(nn::GELU());
    net->push_back(nn::Linear(4 * features, features));
    net->push_back(nn::Dropout(0.1));
    net->push_back(nn::LayerNorm(nn::LayerNormOptions({features})));
  }
  net->push_back(nn::Linear(features, 10));
  return net;
}

}  // namespace remat::bench
