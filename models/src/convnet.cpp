#include "remat/models/convnet.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <algorithm>

#include "remat/core/block.h"

namespace remat::models {

namespace nn = torch::nn;

torch::nn::Sequential convnet(const ConvNetOptions& options) {
  TORCH_CHECK_VALUE(options.blocks() >= 1 && options.width() >= 1 && options.num_classes() >= 1 &&
                        options.pool_every() >= 1,
                    "convnet: blocks, width, pool_every and num_classes must be >= 1");
  nn::Sequential net;
  int in = 3, width = options.width();
  for (int b = 0; b < options.blocks(); ++b) {
    nn::Conv2d conv(nn::Conv2dOptions(in, width, 3).padding(1).bias(false));
    nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
    net->push_back("conv" + std::to_string(b),
                   Block(conv, nn::BatchNorm2d(width), nn::ReLU()));
    in = width;
    if ((b + 1) % options.pool_every() == 0 && b + 1 < options.blocks()) {
      net->push_back("pool" + std::to_string(b), nn::MaxPool2d(nn::MaxPool2dOptions(2)));
      width = std::min(2 * width, options.max_width());
    }
  }
  net->push_back("classifier",
                 Block(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({1, 1})), nn::Flatten(),
                       nn::Linear(in, options.num_classes())));
  return net;
}

}  // namespace remat::models
