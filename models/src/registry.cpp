#include "remat/models/registry.h"

#include <stdexcept>

#include "remat/models/convnet.h"

namespace remat::models {

const std::vector<ModelInfo>& registry() {
  static const std::vector<ModelInfo> models = {
      {"convnet", "small VGG-like network: 8 Conv3x3+BN+ReLU stages, 3 max pools, classifier", 8,
       64, [](int classes) { return convnet(ConvNetOptions().num_classes(classes)); }},
      {"convnet-deep", "deeper VGG-like network: 24 Conv3x3+BN+ReLU stages, 5 max pools", 32, 64,
       [](int classes) {
         return convnet(ConvNetOptions().num_classes(classes).blocks(24).pool_every(4));
       }},
  };
  return models;
}

const ModelInfo& find_model(const std::string& name) {
  std::string known;
  for (const ModelInfo& info : registry()) {
    if (info.name == name) return info;
    known += (known.empty() ? "" : ", ") + info.name;
  }
  throw std::invalid_argument("unknown model '" + name + "' (known: " + known + ")");
}

}  // namespace remat::models
