// torchvision.models.vgg (v0.14) as a chain: one stage per convolution.
#include "remat/models/vgg.h"

#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <string>
#include <vector>

#include "layers.h"

namespace remat::models {
namespace {

namespace nn = torch::nn;
constexpr int kPool = 0;  // "M" in torchvision's configurations

torch::nn::Sequential vgg(const std::vector<int>& config, bool batch_norm,
                          const VGGOptions& options) {
  TORCH_CHECK_VALUE(options.num_classes() >= 1, "vgg: num_classes must be >= 1");
  TORCH_CHECK_VALUE(options.dropout() >= 0 && options.dropout() <= 1,
                    "vgg: dropout must be in [0, 1]");
  TORCH_CHECK_VALUE(options.classifier_width() >= 1, "vgg: classifier_width must be >= 1");
  const int64_t width = options.classifier_width();
  auto chain = std::make_shared<detail::TorchvisionChainImpl>();
  int64_t in = 3;
  int index = 0;  // the layer's index in torchvision's `features`
  for (int channels : config) {
    const std::string name = "features_" + std::to_string(index);
    if (channels == kPool) {
      chain->add(name, nn::MaxPool2d(nn::MaxPool2dOptions(2).stride(2)), "features.");
      ++index;
      continue;
    }
    // Children named by their index in torchvision's `features`, so that the stage's
    // "3.weight" is "features.3.weight" there.
    Block stage;
    stage->push_back(std::to_string(index++), detail::conv2d(in, channels, 3, 1, 1, true));
    if (batch_norm) stage->push_back(std::to_string(index++), nn::BatchNorm2d(channels));
    stage->push_back(std::to_string(index++), detail::relu_inplace());
    chain->add(name, stage, "features.");
    in = channels;
  }
  Block pool;
  pool->push_back("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({7, 7})));
  pool->push_back("flatten", nn::Flatten());
  chain->add("avgpool", pool, "");
  const auto dropout = nn::DropoutOptions(options.dropout());
  Block fc1;
  fc1->push_back("0", nn::Linear(512 * 7 * 7, width));
  fc1->push_back("1", detail::relu_inplace());
  fc1->push_back("2", nn::Dropout(dropout));
  chain->add("classifier_0", fc1, "classifier.");
  Block fc2;
  fc2->push_back("3", nn::Linear(width, width));
  fc2->push_back("4", detail::relu_inplace());
  fc2->push_back("5", nn::Dropout(dropout));
  chain->add("classifier_3", fc2, "classifier.");
  Block fc3;
  fc3->push_back("6", nn::Linear(width, options.num_classes()));
  chain->add("classifier_6", fc3, "classifier.");

  detail::for_each<nn::Conv2dImpl>(*chain, [](nn::Conv2dImpl& conv) {
    detail::init_kaiming_fan_out(conv);
    nn::init::zeros_(conv.bias);
  });
  detail::for_each<nn::LinearImpl>(*chain, [](nn::LinearImpl& linear) {
    nn::init::normal_(linear.weight, 0, 0.01);
    nn::init::zeros_(linear.bias);
  });
  return detail::as_sequential(chain);
}

const std::vector<int> kA = {64, kPool, 128, kPool, 256, 256, kPool, 512, 512, kPool, 512, 512, kPool};
const std::vector<int> kB = {64, 64, kPool, 128, 128, kPool, 256, 256, kPool, 512, 512, kPool,
                             512, 512, kPool};
const std::vector<int> kD = {64,  64,  kPool, 128, 128, kPool, 256, 256, 256,  kPool,
                             512, 512, 512,   kPool, 512, 512, 512, kPool};
const std::vector<int> kE = {64,  64,  kPool, 128, 128, kPool, 256, 256, 256, 256, kPool,
                             512, 512, 512,   512, kPool, 512, 512, 512, 512, kPool};

}  // namespace

torch::nn::Sequential vgg11(const VGGOptions& o) { return vgg(kA, false, o); }
torch::nn::Sequential vgg11_bn(const VGGOptions& o) { return vgg(kA, true, o); }
torch::nn::Sequential vgg13(const VGGOptions& o) { return vgg(kB, false, o); }
torch::nn::Sequential vgg13_bn(const VGGOptions& o) { return vgg(kB, true, o); }
torch::nn::Sequential vgg16(const VGGOptions& o) { return vgg(kD, false, o); }
torch::nn::Sequential vgg16_bn(const VGGOptions& o) { return vgg(kD, true, o); }
torch::nn::Sequential vgg19(const VGGOptions& o) { return vgg(kE, false, o); }
torch::nn::Sequential vgg19_bn(const VGGOptions& o) { return vgg(kE, true, o); }

}  // namespace remat::models
