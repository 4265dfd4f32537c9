#pragma once
// Internals shared by the torchvision ports: the chain type that remembers torchvision's
// parameter names, and small building blocks. Not installed.

#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "remat/core/block.h"

namespace remat::models::detail {

/// A chain built by one of the ports: a Sequential of stages that also knows how the name of
/// each parameter and buffer maps onto torchvision's state dict, so that published weights
/// load into it. Stage names cannot contain dots, so "layer1_0.conv1.weight" here is
/// "layer1.0.conv1.weight" there; the rules are prefix replacements, longest match first.
class TorchvisionChainImpl : public torch::nn::SequentialImpl {
 public:
  /// Appends `stage` as `name`; its parameters are torchvision's `torchvision_prefix` + their
  /// name inside the stage.
  template <typename ModuleType>
  void add(const std::string& name, ModuleType stage, const std::string& torchvision_prefix) {
    push_back(std::string(name), std::move(stage));
    renames_.emplace_back(name + ".", torchvision_prefix);
  }
  /// An extra rule for part of a stage (a stage whose parts live in different places).
  void rename(const std::string& chain_prefix, const std::string& torchvision_prefix) {
    renames_.emplace_back(chain_prefix, torchvision_prefix);
  }
  /// torchvision's name for this chain's parameter or buffer `key`.
  std::string torchvision_name(const std::string& key) const;

 private:
  std::vector<std::pair<std::string, std::string>> renames_;
};

/// Wraps a chain as what the builders return.
inline torch::nn::Sequential as_sequential(std::shared_ptr<TorchvisionChainImpl> chain) {
  return torch::nn::Sequential(std::shared_ptr<torch::nn::SequentialImpl>(std::move(chain)));
}

inline torch::nn::Conv2d conv2d(int64_t in, int64_t out, torch::ExpandingArray<2> kernel,
                                torch::ExpandingArray<2> stride = 1,
                                torch::ExpandingArray<2> padding = 0, bool bias = false) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(bias));
}

inline torch::nn::ReLU relu_inplace() { return torch::nn::ReLU(torch::nn::ReLUOptions(true)); }

/// Calls `f(impl)` on every submodule of `root` of type `Impl` (torchvision's
/// `for m in self.modules(): if isinstance(m, ...)` initialization loops).
template <typename Impl, typename F>
void for_each(torch::nn::Module& root, F f) {
  for (const auto& module : root.modules(/*include_self=*/false))
    if (auto impl = std::dynamic_pointer_cast<Impl>(module)) f(*impl);
}

/// torchvision's initialization of convolutions in ResNet and VGG:
/// kaiming_normal_(mode="fan_out", nonlinearity="relu").
inline void init_kaiming_fan_out(torch::nn::Conv2dImpl& conv) {
  torch::nn::init::kaiming_normal_(conv.weight, 0.0, torch::kFanOut, torch::kReLU);
}

/// torch.nn.init.trunc_normal_ (not in LibTorch 1.13's C++ API), the same method: uniform
/// between the CDF values of the bounds, through the inverse error function.
void trunc_normal_(torch::Tensor weight, double mean, double std, double a, double b);

/// Multi-head attention's core on (batch, heads, sequence, head size) tensors: softmax(q k^T /
/// sqrt(head size)) v, with the causal mask when `causal`, and dropout `dropout` on the
/// attention weights. PyTorch's scaled_dot_product_attention on LibTorch 2.x (what
/// nn.MultiheadAttention and Hugging Face's GPT-2 call there; it need not keep the weights for
/// the backward), the same formula spelled out on 1.13.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        bool causal, double dropout);

}  // namespace remat::models::detail
