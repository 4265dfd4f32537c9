// torchvision.models.resnet (v0.14) as a chain: one stage per residual block.
#include "remat/models/resnet.h"

#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <string>
#include <vector>

#include "layers.h"

namespace remat::models {
namespace {

namespace nn = torch::nn;
using detail::conv2d;

/// BasicBlock (expansion 1) or Bottleneck (expansion 4), with torchvision's member names.
class ResidualBlockImpl : public nn::Module {
 public:
  ResidualBlockImpl(bool bottleneck, int64_t inplanes, int64_t planes, int64_t stride)
      : bottleneck_(bottleneck) {
    const int64_t expansion = bottleneck ? 4 : 1;
    if (bottleneck) {
      // torchvision's V1.5: the stride sits on the 3x3 convolution.
      conv1_ = register_module("conv1", conv2d(inplanes, planes, 1));
      bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
      conv2_ = register_module("conv2", conv2d(planes, planes, 3, stride, 1));
      bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
      conv3_ = register_module("conv3", conv2d(planes, planes * expansion, 1));
      bn3_ = register_module("bn3", nn::BatchNorm2d(planes * expansion));
    } else {
      conv1_ = register_module("conv1", conv2d(inplanes, planes, 3, stride, 1));
      bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
      conv2_ = register_module("conv2", conv2d(planes, planes, 3, 1, 1));
      bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
    }
    if (stride != 1 || inplanes != planes * expansion) {
      downsample_conv_ = conv2d(inplanes, planes * expansion, 1, stride);
      downsample_bn_ = nn::BatchNorm2d(planes * expansion);
      // torchvision's downsample is nn.Sequential(conv1x1, BatchNorm2d): "downsample.0/1".
      register_module("downsample", Block(downsample_conv_, downsample_bn_));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor out = bn1_(conv1_(x)).relu_();
    if (bottleneck_) {
      out = bn2_(conv2_(out)).relu_();
      out = bn3_(conv3_(out));
    } else {
      out = bn2_(conv2_(out));
    }
    out += downsample_conv_ ? downsample_bn_(downsample_conv_(x)) : x;
    return out.relu_();
  }

  /// The BatchNorm that zero_init_residual zeroes.
  nn::BatchNorm2d last_bn() const { return bottleneck_ ? bn3_ : bn2_; }

 private:
  bool bottleneck_;
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr}, downsample_conv_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr}, downsample_bn_{nullptr};
};
TORCH_MODULE(ResidualBlock);

torch::nn::Sequential resnet(bool bottleneck, const std::vector<int>& layers,
                             const ResNetOptions& options) {
  TORCH_CHECK_VALUE(options.num_classes() >= 1, "resnet: num_classes must be >= 1");
  auto chain = std::make_shared<detail::TorchvisionChainImpl>();
  const int64_t expansion = bottleneck ? 4 : 1;

  Block stem;  // torchvision's top-level conv1, bn1, relu
  stem->push_back("conv1", conv2d(3, 64, 7, 2, 3));
  stem->push_back("bn1", nn::BatchNorm2d(64));
  stem->push_back("relu", detail::relu_inplace());
  chain->add("conv1", stem, "");
  chain->add("maxpool", nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)), "maxpool.");

  std::vector<ResidualBlock> blocks;
  int64_t inplanes = 64;
  for (std::size_t layer = 0; layer < layers.size(); ++layer) {
    const int64_t planes = int64_t{64} << layer;
    for (int b = 0; b < layers[layer]; ++b) {
      const int64_t stride = (layer > 0 && b == 0) ? 2 : 1;
      blocks.emplace_back(bottleneck, inplanes, planes, stride);
      inplanes = planes * expansion;
      const std::string layer_name = "layer" + std::to_string(layer + 1);
      chain->add(layer_name + "_" + std::to_string(b), blocks.back(),
                 layer_name + "." + std::to_string(b) + ".");
    }
  }

  Block head;  // avgpool, flatten, fc
  head->push_back("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({1, 1})));
  head->push_back("flatten", nn::Flatten());
  head->push_back("fc", nn::Linear(512 * expansion, options.num_classes()));
  chain->add("fc", head, "");

  // torchvision's initialization; Linear keeps PyTorch's default (as LibTorch's).
  detail::for_each<nn::Conv2dImpl>(*chain, detail::init_kaiming_fan_out);
  if (options.zero_init_residual())
    for (auto& block : blocks) torch::nn::init::zeros_(block->last_bn()->weight);
  return detail::as_sequential(chain);
}

}  // namespace

torch::nn::Sequential resnet18(const ResNetOptions& o) { return resnet(false, {2, 2, 2, 2}, o); }
torch::nn::Sequential resnet34(const ResNetOptions& o) { return resnet(false, {3, 4, 6, 3}, o); }
torch::nn::Sequential resnet50(const ResNetOptions& o) { return resnet(true, {3, 4, 6, 3}, o); }
torch::nn::Sequential resnet101(const ResNetOptions& o) { return resnet(true, {3, 4, 23, 3}, o); }
torch::nn::Sequential resnet152(const ResNetOptions& o) { return resnet(true, {3, 8, 36, 3}, o); }

}  // namespace remat::models
