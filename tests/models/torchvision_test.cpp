// The ports against torchvision itself: Debian's python3-torchvision saves a randomly
// initialized model's state dict as torchvision publishes weights, an input and the outputs
// (tests/models/make_torchvision_reference.py, run before these tests); the port loads the
// file with load_torchvision_weights and must reproduce the outputs.
#include <catch2/catch.hpp>
#include <map>

#include "models/model_checks.h"
#include "remat/models.h"

namespace nn = torch::nn;
using namespace remat::models;
using remat::test::relative_error;

namespace {

std::string reference(const std::string& file) {
  return std::string(REMAT_TORCHVISION_REFERENCE_DIR) + "/" + file;
}

std::map<std::string, torch::Tensor> read_io(const std::string& name) {
  return remat::test::read_tensors(reference(name + "_io.pth"));
}

}  // namespace

TEST_CASE("the ports reproduce torchvision's eval-mode outputs with its weights",
          "[models][torchvision]") {
  const std::vector<std::pair<std::string, std::function<nn::Sequential()>>> cases = {
      {"resnet18", [] { return resnet18(); }},
      {"resnet50", [] { return resnet50(); }},
      {"vgg11_bn", [] { return vgg11_bn(); }},
      {"densenet121", [] { return densenet121(); }},
      {"inception_v3", [] { return inception_v3(); }},
      {"inception_v3_transform",
       [] { return inception_v3(InceptionV3Options().aux_logits(false).transform_input(true)); }},
  };
  for (const auto& [name, make] : cases) {
    DYNAMIC_SECTION(name) {
      nn::Sequential net = make();
      load_torchvision_weights(net, reference(name + ".pth"));
      auto io = read_io(name);
      net->eval();
      torch::NoGradGuard no_grad;
      // Inception's Sequential returns a list ({logits} in eval mode): run it as its stages.
      const remat::Tensors out = remat::run_stages(remat::stages_of(net), {io.at("input")});
      REQUIRE(out.size() == 1);
      const double error = relative_error(out[0], io.at("output"));
      INFO("relative error " << error);
      CHECK(error < 1e-4);
    }
  }
}

TEST_CASE("resnet18 trains like torchvision's: output, input gradient, statistics",
          "[models][torchvision]") {
  nn::Sequential net = resnet18();
  load_torchvision_weights(net, reference("resnet18.pth"));
  auto io = read_io("resnet18");
  net->train();
  torch::Tensor x = io.at("input").clone().requires_grad_(true);
  torch::Tensor out = net->forward(x);
  (out * io.at("loss_weight")).sum().backward();
  CHECK(relative_error(out.detach(), io.at("train_output")) < 1e-4);
  CHECK(relative_error(x.grad(), io.at("train_input_grad")) < 1e-4);
  CHECK(relative_error(net->named_parameters()["fc.fc.weight"].grad(),
                       io.at("train_fc_weight_grad")) < 1e-4);
  CHECK(relative_error(net->named_buffers()["conv1.bn1.running_mean"],
                       io.at("train_bn1_running_mean")) < 1e-4);
}

TEST_CASE("Inception v3's two heads in training mode match torchvision's InceptionOutputs",
          "[models][torchvision]") {
  nn::Sequential net = inception_v3(InceptionV3Options().dropout(0));
  load_torchvision_weights(net, reference("inception_v3.pth"));
  auto io = read_io("inception_v3");
  net->train();
  torch::NoGradGuard no_grad;
  const auto outputs = net->forward<std::vector<torch::Tensor>>(io.at("train_input"));
  REQUIRE(outputs.size() == 2);
  CHECK(relative_error(outputs[0], io.at("train_logits")) < 1e-4);
  CHECK(relative_error(outputs[1], io.at("train_aux_logits")) < 1e-4);
}

TEST_CASE("the vision transformer reproduces torchvision's, outputs and gradients",
          "[models][torchvision][vit]") {
  // A small VisionTransformer whose every parameter torchvision's side randomized.
  auto io = read_io("vit_small");
  for (Granularity granularity : {Granularity::kBlock, Granularity::kHalfBlock}) {
    DYNAMIC_SECTION(granularity_name(granularity)) {
      nn::Sequential net = vision_transformer(ViTOptions()
                                                  .image_size(32)
                                                  .patch_size(8)
                                                  .num_layers(2)
                                                  .num_heads(4)
                                                  .hidden_dim(64)
                                                  .mlp_dim(128)
                                                  .num_classes(10)
                                                  .granularity(granularity));
      load_torchvision_weights(net, reference("vit_small.pth"));
      net->eval();
      {
        torch::NoGradGuard no_grad;
        const double error = relative_error(net->forward(io.at("input")), io.at("output"));
        INFO("relative error " << error);
        CHECK(error < 1e-5);
      }
      net->train();
      torch::Tensor x = io.at("input").clone().requires_grad_(true);
      torch::Tensor out = net->forward(x);
      (out * io.at("loss_weight")).sum().backward();
      CHECK(relative_error(out.detach(), io.at("train_output")) < 1e-5);
      CHECK(relative_error(x.grad(), io.at("train_input_grad")) < 1e-5);
      CHECK(relative_error(net->named_parameters()["embed.conv_proj.weight"].grad(),
                           io.at("train_conv_proj_weight_grad")) < 1e-5);
      CHECK(relative_error(net->named_parameters()["embed.pos_embedding"].grad(),
                           io.at("train_pos_embedding_grad")) < 1e-5);
    }
  }
}

TEST_CASE("vit_b_16, vit_b_32 and vit_l_16 have torchvision's names and shapes; old MLP names load",
          "[models][torchvision][vit]") {
  const auto expected = remat::test::read_shape_listing(reference("vit_names.txt"));
  REQUIRE(expected.size() == 3);
  for (const auto& [model, names] : expected) {
    DYNAMIC_SECTION(model) {
      const nn::Sequential net = model == "vit_b_16"   ? vit_b_16()
                                 : model == "vit_b_32" ? vit_b_32()
                                                       : vit_l_16();
      CHECK(remat::test::reference_shapes(net) == names);
    }
  }
  // The published ViT files name the MLP's layers "linear_1" and "linear_2", which
  // torchvision's loader renames to "0" and "3".
  nn::Sequential net = vision_transformer(ViTOptions()
                                              .image_size(32)
                                              .patch_size(8)
                                              .num_layers(2)
                                              .num_heads(4)
                                              .hidden_dim(64)
                                              .mlp_dim(128)
                                              .num_classes(10));
  std::vector<StateDictEntry> entries = read_state_dict(reference("vit_small.pth"));
  for (auto& entry : entries) {
    const auto at = entry.name.find(".mlp.");
    if (at == std::string::npos) continue;
    if (entry.name.compare(at + 5, 2, "0.") == 0)
      entry.name.replace(at + 5, 1, "linear_1");
    else if (entry.name.compare(at + 5, 2, "3.") == 0)
      entry.name.replace(at + 5, 1, "linear_2");
  }
  load_torchvision_weights(net, entries, "old names");
  auto io = read_io("vit_small");
  net->eval();
  torch::NoGradGuard no_grad;
  CHECK(relative_error(net->forward(io.at("input")), io.at("output")) < 1e-5);
}
