// torchvision.models.densenet (v0.14) as a chain: one stage per dense layer. torchvision's
// dense layer takes the list of all previous features and concatenates them first; here each
// stage returns cat(input, new features), which is the same computation expressed as a chain
// (the concatenation moves from the start of the next layer to the end of this one).
#include "remat/models/densenet.h"

#include <torch/nn/functional/dropout.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/pooling.h>

#include <string>

#include "layers.h"

namespace remat::models {
namespace {

namespace nn = torch::nn;
using detail::conv2d;

class DenseLayerImpl : public nn::Module {
 public:
  DenseLayerImpl(int64_t in, int64_t growth_rate, int64_t bn_size, double drop_rate)
      : drop_rate_(drop_rate) {
    norm1_ = register_module("norm1", nn::BatchNorm2d(in));
    conv1_ = register_module("conv1", conv2d(in, bn_size * growth_rate, 1, 1, 0));
    norm2_ = register_module("norm2", nn::BatchNorm2d(bn_size * growth_rate));
    conv2_ = register_module("conv2", conv2d(bn_size * growth_rate, growth_rate, 3, 1, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor bottleneck = conv1_(norm1_(x).relu_());
    torch::Tensor features = conv2_(norm2_(bottleneck).relu_());
    if (drop_rate_ > 0)
      features = nn::functional::dropout(
          features, nn::functional::DropoutFuncOptions().p(drop_rate_).training(is_training()));
    return torch::cat({x, features}, 1);
  }

 private:
  double drop_rate_;
  nn::BatchNorm2d norm1_{nullptr}, norm2_{nullptr};
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
};
TORCH_MODULE(DenseLayer);

/// features.norm5, then (in torchvision's forward) ReLU, pooling, flatten, classifier.
class DenseHeadImpl : public nn::Module {
 public:
  DenseHeadImpl(int64_t features, int64_t num_classes) {
    norm5_ = register_module("norm5", nn::BatchNorm2d(features));
    classifier_ = register_module("classifier", nn::Linear(features, num_classes));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor out = norm5_(x).relu_();
    return classifier_(torch::adaptive_avg_pool2d(out, {1, 1}).flatten(1));
  }

 private:
  nn::BatchNorm2d norm5_{nullptr};
  nn::Linear classifier_{nullptr};
};
TORCH_MODULE(DenseHead);

}  // namespace

torch::nn::Sequential densenet(const DenseNetOptions& options) {
  TORCH_CHECK_VALUE(options.num_classes() >= 1 && options.growth_rate() >= 1 &&
                        options.bn_size() >= 1 && options.num_init_features() >= 1 &&
                        !options.block_config().empty(),
                    "densenet: num_classes, growth_rate, bn_size, num_init_features must be >= 1 "
                    "and block_config non-empty");
  TORCH_CHECK_VALUE(options.drop_rate() >= 0 && options.drop_rate() <= 1,
                    "densenet: drop_rate must be in [0, 1]");
  auto chain = std::make_shared<detail::TorchvisionChainImpl>();

  Block stem;
  stem->push_back("conv0", conv2d(3, options.num_init_features(), 7, 2, 3));
  stem->push_back("norm0", nn::BatchNorm2d(options.num_init_features()));
  stem->push_back("relu0", detail::relu_inplace());
  stem->push_back("pool0", nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
  chain->add("conv0", stem, "features.");

  int64_t features = options.num_init_features();
  const auto& blocks = options.block_config();
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    TORCH_CHECK_VALUE(blocks[b] >= 1, "densenet: every block needs >= 1 layer");
    const std::string block = std::to_string(b + 1);
    for (int64_t l = 0; l < blocks[b]; ++l) {
      const std::string layer = std::to_string(l + 1);
      chain->add("block" + block + "_layer" + layer,
                 DenseLayer(features, options.growth_rate(), options.bn_size(),
                            options.drop_rate()),
                 "features.denseblock" + block + ".denselayer" + layer + ".");
      features += options.growth_rate();
    }
    if (b + 1 < blocks.size()) {
      Block transition;
      transition->push_back("norm", nn::BatchNorm2d(features));
      transition->push_back("relu", detail::relu_inplace());
      transition->push_back("conv", conv2d(features, features / 2, 1));
      transition->push_back("pool", nn::AvgPool2d(nn::AvgPool2dOptions(2).stride(2)));
      chain->add("transition" + block, transition, "features.transition" + block + ".");
      features /= 2;
    }
  }
  chain->add("classifier", DenseHead(features, options.num_classes()), "");
  chain->rename("classifier.norm5.", "features.norm5.");

  // torchvision: kaiming_normal_ (fan_in, gain sqrt(2)) for convolutions, BN at 1 and 0,
  // classifier bias 0 (its weight keeps the default initialization).
  detail::for_each<nn::Conv2dImpl>(*chain, [](nn::Conv2dImpl& conv) {
    nn::init::kaiming_normal_(conv.weight);
  });
  detail::for_each<nn::LinearImpl>(*chain,
                                   [](nn::LinearImpl& linear) { nn::init::zeros_(linear.bias); });
  return detail::as_sequential(chain);
}

namespace {
DenseNetOptions variant(DenseNetOptions options, int64_t growth, std::vector<int64_t> blocks,
                        int64_t init_features) {
  return options.growth_rate(growth).block_config(std::move(blocks)).num_init_features(
      init_features);
}
}  // namespace

torch::nn::Sequential densenet121(const DenseNetOptions& o) {
  return densenet(variant(o, 32, {6, 12, 24, 16}, 64));
}
torch::nn::Sequential densenet161(const DenseNetOptions& o) {
  return densenet(variant(o, 48, {6, 12, 36, 24}, 96));
}
torch::nn::Sequential densenet169(const DenseNetOptions& o) {
  return densenet(variant(o, 32, {6, 12, 32, 32}, 64));
}
torch::nn::Sequential densenet201(const DenseNetOptions& o) {
  return densenet(variant(o, 32, {6, 12, 48, 32}, 64));
}

}  // namespace remat::models
