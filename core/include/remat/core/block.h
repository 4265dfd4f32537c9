#pragma once
// remat::Block: a sequence of modules that forms one stage of a chain. torch::nn::Sequential
// cannot be nested (its forward is a template, so AnyModule cannot hold it); Block can:
//
//   torch::nn::Sequential net(remat::Block(Conv2d(...), BatchNorm2d(64), ReLU()), ...);

#include <torch/nn/modules/container/sequential.h>

#include <utility>

namespace remat {

class BlockImpl : public torch::nn::SequentialImpl {
 public:
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return SequentialImpl::forward(std::move(x)); }
};
TORCH_MODULE(Block);

}  // namespace remat
