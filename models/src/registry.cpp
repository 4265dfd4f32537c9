#include "remat/models/registry.h"

#include <algorithm>
#include <torch/nn/functional/loss.h>

#include "remat/models/convnet.h"
#include "remat/models/densenet.h"
#include "remat/models/inception.h"
#include "remat/models/resnet.h"
#include "remat/models/transformer.h"
#include "remat/models/vgg.h"

namespace remat::models {
namespace {

std::string gpt2_description(const std::string& name, const GPT2Options& o) {
  const char* size = name == "gpt2"          ? "(124M)"
                     : name == "gpt2-medium" ? "medium (355M)"
                     : name == "gpt2-large"  ? "large (774M)"
                                             : "XL (1.5B)";
  return std::string("Hugging Face GPT-2 ") + size + ": " + std::to_string(o.n_layer()) +
         " blocks of width " + std::to_string(o.n_embd()) + ", causal LM loss";
}

}  // namespace

torch::Tensor classification_loss(const Tensors& outputs, const torch::Tensor& target) {
  namespace F = torch::nn::functional;
  TORCH_CHECK_VALUE(outputs.size() == 1 || outputs.size() == 2,
                    "classification_loss: expected the logits and, for Inception v3 in training "
                    "mode, the auxiliary logits; got ",
                    outputs.size(), " tensors");
  torch::Tensor loss = F::cross_entropy(outputs[0], target);
  if (outputs.size() == 2) loss = loss + 0.4 * F::cross_entropy(outputs[1], target);
  return loss;
}

const std::vector<ModelInfo>& registry() {
  // min_image: the smallest square input each architecture takes (five stride-2 reductions
  // for ResNet, VGG and DenseNet; Inception's own limits, see inception.h).
  static const std::vector<ModelInfo> models = [] {
    // One model's name, description, smallest and default image, and builder.
    const auto info = [](std::string name, std::string description, int min_image,
                         int default_image, std::function<torch::nn::Sequential(int)> make) {
      ModelInfo model;
      model.name = std::move(name);
      model.description = std::move(description);
      model.min_image = min_image;
      model.default_image = default_image;
      model.make = std::move(make);
      return model;
    };
    std::vector<ModelInfo> all = {
        info("convnet", "small VGG-like network: 8 Conv3x3+BN+ReLU stages, 3 max pools, classifier",
             8, 64, [](int classes) { return convnet(ConvNetOptions().num_classes(classes)); }),
        info("convnet-deep", "deeper VGG-like network: 24 Conv3x3+BN+ReLU stages, 5 max pools", 32,
             64,
             [](int classes) {
               return convnet(ConvNetOptions().num_classes(classes).blocks(24).pool_every(4));
             }),
    };
    const auto add = [&](const char* name, const char* description, int min_image,
                         int default_image, std::function<torch::nn::Sequential(int)> make) {
      all.push_back(info(name, description, min_image, default_image, std::move(make)));
    };
    using R = ResNetOptions;
    add("resnet18", "torchvision ResNet-18", 32, 224, [](int c) { return resnet18(R().num_classes(c)); });
    add("resnet34", "torchvision ResNet-34", 32, 224, [](int c) { return resnet34(R().num_classes(c)); });
    add("resnet50", "torchvision ResNet-50", 32, 224, [](int c) { return resnet50(R().num_classes(c)); });
    add("resnet101", "torchvision ResNet-101", 32, 224, [](int c) { return resnet101(R().num_classes(c)); });
    add("resnet152", "torchvision ResNet-152", 32, 224, [](int c) { return resnet152(R().num_classes(c)); });
    using V = VGGOptions;
    add("vgg11", "torchvision VGG-11", 32, 224, [](int c) { return vgg11(V().num_classes(c)); });
    add("vgg11_bn", "torchvision VGG-11 with BatchNorm", 32, 224, [](int c) { return vgg11_bn(V().num_classes(c)); });
    add("vgg13", "torchvision VGG-13", 32, 224, [](int c) { return vgg13(V().num_classes(c)); });
    add("vgg13_bn", "torchvision VGG-13 with BatchNorm", 32, 224, [](int c) { return vgg13_bn(V().num_classes(c)); });
    add("vgg16", "torchvision VGG-16", 32, 224, [](int c) { return vgg16(V().num_classes(c)); });
    add("vgg16_bn", "torchvision VGG-16 with BatchNorm", 32, 224, [](int c) { return vgg16_bn(V().num_classes(c)); });
    add("vgg19", "torchvision VGG-19", 32, 224, [](int c) { return vgg19(V().num_classes(c)); });
    add("vgg19_bn", "torchvision VGG-19 with BatchNorm", 32, 224, [](int c) { return vgg19_bn(V().num_classes(c)); });
    for (const bool aux : {true, false}) {
      ModelInfo inception =
          aux ? info("inception_v3", "torchvision Inception v3 with its auxiliary classifier", 299,
                     299, [](int c) { return inception_v3(InceptionV3Options().num_classes(c)); })
              : info("inception_v3_noaux", "torchvision Inception v3, aux_logits=False", 75, 299,
                     [](int c) {
                       return inception_v3(InceptionV3Options().num_classes(c).aux_logits(false));
                     });
      inception.granularities = {Granularity::kBlock, Granularity::kBranch};
      inception.make_for = [aux](const ModelConfig& config) {
        return inception_v3(InceptionV3Options()
                                .num_classes(config.num_classes)
                                .aux_logits(aux)
                                .granularity(config.granularity));
      };
      all.push_back(std::move(inception));
    }
    using D = DenseNetOptions;
    add("densenet121", "torchvision DenseNet-121", 32, 224, [](int c) { return densenet121(D().num_classes(c)); });
    add("densenet161", "torchvision DenseNet-161", 32, 224, [](int c) { return densenet161(D().num_classes(c)); });
    add("densenet169", "torchvision DenseNet-169", 32, 224, [](int c) { return densenet169(D().num_classes(c)); });
    add("densenet201", "torchvision DenseNet-201", 32, 224, [](int c) { return densenet201(D().num_classes(c)); });
    // The convolutional networks' counts at 1000 classes (torchvision's, the convnets' remat's
    // own), what each class adds, and their stages: models_test.cpp builds each and compares.
    struct Known {
      const char* name;
      std::int64_t parameters, per_class;
      int stages;
    };
    static constexpr Known kKnown[] = {
        {"convnet", 1430216, 257, 12},          {"convnet-deep", 7721544, 257, 30},
        {"resnet18", 11689512, 513, 11},        {"resnet34", 21797672, 513, 19},
        {"resnet50", 25557032, 2049, 19},       {"resnet101", 44549160, 2049, 36},
        {"resnet152", 60192808, 2049, 53},      {"vgg11", 132863336, 4097, 17},
        {"vgg11_bn", 132868840, 4097, 17},      {"vgg13", 133047848, 4097, 19},
        {"vgg13_bn", 133053736, 4097, 19},      {"vgg16", 138357544, 4097, 22},
        {"vgg16_bn", 138365992, 4097, 22},      {"vgg19", 143667240, 4097, 25},
        {"vgg19_bn", 143678248, 4097, 25},      {"inception_v3", 27161264, 2049 + 769, 20},
        {"inception_v3_noaux", 23834568, 2049, 19}, {"densenet121", 7978856, 1025, 63},
        {"densenet161", 28681000, 2209, 83},    {"densenet169", 14149480, 1665, 87},
        {"densenet201", 20013928, 1921, 103}};
    for (ModelInfo& model : all) {
      for (const Known& known : kKnown) {
        if (model.name != known.name) continue;
        model.known_parameters = known.parameters;
        model.parameters_per_class = known.per_class;
        model.known_stages = known.stages;
      }
    }
    // Transformers: their image size or granularity changes the model (make_for).
    const auto add_vit = [&](const char* name, const char* description, int patch, int layers,
                             std::int64_t parameters, std::int64_t per_class,
                             torch::nn::Sequential (*make)(ViTOptions)) {
      ModelInfo vit = info(name, description, patch, 224,
                           [make](int c) { return make(ViTOptions().num_classes(c)); });
      vit.image_multiple = patch;
      vit.known_parameters = parameters;  // torchvision's (transformer_test.cpp builds them)
      vit.parameters_per_class = per_class;  // the head: width + 1
      vit.known_stages = layers + 2;
      vit.granularities = {Granularity::kBlock, Granularity::kHalfBlock};
      vit.make_for = [make](const ModelConfig& config) {
        return make(ViTOptions()
                        .num_classes(config.num_classes)
                        .image_size(config.image > 0 ? config.image : 224)
                        .granularity(config.granularity));
      };
      all.push_back(std::move(vit));
    };
    add_vit("vit_b_16", "torchvision ViT-B/16 (vision transformer)", 16, 12, 86567656, 769, vit_b_16);
    add_vit("vit_b_32", "torchvision ViT-B/32", 32, 12, 88224232, 769, vit_b_32);
    add_vit("vit_l_16", "torchvision ViT-L/16", 16, 24, 304326632, 1025, vit_l_16);
    for (const char* name : {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}) {
      const GPT2Options options = gpt2_config(name);
      ModelInfo lm = info(name, gpt2_description(name, options), 1, 0,
                          [name](int) { return gpt2(gpt2_config(name)); });
      lm.input = InputKind::kTokens;
      lm.vocab_size = static_cast<int>(options.vocab_size());
      lm.max_sequence = lm.default_sequence = static_cast<int>(options.n_positions());
      lm.granularities = {Granularity::kBlock, Granularity::kHalfBlock};
      lm.known_parameters = gpt2_parameter_count(options);
      lm.known_stages = static_cast<int>(options.n_layer()) + 2;
      lm.make_for = [name](const ModelConfig& config) {
        return gpt2(gpt2_config(name, GPT2Options().granularity(config.granularity)));
      };
      all.push_back(std::move(lm));
    }
    return all;
  }();
  return models;
}

torch::nn::Sequential ModelInfo::build(const ModelConfig& config) const {
  TORCH_CHECK_VALUE(has_granularity(config.granularity), name, " has no ",
                    granularity_name(config.granularity), " granularity");
  return make_for ? make_for(config) : make(config.num_classes);
}

std::int64_t ModelInfo::parameters_for(int num_classes) const {
  if (known_parameters == 0) return 0;
  return known_parameters + parameters_per_class * (static_cast<std::int64_t>(num_classes) - 1000);
}

bool ModelInfo::has_granularity(Granularity granularity) const {
  return std::find(granularities.begin(), granularities.end(), granularity) != granularities.end();
}

std::int64_t parameter_count(const torch::nn::Module& module) {
  std::int64_t count = 0;
  for (const auto& p : module.parameters()) count += p.numel();
  return count;
}

const ModelInfo& find_model(const std::string& name) {
  std::string known;
  for (const ModelInfo& info : registry()) {
    if (info.name == name) return info;
    known += (known.empty() ? "" : ", ") + info.name;
  }
  TORCH_CHECK_VALUE(false, "unknown model '", name, "' (known: ", known, ")");
}

}  // namespace remat::models
